"""The launcher's decisions for GPU machines and for workers started side by side (no server, no GPU needed)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sessiongate.sglang_ext import gpu_placement, launcher, parallelism
from sessiongate.sglang_ext.gpu_placement import available_host_memory_bytes, host_kv_pool_gb, place_workers
from sessiongate.sglang_ext.hardware import gpu_count_present, gpu_ids
from sessiongate.sglang_ext.launcher import build_command, build_env, resolve_config, start_worker
from sessiongate.sglang_ext.ports import PortClaims, PortTaken, default_claims_dir
from sessiongate.sglang_ext.worker_config import WorkerConfig, parse_worker_config
from sessiongate.sglang_ext.worker_process import WorkerProcess, WorkerStartError, wait_all_ready


def flag_value(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


# --- finding GPUs without nvidia-smi ---------------------------------------------------------------


def test_gpus_are_found_from_the_drivers_proc_entries_then_device_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no nvidia-smi
    proc, dev = tmp_path / "proc-gpus", tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-modeset", "null"):  # control files are not GPUs
        (dev / name).touch()
    assert gpu_count_present(proc_gpus=proc, dev=dev) == 0
    for index in range(2):
        (dev / f"nvidia{index}").touch()
    assert gpu_count_present(proc_gpus=proc, dev=dev) == 2
    proc.mkdir()
    for bus in ("0000:17:00.0", "0000:65:00.0", "0000:ca:00.0"):
        (proc / bus).mkdir()
    assert gpu_count_present(proc_gpus=proc, dev=dev) == 3  # the driver's own list wins


def test_cuda_visible_devices_narrows_the_gpus() -> None:
    assert gpu_ids({}, present=0) == []
    assert gpu_ids({}, present=2) == ["0", "1"]
    assert gpu_ids({"CUDA_VISIBLE_DEVICES": "1"}, present=2) == ["1"]
    assert gpu_ids({"CUDA_VISIBLE_DEVICES": ""}, present=2) == []
    assert gpu_ids({"CUDA_VISIBLE_DEVICES": "-1"}, present=2) == []
    assert gpu_ids({"CUDA_VISIBLE_DEVICES": "0,5,1"}, present=2) == ["0"]  # CUDA stops at an invalid entry
    assert gpu_ids({"CUDA_VISIBLE_DEVICES": "GPU-8f1c,GPU-77aa"}, present=2) == ["GPU-8f1c", "GPU-77aa"]


def test_one_gpu_per_worker_where_there_are_enough() -> None:
    placements = place_workers(2, ["0", "1", "2"])
    assert [(p.gpu_id, p.mem_fraction_static, p.sharing, p.wait_before_next) for p in placements] == [
        ("0", None, 1, False),
        ("1", None, 1, False),
    ]


def test_workers_sharing_a_gpu_split_its_memory() -> None:
    # Three workers on one GPU (the engine tests start two or three): SGLang's default would let each claim ~87%.
    placements = place_workers(3, ["0"])
    assert {p.gpu_id for p in placements} == {"0"}
    assert all(p.sharing == 3 and p.wait_before_next for p in placements)
    fractions = [p.mem_fraction_static for p in placements]
    assert fractions == [0.283, 0.395, 0.653]
    # Each asks for its fraction of what is free when it starts, the ones before it being up: together at most
    # SHARED_GPU_FRACTION of the GPU.
    free, taken = 1.0, 0.0
    for fraction in fractions:
        assert fraction is not None
        taken += fraction * free
        free -= fraction * free
    assert taken <= gpu_placement.SHARED_GPU_FRACTION
    # Three workers on two GPUs: round-robin, the GPU with two splits it, the one alone keeps SGLang's default.
    two = place_workers(3, ["0", "1"])
    assert [(p.gpu_id, p.sharing) for p in two] == [("0", 2), ("1", 1), ("0", 2)]
    assert [p.mem_fraction_static for p in two] == [0.425, None, 0.739]
    with pytest.raises(ValueError, match="no GPU"):
        place_workers(1, [])


def test_host_kv_pool_is_a_share_of_available_host_memory() -> None:
    gib = 1024**3
    # A 128 GiB machine with 120 GiB available: 0.7 x (120 - 16) GiB = 78 GB for one worker, 39 GB each for two.
    assert host_kv_pool_gb(1, 120 * gib) == 78
    assert host_kv_pool_gb(2, 120 * gib) == 39
    assert host_kv_pool_gb(3, 120 * gib) == 26
    with pytest.raises(ValueError, match="under 1 GB each"):
        host_kv_pool_gb(4, 17 * gib)


def test_available_host_memory_is_bounded_by_the_cgroup(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       134217728 kB\nMemFree:        1000 kB\nMemAvailable:   125829120 kB\n")
    cgroup = tmp_path / "cgroup"
    assert available_host_memory_bytes(meminfo, cgroup) == 120 * 1024**3  # no cgroup files: the kernel's figure
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text(f"{10 * 1024**3}\n")
    assert available_host_memory_bytes(meminfo, cgroup) == 120 * 1024**3
    (cgroup / "memory.max").write_text(f"{64 * 1024**3}\n")
    assert available_host_memory_bytes(meminfo, cgroup) == 54 * 1024**3
    assert available_host_memory_bytes() > 0  # this machine's
    assert available_host_memory_bytes(tmp_path / "no-meminfo", cgroup) > 0  # the free pages instead


@pytest.fixture(autouse=True)
def _a_gpu_machines_host_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU worker's command sizes its host pool from the machine's available memory: a lent GPU machine's, not
    whatever this shared machine has free at the moment (under 17 GiB it refuses, as it should). Tests of that
    sizing set their own."""
    monkeypatch.setattr(launcher, "available_host_memory_bytes", lambda: 120 * 1024**3)


