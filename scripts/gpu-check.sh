#!/usr/bin/env bash
# The GPU check suite: what only a GPU shows about sessiongate's SGLang extension (docs/gpu.md).
#
#   bash scripts/gpu-check.sh [PART...]      # default: every part, in this order
#
# Parts (each written to finish in under 10 minutes on one H100):
#   env       CUDA, torch, sgl-kernel and sglang versions; the plug-in's entry point; GPUs as the launcher sees them
#   plugin    one worker on the GPU: the plug-in loads (its /info answers, no CPU compatibility layer), and a
#             plain SGLang server started beside it without SESSIONGATE_EXTENSION stays untouched
#   engine    the existing real-engine tests of the extension, on the GPU
#   race      a request right after a device prefetch, with SGLang's own H2D delay (SGLANG_TEST_HICACHE_H2D_DELAY_CYCLES)
#   ring      six device prefetches at once (the load ring has three slots), same delay
#   signals   the gateway's signal and advisory tests against GPU workers
#   overhead  the plug-in's cost per step: python -m sglang.bench_serving (random-ids: no download) against a
#             worker with and without it
#
# Environment: PYTHON (default .venv/bin/python, else python3), SESSIONGATE_GPU_H2D_DELAY_CYCLES (default
# 1500000000: about a second per layer on an H100's ~1.7 GHz clock), OUT (where logs and figures go, default
# .sessiongate/gpu-check). The machine needs no network: models are generated locally (tiny and medium).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-}"
if [[ -z "$py" ]]; then
    if [[ -x .venv/bin/python ]]; then py=.venv/bin/python; else py=python3; fi
