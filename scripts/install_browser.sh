#!/usr/bin/env bash
# The headless browser the dashboard test drives: Debian's chromium and its chromedriver (a browser
# build that a tool downloads by itself cannot be fetched here). Nothing to do when both are there.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null; then
    echo "install_browser.sh: chromium and chromium-driver are missing and this user cannot install them" >&2
    echo "  (apt-get install chromium chromium-driver as root); the dashboard test is skipped without them" >&2
    exit 0
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -q chromium chromium-driver >/dev/null \
    || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q chromium chromium-driver >/dev/null; }
