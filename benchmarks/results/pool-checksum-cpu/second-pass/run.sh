#!/usr/bin/env bash
# Builds second_pass.c and runs it twice for each page size (64 KiB: the tiny model's page; 1 MiB: the medium
# model's). Needs gcc and an AVX2 CPU; the files (256 MiB a size) go to a directory of its own, removed after.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
gcc -O3 -mavx2 -o "$work/second_pass" "$here/second_pass.c"
grep -m1 "model name" /proc/cpuinfo
for kib in 64 128 1024; do
  for run in 1 2; do "$work/second_pass" "$work" "$kib" 5; done
done
