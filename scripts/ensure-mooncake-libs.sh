#!/usr/bin/env bash
# Make the shared libraries the Mooncake Store client loads at import present: libibverbs1, librdmacm1
# and libnuma1 (it links them even when it only speaks TCP). Uses what is installed; installs the rest
# with apt-get (root only, as on CI machines). Prints what it did.
set -euo pipefail
packages=(libibverbs1 librdmacm1 libnuma1)

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ "${#missing[@]}" = 0 ]; then echo "[mooncake] ${packages[*]} already installed"; exit 0; fi

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "[mooncake] missing ${missing[*]}: install them (Debian/Ubuntu: apt-get install ${missing[*]})," \
    "or the Mooncake pool tests are skipped" >&2
  exit 1
fi
echo "[mooncake] installing ${missing[*]} with apt-get"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; }
echo "[mooncake] installed ${missing[*]}"