# --- the GPU worker's command line and environment ----------------------------------------------------


def test_a_gpu_worker_is_sized_by_sglang_from_its_gpu(tmp_path: Path) -> None:
    config = WorkerConfig(state_dir=tmp_path, device="cuda", model_path=Path("org/model"))
    command = build_command(config)
    for flag in ("--max-total-tokens", "--max-running-requests", "--chunked-prefill-size", "--mem-fraction-static"):
        assert flag not in command  # SGLang's own sizing for the GPU and the model
    sized = WorkerConfig(
        state_dir=tmp_path,
        device="cuda",
        model_path=Path("org/model"),
        mem_fraction_static=0.85,
        context_length=32768,
        gpu_id="3",
    )
    command = build_command(sized)
    assert flag_value(command, "--mem-fraction-static") == "0.85"
    assert flag_value(command, "--context-length") == "32768"
    assert build_env(sized, {})["CUDA_VISIBLE_DEVICES"] == "3"


def test_workers_started_side_by_side_on_one_gpu_split_it_equally(tmp_path: Path) -> None:
    # The engine tests start two or three workers at once: each asks for an equal share, not SGLang's ~0.87.
    config = WorkerConfig(state_dir=tmp_path, device="cuda", model_path=Path("org/model"), gpu_share=3)
    assert flag_value(build_command(config), "--mem-fraction-static") == "0.283"
    assert flag_value(build_command(config.replace(gpu_share=2)), "--mem-fraction-static") == "0.425"
    assert flag_value(build_command(config.replace(mem_fraction_static=0.3)), "--mem-fraction-static") == "0.3"
    assert "--mem-fraction-static" not in build_command(config.replace(gpu_share=1))
    assert "--mem-fraction-static" not in build_command(config.replace(device="cpu"))


def test_a_gpu_worker_asks_for_a_host_pool_in_gb_not_a_ratio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # SGLang's `--hicache-ratio 2.0` on an H200 asked for ~130 GB of pinned memory on a 128 GiB machine.
    monkeypatch.setattr(launcher, "available_host_memory_bytes", lambda: 120 * 1024**3)
    alone = build_command(WorkerConfig(state_dir=tmp_path, device="cuda", model_path=Path("org/model")))
    assert "--hicache-ratio" not in alone
    assert flag_value(alone, "--hicache-size") == "78"
    three = WorkerConfig(state_dir=tmp_path, device="cuda", model_path=Path("org/model"), machine_workers=3)
    assert flag_value(build_command(three), "--hicache-size") == "26"
    assert flag_value(build_command(three.replace(hicache_size=12)), "--hicache-size") == "12"  # as given
    resolved = resolve_config(three)
    assert resolved.hicache_size == 26  # decided once, when the worker starts
    monkeypatch.setattr(launcher, "available_host_memory_bytes", lambda: 8 * 1024**3)
    assert flag_value(build_command(resolved), "--hicache-size") == "26"
    with pytest.raises(WorkerStartError, match="under 1 GB each"):
        start_worker(three)
    assert not (tmp_path / "logs").exists()  # nothing was started
    assert "--hicache-size" not in build_command(three.replace(hierarchical_cache=False))


def test_a_cpu_worker_keeps_its_host_pool_ratio(tmp_path: Path) -> None:
    command = build_command(WorkerConfig(state_dir=tmp_path, device="cpu", machine_workers=2))
    assert flag_value(command, "--hicache-ratio") == "2.0"
    assert "--hicache-size" not in command
    assert resolve_config(WorkerConfig(state_dir=tmp_path, device="cpu")).hicache_size is None


