#!/usr/bin/env bash
# Print the directory that holds PostgreSQL's server binaries (initdb, pg_ctl, postgres), or exit 1.
# Debian and Ubuntu's `postgresql` package keeps them out of PATH, under /usr/lib/postgresql/<version>/bin
# (only the pg_ctlcluster wrappers are in /usr/bin), so `which pg_ctl` alone misses a fresh install.
# Order: $SESSIONGATE_PG_BINDIR; the directory of a pg_ctl on PATH; the newest version under
# ${SESSIONGATE_PG_LIB_ROOT:-/usr/lib/postgresql} (Debian), then /usr/pgsql-<version>/bin (PGDG RPMs).
set -euo pipefail

has_server() { [ -x "$1/pg_ctl" ] && [ -x "$1/initdb" ]; }

if [ -n "${SESSIONGATE_PG_BINDIR:-}" ]; then
  has_server "$SESSIONGATE_PG_BINDIR" && { echo "$SESSIONGATE_PG_BINDIR"; exit 0; }
  echo "SESSIONGATE_PG_BINDIR=$SESSIONGATE_PG_BINDIR holds no pg_ctl and initdb" >&2
  exit 1
fi

if on_path="$(command -v pg_ctl 2>/dev/null)"; then
  dir="$(dirname "$(readlink -f "$on_path")")"
  has_server "$dir" && { echo "$dir"; exit 0; }
fi

lib_root="${SESSIONGATE_PG_LIB_ROOT:-/usr/lib/postgresql}"
for dir in $(ls -d "$lib_root"/*/bin 2>/dev/null | sort -V -r) $(ls -d /usr/pgsql-*/bin 2>/dev/null | sort -V -r); do
  has_server "$dir" && { echo "$dir"; exit 0; }
done

echo "no PostgreSQL server binaries (pg_ctl, initdb) on PATH, in $lib_root/*/bin or /usr/pgsql-*/bin" >&2
exit 1
