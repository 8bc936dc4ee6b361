#!/usr/bin/env bash
# The main job on a fresh machine: set up .venv if needed, then `sessiongate up` (two SGLang workers with
# SmolLM2-135M-Instruct, the gateway on SQLite, a shared KV pool directory). Arguments go to `sessiongate up`, e.g.
# `bash scripts/up.sh --demo` runs the demo conversation once everything is ready and keeps serving.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
exec .venv/bin/sessiongate up "$@"
