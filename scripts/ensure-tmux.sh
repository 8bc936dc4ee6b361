#!/usr/bin/env bash
# Make tmux present for the terminal test of `sessiongate status` (tests/gateway/test_status_command.py), which runs
# the command in a real terminal: a detached tmux session whose screen it reads. Uses the one installed; installs
# it with apt-get otherwise (root only, as on CI machines). Prints what it did; idempotent.
set -euo pipefail

if command -v tmux >/dev/null 2>&1; then echo "[tmux] already installed: $(tmux -V)"; exit 0; fi

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "[tmux] not installed: install it (Debian/Ubuntu: apt-get install tmux), or the terminal test is skipped" >&2
  exit 1
fi
echo "[tmux] installing with apt-get"
export DEBIAN_FRONTEND=noninteractive
# The package lists may be stale on a fresh machine: refreshed only when the first try fails.
apt-get install -y -qq --no-install-recommends tmux >/dev/null 2>&1 \
  || { apt-get update -qq && apt-get install -y -qq --no-install-recommends tmux >/dev/null; }
command -v tmux >/dev/null 2>&1 || { echo "[tmux] apt-get finished but no tmux on PATH" >&2; exit 1; }
echo "[tmux] installed: $(tmux -V)"
