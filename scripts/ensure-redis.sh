#!/usr/bin/env bash
# Make a Redis server answer on 127.0.0.1:6379 for the replica tests (tests/replicas). Uses the one already running
# when there is one; otherwise starts the installed redis-server, or installs it with apt-get first (root only, as
# on CI machines). Idempotent; prints what it did.
set -euo pipefail
host=127.0.0.1 port=6379

answers() {
  timeout 3 bash -c "exec 3<>/dev/tcp/$host/$port && printf 'PING\r\n' >&3 && head -c 5 <&3 | grep -q PONG" 2>/dev/null
}

if answers; then echo "[redis] already running on $host:$port"; exit 0; fi

if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "[redis] not running and not installed; install redis-server or set SESSIONGATE_TEST_REDIS_URL" >&2
    exit 1
  fi
  echo "[redis] installing with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq redis-server >/dev/null
fi
# Our own instance, in the background, without persistence: test data only. The service manager may not run here
# (containers), so it is started directly rather than through systemctl.
redis-server --bind "$host" --port "$port" --daemonize yes --save "" --appendonly no \
  --logfile /tmp/sessiongate-redis.log --pidfile /tmp/sessiongate-redis.pid
for _ in $(seq 1 30); do answers && { echo "[redis] started on $host:$port"; exit 0; }; sleep 0.5; done
echo "[redis] did not start (see /tmp/sessiongate-redis.log)" >&2
exit 1
