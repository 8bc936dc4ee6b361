#!/usr/bin/env bash
# Build the wheels a GPU machine of the device tool needs to run sessiongate's worker and gateway (issue 28, part 1).
#
# That machine reaches no package registry: what it lacks travels in a carried, git-ignored folder, at most 64 MiB
# together with the working tree, and installs there with
#   python3 -m pip install -q --no-index --no-deps --no-compile --target SITE gpu-bundle/wheels/*.whl
# Its image (Python 3.12.3, torch 2.11.0+cu130; /work/.library/device/KINDS.md, docs/gpu.md) has no SGLang,
# sgl-kernel, flashinfer, FastAPI/uvicorn, pydantic, Starlette, SQLAlchemy, pyzmq or orjson.
#
# Usage: bash scripts/gpu-bundle.sh [OUT_DIR]   (default: gpu-bundle/, git-ignored)
# It downloads CPython 3.12 manylinux x86-64 wheels (no dependencies resolved: each is named below), trims SGLang
# 0.5.23 of what a text-only worker never imports (multimodal_gen, test, benchmark) and repacks it, builds
# sessiongate's own wheel, and prints the sizes. It exits 1 when the bundle cannot fit the 64 MiB a call carries,
# naming what does not fit (SGLang's CUDA kernels: sglang-kernel's x86-64 wheel alone is ~356 MiB).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/gpu-bundle}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON="$(command -v python3)"
LIMIT=$((64 * 1024 * 1024))
WHEELS="$OUT/wheels"
rm -rf "$WHEELS"
mkdir -p "$WHEELS" "$OUT/too-big"

download() {  # download NAME==VERSION into DIR, CPython 3.12 manylinux x86-64 wheels only
    local dir="$1"; shift
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 -d "$dir" "$@" 2>&1 | grep -v "is ignored: it is neither" || true
}

# SGLang 0.5.23 (cp312 wheels exist only for manylinux_2_34; the image's Ubuntu 24.04 glibc 2.39 takes them).
download "$OUT/raw" "sglang==0.5.23"
SGLANG_WHEEL="$(ls "$OUT"/raw/sglang-0.5.23-*.whl)"
"$PYTHON" - "$SGLANG_WHEEL" "$WHEELS" <<'PY'
import base64, hashlib, sys, zipfile
from pathlib import Path

source, target_dir = Path(sys.argv[1]), Path(sys.argv[2])
DROP = ("sglang/multimodal_gen/", "sglang/test/", "sglang/benchmark/")  # never imported by a text-only worker
target = target_dir / source.name
with zipfile.ZipFile(source) as wheel, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as out:
    record_name = next(n for n in wheel.namelist() if n.endswith(".dist-info/RECORD"))
    kept = []
    for info in wheel.infolist():
        if info.filename == record_name or info.filename.startswith(DROP):
            continue
        data = wheel.read(info)
        out.writestr(info, data, zipfile.ZIP_DEFLATED)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        kept.append(f"{info.filename},sha256={digest},{len(data)}")
    kept.append(f"{record_name},,")
    out.writestr(record_name, "\n".join(kept) + "\n")
print(f"sglang trimmed: {source.stat().st_size / 2**20:.1f} MiB -> {target.stat().st_size / 2**20:.1f} MiB")
PY

# What the worker (SGLang's HTTP server, the extension) and the gateway import that the image lacks, pinned to what
# this project's CPU environment runs (docs/sglang-on-cpu.md), pure Python or small compiled ones. Left to the
# image (they would not fit): transformers 5.17 (SGLang pins 5.19: 12 MiB), tokenizers 0.23.2 (the same),
# sentencepiece 0.2.2 (pin 0.2.1), numpy, safetensors, aiohttp, uvloop, httpx, prometheus-client, psutil, pillow.
download "$WHEELS" \
    fastapi starlette "uvicorn>=0.51" pydantic pydantic-core pydantic-settings annotated-types typing-inspection \
    python-dotenv python-multipart sqlalchemy greenlet aiosqlite alembic mako "pyzmq>=25.1.2" orjson msgspec \
    pybase64 setproctitle partial-json-parser interegular "xgrammar==0.2.7" "openai==2.8.0" jiter distro sniffio \
    "compressed-tensors==0.18.0" "apache-tvm-ffi==0.1.11" dill einops gguf blobfile pycryptodomex jsonschema \
    jsonschema-specifications referencing rpds-py watchfiles llguidance outlines_core
"$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$WHEELS" "$ROOT" 2>&1 | grep -v "is ignored" || true

# SGLang's CUDA kernels: required by a GPU worker, far above the limit. Downloaded aside for the size only.
download "$OUT/too-big" "sglang-kernel==0.4.10" "flashinfer-python==0.7.2" || true

tree_bytes=$(cd "$ROOT" && git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
wheel_bytes=$(du -cb "$WHEELS"/*.whl | tail -1 | cut -f1)
echo "wheels (gpu-bundle/wheels): $(ls "$WHEELS" | wc -l) files, $((wheel_bytes / 1048576)) MiB"
du -b "$WHEELS"/*.whl | sort -n | tail -8 | awk '{printf "  %6.1f MiB  %s\n", $1 / 1048576, $2}'
echo "working tree: $((tree_bytes / 1048576)) MiB; together: $(((wheel_bytes + tree_bytes) / 1048576)) MiB of 64"
status=0
if [ $((wheel_bytes + tree_bytes)) -gt "$LIMIT" ]; then
    echo "does not fit: the wheels and the working tree exceed 64 MiB" >&2
    status=1
fi
for wheel in "$OUT"/too-big/*.whl; do
    [ -e "$wheel" ] || continue
    echo "not in the bundle, needed on the GPU: $(basename "$wheel") ($(($(stat -c %s "$wheel") / 1048576)) MiB)" >&2
    status=1
done
echo "also needed and not obtainable here: torch 2.14.1 (SGLang 0.5.23's pin; the image has 2.11.0+cu130)" >&2
exit $status