def test_a_cpu_worker_keeps_its_small_sizes(tmp_path: Path) -> None:
    command = build_command(WorkerConfig(state_dir=tmp_path, device="cpu", mem_fraction_static=0.5, gpu_id="0"))
    assert flag_value(command, "--max-total-tokens") == "4096"
    assert flag_value(command, "--max-running-requests") == "8"
    assert flag_value(command, "--chunked-prefill-size") == "1024"
    assert "--mem-fraction-static" not in command
    assert "CUDA_VISIBLE_DEVICES" not in build_env(WorkerConfig(state_dir=tmp_path, device="cpu", gpu_id="0"), {})


def test_new_settings_come_from_flags_and_environment() -> None:
    config = parse_worker_config(
        ["--gpu-id", "1", "--mem-fraction-static", "0.8", "--nccl-port", "41000"],
        {"SESSIONGATE_WORKER_API_KEY": "k-123456", "SESSIONGATE_WORKER_CONTEXT_LENGTH": "8192"},
    )
    assert (config.gpu_id, config.mem_fraction_static, config.nccl_port) == ("1", 0.8, 41000)
    assert (config.api_key, config.context_length) == ("k-123456", 8192)


def test_the_api_key_reaches_sglang_and_stays_out_of_the_log(tmp_path: Path) -> None:
    from sessiongate.sglang_ext.launcher import _shown

    command = build_command(WorkerConfig(state_dir=tmp_path, device="cpu", api_key="s3cret-key"))
    assert flag_value(command, "--api-key") == "s3cret-key"
    assert "s3cret-key" not in _shown(command)
    assert "--api-key <api-key>" in _shown(command)


# --- more than one scheduler rank ----------------------------------------------------------------------


def test_more_than_one_rank_is_refused() -> None:
    assert parallelism.parallel_sizes(["--tp-size", "2", "--pp-size=3"]) == {"tp": 2, "pp": 3, "dp": 1}
    assert parallelism.refusal(1, 1, 1) is None
    message = parallelism.refusal(2)
    assert message is not None
    assert "tp=2" in message
    assert "clock" in message


def test_the_launcher_refuses_tp_before_starting_anything(tmp_path: Path) -> None:
    config = WorkerConfig(state_dir=tmp_path, device="cpu", extra_args=("--tp-size", "2"))
    with pytest.raises(WorkerStartError, match="one scheduler rank"):
        start_worker(config)
    assert not (tmp_path / "logs").exists()  # nothing was started


def test_several_tokenizer_workers_are_refused_before_starting_anything(tmp_path: Path) -> None:
    # With --tokenizer-worker-num > 1 SGLang puts its API-key check on none of the extension's routes.
    assert parallelism.args_refusal(["--tokenizer-worker-num", "1"]) is None
    assert parallelism.args_refusal(["--tokenizer-worker-num=4"]) is not None
    config = WorkerConfig(state_dir=tmp_path, device="cpu", extra_args=("--tokenizer-worker-num", "2"))
    with pytest.raises(WorkerStartError, match="one tokenizer worker"):
        start_worker(config)
    assert not (tmp_path / "logs").exists()


def test_the_plug_in_refuses_sglang_arguments_it_cannot_run_with() -> None:
    from types import SimpleNamespace

    from sessiongate.sglang_ext.internals.startup_check import _after_check_server_args, refusal_for

    assert refusal_for(SimpleNamespace(tp_size=1, pp_size=1, dp_size=1, tokenizer_worker_num=1)) is None
    with pytest.raises(ValueError, match="tp=2"):
        _after_check_server_args(None, SimpleNamespace(tp_size=2, pp_size=1, dp_size=1, tokenizer_worker_num=1))
    with pytest.raises(ValueError, match="--tokenizer-worker-num 2"):
        _after_check_server_args(None, SimpleNamespace(tp_size=1, pp_size=1, dp_size=1, tokenizer_worker_num=2))


# --- ports ------------------------------------------------------------------------------------------------


