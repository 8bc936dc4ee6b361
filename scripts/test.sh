#!/usr/bin/env bash
# The test command: set up .venv if needed, then lint, type-check and run the whole test suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -m "not engine"` to skip the real-engine tests).
# pytest runs in SESSIONGATE_TEST_PROCESSES processes (default 2; 0 runs it in this one), each taking a whole test
# module at a time: a module's real workers are started once for its tests, and while one module waits (a worker's
# drain, a fault test's timeout) the other runs.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
py=.venv/bin
echo "[test] ruff"
"$py/ruff" check .
"$py/ruff" format --check .
echo "[test] mypy (strict)"
"$py/mypy"
echo "[test] pytest"
"$py/pytest" -n "${SESSIONGATE_TEST_PROCESSES:-2}" --dist loadfile "$@"
