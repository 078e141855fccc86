#!/usr/bin/env bash
# Prometheus and promtool for the alert-rule tests (tests/deploy), from Debian's `prometheus` package.
# The tests run their own server in a temp dir; the package's daemon is kept from starting
# (policy-rc.d refuses every service start during the install) and stopped if it runs anyway.
set -eu
if [ -x /usr/bin/promtool ] && [ -x /usr/bin/prometheus ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "Prometheus is missing; install it with: sudo apt-get install -y --no-install-recommends prometheus" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod +x "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