def test_a_claimed_port_is_not_claimed_again_until_released(tmp_path: Path) -> None:
    first, second = PortClaims(tmp_path), PortClaims(tmp_path)
    port = first.claim_free("127.0.0.1")
    with pytest.raises(PortTaken, match="already claimed"):
        first.claim("127.0.0.1", port)
    # A claim file of a live process (here: a child that sleeps) holds the port against other launchers.
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / str(port + 1)).write_text(str(holder.pid))
        with pytest.raises(PortTaken, match="another sessiongate launcher"):
            second.claim("127.0.0.1", port + 1)
    finally:
        holder.kill()
        holder.wait()
    # ... and once that process is gone, the claim is stale and taken over.
    if not _listening(port + 1):
        assert second.claim("127.0.0.1", port + 1) == port + 1
    first.release(port)
    assert not (tmp_path / str(port)).exists()
    assert {first.claim_free("127.0.0.1") for _ in range(5)}.isdisjoint(second.held)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_a_port_something_listens_on_is_refused_at_once(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(PortTaken, match="already in use"):
            PortClaims(tmp_path).claim("127.0.0.1", port)
        config = WorkerConfig(state_dir=tmp_path, device="cpu", port=port, model_path=tmp_path / "none")
        started = time.monotonic()
        with pytest.raises(WorkerStartError, match="already in use"):
            start_worker(config)
        assert time.monotonic() - started < 5


# --- failing fast -------------------------------------------------------------------------------------------


def _sleeper(tmp_path: Path, name: str, log_text: str, port: int) -> WorkerProcess:
    """A process that never answers /health, with the log an SGLang server would have written."""
    log = tmp_path / f"{name}.log"
    log.write_text(log_text)
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    return WorkerProcess(config=WorkerConfig(port=port), process=process, log_file=log)


def test_a_worker_that_logs_a_bind_failure_fails_fast_though_it_does_not_exit(tmp_path: Path) -> None:
    bind_failure = "[Errno 98] error while attempting to bind on address: address already in use"
    hung = _sleeper(tmp_path, "hung", f"starting\n{bind_failure}\n", 9)
    try:
        started = time.monotonic()
        with pytest.raises(WorkerStartError, match="address already in use") as failure:
            hung.wait_ready(timeout=300)
        assert time.monotonic() - started < 5
        assert "error while attempting to bind" in str(failure.value)  # the log's tail is in the message
    finally:
        hung.stop(timeout=5)


def test_waiting_for_several_workers_fails_as_soon_as_one_dies(tmp_path: Path) -> None:
    slow = _sleeper(tmp_path, "slow", "loading the model\n", 9)
    dead_log = tmp_path / "dead.log"
    dead_log.write_text("Traceback: CUDA out of memory\n")
    dead = WorkerProcess(
        config=WorkerConfig(port=9), process=subprocess.Popen([sys.executable, "-c", "exit(3)"]), log_file=dead_log
    )
    try:
        started = time.monotonic()
        with pytest.raises(WorkerStartError, match="exited with code 3"):
            wait_all_ready([slow, dead], timeout=300)
        assert time.monotonic() - started < 10
    finally:
        slow.stop(timeout=5)
        dead.stop(timeout=5)


# --- the plug-in is opt-in ------------------------------------------------------------------------------------


def test_the_plug_in_does_nothing_unless_enabled() -> None:
    # In a fresh interpreter: without SESSIONGATE_EXTENSION=1 it imports nothing of SGLang and says so once.
    code = (
        "import logging, sys; logging.basicConfig(level=logging.INFO)\n"
        "from sessiongate.sglang_ext.plugin import load_plugin\n"
        "load_plugin()\n"
        "print('sglang imported' if 'sglang' in sys.modules else 'sglang untouched')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SESSIONGATE_EXTENSION"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.strip() == "sglang untouched"
    assert result.stderr.count("sessiongate plug-in installed but not enabled") == 1


# --- `sessiongate up` on a GPU machine ---------------------------------------------------------------------------


def test_up_places_its_workers_and_shares_the_host_memory(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sessiongate import up
    from sessiongate.sglang_ext import hardware

    monkeypatch.setattr(hardware, "gpu_ids", lambda: ["0"])
    placements = up._gpu_placements(2)
    assert [(p.gpu_id, p.mem_fraction_static, p.wait_before_next) for p in placements] == [
        ("0", 0.425, True),
        ("0", 0.739, True),
    ]
    assert "--mem-fraction-static 0.425" in capsys.readouterr().out
    monkeypatch.setattr(hardware, "gpu_ids", lambda: [])
    assert up._gpu_placements(2) == []  # no GPU: CPU workers, as before
    monkeypatch.setattr(gpu_placement, "available_host_memory_bytes", lambda: 120 * 1024**3)
    assert up._host_pool_gb(2, on_gpu=True) == 39
    assert up._host_pool_gb(2, on_gpu=False) is None


def test_port_claims_are_per_network_namespace() -> None:
    """Ports are a network namespace's: workers in two (two hosts' worth of network on one machine, as in
    scripts/netns-cluster.sh) may both claim 30000, so each namespace has its own claims directory."""
    namespace = os.stat("/proc/self/ns/net").st_ino
    assert default_claims_dir().name == f"netns-{namespace}"
    assert PortClaims().directory == default_claims_dir()
