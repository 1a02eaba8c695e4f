#!/usr/bin/env bash
# Installs the browser tests/test_play.py drives (headless Chromium from the
# distribution, over the DevTools protocol): nothing to do when `chromium` is
# on PATH, else Debian's package (run as root; nothing else is downloaded).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium
command -v chromium >/dev/null
