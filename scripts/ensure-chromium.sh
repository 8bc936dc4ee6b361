#!/usr/bin/env bash
# Make a headless-capable Chromium present for the chat page's browser test (tests/ui/): Debian's `chromium`
# package, driven over the DevTools protocol, so no browser download from outside the package mirrors. Uses the one
# installed; installs it with apt-get otherwise (root only, as on CI machines). Prints what it did; idempotent.
set -euo pipefail

found() { command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; }

if found; then echo "[chromium] already installed: $(command -v chromium || command -v chromium-browser)"; exit 0; fi

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "[chromium] not installed: install it (Debian/Ubuntu: apt-get install chromium), or the browser test is" \
    "skipped" >&2
  exit 1
fi
echo "[chromium] installing with apt-get"
export DEBIAN_FRONTEND=noninteractive
# The package lists may be stale on a fresh machine: refreshed only when the first try fails. Without
# recommends (no desktop services); with one font, or a bare machine renders the page's text as boxes.
packages=(chromium fonts-dejavu-core)
apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null 2>&1 \
  || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null; }
found || { echo "[chromium] apt-get finished but no chromium on PATH" >&2; exit 1; }
echo "[chromium] installed: $(chromium --version 2>/dev/null || true)"
