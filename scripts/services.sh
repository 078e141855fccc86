#!/usr/bin/env bash
# Make sure the local PostgreSQL and Redis that Clarion's tests and `clarion dev` use are up.
set -u
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  echo "starting PostgreSQL" >&2
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
fi
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  # tests/workers/test_ratelimit_cluster.py starts its own three-node Redis Cluster with these
  echo "installing Redis (redis-server, redis-cli)" >&2
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server; } >/dev/null || true
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "starting Redis" >&2
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
fi
for _ in $(seq 1 50); do
  pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null && redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 && exit 0
  sleep 0.2
done
echo "PostgreSQL (127.0.0.1:5432) or Redis (127.0.0.1:6379) is not reachable" >&2
exit 1
