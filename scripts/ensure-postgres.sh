#!/usr/bin/env bash
# Make a PostgreSQL server answer on 127.0.0.1:5432 with trust authentication for the store tests.
# Uses the one already running when there is one; otherwise starts the installed cluster, or installs
# PostgreSQL with apt-get first (root only, as on CI machines). Prints what it did.
set -euo pipefail
host=127.0.0.1 port=5432

answers() { timeout 3 bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null; }
# The store-down fault test runs its own throwaway cluster with initdb and pg_ctl, wherever the distribution put them.
bindir() {
  local dir
  if dir="$(bash "$(dirname "$0")/postgres-bindir.sh")"; then echo "[postgres] server binaries in $dir"
  else echo "[postgres] no initdb/pg_ctl found: tests/faults/test_store_down.py will not run" >&2; fi
}

if answers; then echo "[postgres] already running on $host:$port"; bindir; exit 0; fi

if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "[postgres] not running and not installed; install PostgreSQL or set SESSIONGATE_TEST_POSTGRES_URL" >&2
    exit 1
  fi
  echo "[postgres] installing with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq postgresql >/dev/null
fi
version="$(ls /etc/postgresql | sort -V | tail -n 1)"
hba="/etc/postgresql/$version/main/pg_hba.conf"
# Loopback connections without a password, for the test user `postgres` only.
if ! grep -q "sessiongate-tests" "$hba"; then
  sed -i "1i host all postgres 127.0.0.1/32 trust # sessiongate-tests\nhost all postgres ::1/128 trust # sessiongate-tests" "$hba"
fi
pg_ctlcluster --skip-systemctl-redirect "$version" main start || pg_ctlcluster --skip-systemctl-redirect "$version" main restart
for _ in $(seq 1 30); do answers && { echo "[postgres] started $version on $host:$port"; bindir; exit 0; }; sleep 1; done
echo "[postgres] did not start" >&2
exit 1
