#!/usr/bin/env bash
# Headless Chromium for the browser tests (preference page, ops dashboard), from Debian's packages.
# Playwright drives it via executable_path; Playwright's own browser download is never used.
set -eu
if [ -x /usr/bin/chromium ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "Chromium is missing; install it with: sudo apt-get install -y chromium" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq chromium >/dev/null