fi
out="${OUT:-$root/.sessiongate/gpu-check}"
mkdir -p "$out"
delay="${SESSIONGATE_GPU_H2D_DELAY_CYCLES:-1500000000}"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
parts=("$@")
if [[ ${#parts[@]} -eq 0 ]]; then parts=(env plugin engine race ring signals overhead); fi

step() { echo; echo "=== gpu-check: $* ($(date -u +%H:%M:%S))"; }

part_env() {
    step "environment"
    command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "nvidia-smi: not installed (the launcher does not need it)"
    "$py" - <<'PY'
import importlib.metadata as md
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      "devices", torch.cuda.device_count())
for dist in ("sglang", "sgl-kernel", "sglang-kernel", "flashinfer-python", "sessiongate"):
    try:
        print(dist, md.version(dist))
    except md.PackageNotFoundError:
        print(dist, "not installed")
eps = [ep for ep in md.entry_points(group="sglang.srt.plugins") if ep.name == "sessiongate"]
print("plug-in entry point:", eps[0].value if eps else "MISSING")
assert eps, "the sessiongate entry point is not installed (pip install -e .[worker])"
from sessiongate.sglang_ext.hardware import gpu_count_present, gpu_ids
print("GPUs (launcher's view):", gpu_count_present(), gpu_ids())
assert torch.cuda.is_available(), "CUDA is not available to torch"
assert gpu_ids(), "the launcher finds no GPU"
PY
}

part_plugin() {
    step "plug-in loads on the GPU, and only where asked for"
    "$py" - "$out" <<'PY'
import json, os, sys, urllib.request
from pathlib import Path
from sessiongate.sglang_ext.launcher import WorkerConfig, start_worker
from sessiongate.sglang_ext.ports import PortClaims
from sessiongate.sglang_ext.worker_process import wait_all_ready

out = Path(sys.argv[1])
claims = PortClaims()
ports = [claims.claim_free("127.0.0.1") for _ in range(2)]
claims.release_all()
with_plugin = start_worker(WorkerConfig(state_dir=out / "state", port=ports[0], log_file=out / "plugin-on.log"))
try:
    wait_all_ready([with_plugin], 600)
    info = json.load(urllib.request.urlopen(with_plugin.url + "/sessiongate/v1/info", timeout=30))
    print("info:", info)
    # GPU_CHECK_ON_CPU=1 dry-runs this part on a CPU machine (the layer is then rightly active).
    if os.environ.get("GPU_CHECK_ON_CPU") != "1":
        assert info["cpu_compat"] is False, "the CPU compatibility layer is active on a GPU machine"
finally:
    with_plugin.stop()
plain = start_worker(WorkerConfig(state_dir=out / "state", port=ports[1], extension=False, log_file=out / "plugin-off.log"))
try:
    wait_all_ready([plain], 600)
    try:
        urllib.request.urlopen(plain.url + "/sessiongate/v1/info", timeout=30)
        raise SystemExit("a server started without SESSIONGATE_EXTENSION has the extension's routes")
    except urllib.error.HTTPError as error:
        assert error.code == 404, error
    log = (out / "plugin-off.log").read_text(errors="replace")
    assert "sessiongate plug-in installed but not enabled" in log
    print("plain SGLang: untouched (404, one log line)")
finally:
    plain.stop()
PY
}

part_engine() {
    step "the extension's real-engine tests on the GPU"
    "$py" -m pytest -m engine -q -x --timeout 540 \
        tests/sglang_ext/test_worker_engine.py tests/sglang_ext/test_prefetch_engine.py \
        tests/sglang_ext/test_pool_namespace_engine.py tests/sglang_ext/test_side_by_side_engine.py \
        2>&1 | tee "$out/engine.log"
}

part_race() {
    step "race: a request right after a device prefetch (H2D delay $delay cycles per layer)"
    SGLANG_TEST_HICACHE_H2D_DELAY_CYCLES="$delay" "$py" -m pytest -m engine -q --timeout 540 \
        "tests/sglang_ext/test_prefetch_race_engine.py::test_a_request_right_after_a_device_prefetch_reads_the_loaded_kv" \
        2>&1 | tee "$out/race.log"
}

part_ring() {
    step "ring: six device prefetches at once (H2D delay $delay cycles per layer)"
    SGLANG_TEST_HICACHE_H2D_DELAY_CYCLES="$delay" "$py" -m pytest -m engine -q --timeout 540 \
        "tests/sglang_ext/test_prefetch_race_engine.py::test_six_device_prefetches_at_once" \
        2>&1 | tee "$out/ring.log"
}

part_signals() {
    step "the gateway's signal and advisory tests against GPU workers"
    "$py" -m pytest -m engine -q --timeout 540 tests/engine/test_signals_engine.py tests/engine/test_advisor_engine.py \
        2>&1 | tee "$out/signals.log"
}

part_overhead() {
    step "the plug-in's cost per step: sglang.bench_serving with and without it (medium model)"
    "$py" - "$out" <<'PY'
import subprocess, sys
from pathlib import Path
from sessiongate.sglang_ext.launcher import WorkerConfig, start_worker
from sessiongate.sglang_ext.ports import PortClaims
from sessiongate.sglang_ext.tiny_model import make_model
from sessiongate.sglang_ext.worker_process import wait_all_ready

out = Path(sys.argv[1])
model = make_model(out / "models" / "medium", "medium")
for extension in (True, False):
    claims = PortClaims()
    port = claims.claim_free("127.0.0.1")
    claims.release_all()
    name = "with-plugin" if extension else "without-plugin"
    worker = start_worker(WorkerConfig(state_dir=out / "state", model_path=model, port=port, extension=extension,
                                       log_file=out / f"overhead-{name}.log"))
    try:
        wait_all_ready([worker], 600)
        command = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--host", "127.0.0.1",
                   "--port", str(port), "--tokenizer", str(model), "--dataset-name", "random-ids",
                   "--random-input-len", "1024", "--random-output-len", "256", "--num-prompts", "200",
                   "--max-concurrency", "16", "--output-file", str(out / f"bench-{name}.jsonl")]
        print(" ".join(command), flush=True)
        subprocess.run(command, check=True)
    finally:
        worker.stop()
print(f"figures: {out}/bench-with-plugin.jsonl and {out}/bench-without-plugin.jsonl (compare median ITL and TPOT)")
PY
}

for part in "${parts[@]}"; do
    case "$part" in
        env|plugin|engine|race|ring|signals|overhead) "part_$part" ;;
        *) echo "unknown part: $part (env plugin engine race ring signals overhead)" >&2; exit 2 ;;
    esac
done
echo; echo "=== gpu-check: done; logs in $out"
