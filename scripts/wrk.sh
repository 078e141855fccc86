#!/usr/bin/env bash
# wrk, the HTTP load generator `make bench` drives the APIs with (Debian's `wrk` package): written
# in C with LuaJIT, it spends a fraction of the CPU a Python client would on this 2-core machine.
set -eu
if command -v wrk >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "wrk is missing; install it with: sudo apt-get install -y --no-install-recommends wrk" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends wrk >/dev/null
