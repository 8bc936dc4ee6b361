"""The worker launcher's command line, environment and CLI settings (no server started)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sessiongate.sglang_ext import launcher
from sessiongate.sglang_ext.cpu_compat import SITE_DIR
from sessiongate.sglang_ext.hardware import cores_per_worker, has_cuda
from sessiongate.sglang_ext.launcher import build_command, build_env, resolve_config
from sessiongate.sglang_ext.models import MODELS_DIR_ENV
from sessiongate.sglang_ext.mooncake import MasterConfig, build_master_command
from sessiongate.sglang_ext.plugin import TINY_TOOL_CALL_PARSER
from sessiongate.sglang_ext.tiny_model import make_model
from sessiongate.sglang_ext.worker_config import WorkerConfig, parse_worker_config


def flag_value(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


@pytest.fixture(autouse=True)
def _models_in_each_state_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher's own default (the test session shares one models directory: tests/conftest.py)."""
    monkeypatch.delenv(MODELS_DIR_ENV, raising=False)


@pytest.fixture(autouse=True)
def _a_gpu_machines_host_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU worker's command sizes its host pool from the machine's available memory: a lent GPU machine's, not
    whatever this shared machine has free at the moment (under 17 GiB it refuses, as it should)."""
    monkeypatch.setattr(launcher, "available_host_memory_bytes", lambda: 120 * 1024**3)


def test_a_shared_models_directory_holds_the_named_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MODELS_DIR_ENV, str(tmp_path / "shared"))
    for name in ("w1", "w2"):
        command = build_command(WorkerConfig(state_dir=tmp_path / name, device="cpu"))
        assert flag_value(command, "--model-path") == str(tmp_path / "shared" / "tiny")


@pytest.fixture
def cpu_config(tmp_path: Path) -> WorkerConfig:
    return WorkerConfig(state_dir=tmp_path, port=31234, device="cpu")


def test_cpu_command_has_the_cpu_flags_and_hicache(cpu_config: WorkerConfig, tmp_path: Path) -> None:
    command = build_command(cpu_config)
    assert command[1:3] == ["-m", "sglang.launch_server"]
    assert flag_value(command, "--device") == "cpu"
    assert flag_value(command, "--attention-backend") == "torch_native"
    assert flag_value(command, "--model-path") == str(tmp_path / "models" / "tiny")
    assert flag_value(command, "--max-total-tokens") == "4096"
    assert flag_value(command, "--dtype") == "float32"
    assert flag_value(command, "--port") == "31234"
    for flag in ("--enable-hierarchical-cache", "--enable-cache-report", "--enable-metrics"):
        assert flag in command
    assert flag_value(command, "--hicache-write-policy") == "write_through"
    assert flag_value(command, "--hicache-io-backend") == "direct"
    # The default pool is the verified `file` one, loaded through SGLang's `dynamic` backend.
    assert flag_value(command, "--hicache-storage-backend") == "dynamic"
    assert flag_value(command, "--hicache-storage-prefetch-policy") == "wait_complete"
    extra = json.loads(flag_value(command, "--hicache-storage-backend-extra-config"))
    assert extra == {
        "backend_name": "file",
        "module_path": "sessiongate.sglang_ext.internals.checked_file_store",
        "class_name": "CheckedFileStore",
        "file_storage_path": str(tmp_path / "kv-pool"),
    }
    assert flag_value(command, "--tool-call-parser") == TINY_TOOL_CALL_PARSER
    assert "--constrained-json-disable-any-whitespace" in command


def test_a_tiny_model_shared_by_path_keeps_its_tool_call_flags(tmp_path: Path) -> None:
    # A second worker pointed at the first one's tiny model must parse tool calls the same way.
    shared = make_model(tmp_path / "models" / "tiny")
    command = build_command(WorkerConfig(state_dir=tmp_path / "second", model_path=shared))
    assert flag_value(command, "--tool-call-parser") == TINY_TOOL_CALL_PARSER
    assert "--constrained-json-disable-any-whitespace" in command


def test_cpu_env_has_the_cpu_engine_and_the_compat_site_first(cpu_config: WorkerConfig) -> None:
    environ = {"PATH": "/usr/bin", "PYTHONPATH": "/elsewhere", "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": "/tmp/x"}
    env = build_env(cpu_config, environ)
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert env["PYTHONPATH"] == f"{SITE_DIR}{os.pathsep}/elsewhere"
    assert (SITE_DIR / "sitecustomize.py").is_file()
    assert (SITE_DIR / "sgl_kernel" / "__init__.py").is_file()
    # SGLang's file backend would prefer this variable over the configured pool directory.
    assert "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR" not in env
    assert environ["PYTHONPATH"] == "/elsewhere"  # the caller's mapping is left alone


def test_a_worker_serves_its_model_under_the_models_name_not_a_path(tmp_path: Path) -> None:
    def served(config: WorkerConfig) -> str | None:
        command = build_command(config)
        return flag_value(command, "--served-model-name") if "--served-model-name" in command else None

    assert served(WorkerConfig(state_dir=tmp_path)) == "tiny"
    assert served(WorkerConfig(state_dir=tmp_path, model_size="smollm2")) == "SmolLM2-135M-Instruct"
    local = tmp_path / "checkpoints" / "my-finetune"
    local.mkdir(parents=True)
    assert served(WorkerConfig(state_dir=tmp_path, model_path=local, device="cuda")) == "my-finetune"
    assert served(WorkerConfig(state_dir=tmp_path, model_path=Path("org/model"), device="cuda")) is None  # a hub id
    assert served(WorkerConfig(state_dir=tmp_path, model_path=local, served_model_name="ours")) == "ours"


def test_the_health_endpoint_generates_nothing_unless_the_operator_says_so(cpu_config: WorkerConfig) -> None:
    assert build_env(cpu_config, {})["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "false"
    assert (
        build_env(cpu_config, {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "1"})[
            "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"
        ]
        == "1"
    )


def test_cpu_threads_bound_the_cpu_engines_openmp_pool(tmp_path: Path) -> None:
    shared = WorkerConfig(state_dir=tmp_path, device="cpu", cpu_threads=3)
    assert build_env(shared, {"OMP_NUM_THREADS": "16"})["OMP_NUM_THREADS"] == "3"
    # None leaves torch's default (or what the caller's environment says) alone.
    alone = WorkerConfig(state_dir=tmp_path, device="cpu")
    assert "OMP_NUM_THREADS" not in build_env(alone, {})
    assert build_env(alone, {"OMP_NUM_THREADS": "5"})["OMP_NUM_THREADS"] == "5"
    # SGLang runs a GPU worker's torch with one thread itself.
    gpu = WorkerConfig(state_dir=tmp_path, device="cuda", model_path=Path("org/model"), cpu_threads=3)
    assert "OMP_NUM_THREADS" not in build_env(gpu, {})
    assert parse_worker_config(["--cpu-threads", "2"], {}).cpu_threads == 2
    assert parse_worker_config([], {"SESSIONGATE_WORKER_CPU_THREADS": "4"}).cpu_threads == 4
    with pytest.raises(SystemExit):
        parse_worker_config(["--cpu-threads", "0"], {})


def test_co_located_workers_share_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4}, raising=False)
    assert [cores_per_worker(n) for n in (1, 2, 3, 5, 8)] == [5, 2, 1, 1, 1]
    with pytest.raises(ValueError, match="at least 1"):
        cores_per_worker(0)


@pytest.mark.skipif(has_cuda(), reason="checks the defaults on a machine without CUDA")
def test_defaults_on_this_machine_pick_the_cpu_path(tmp_path: Path) -> None:
    config = WorkerConfig(state_dir=tmp_path)
    assert "--attention-backend" in build_command(config)
    assert build_env(config, {})["PYTHONPATH"] == str(SITE_DIR)
    assert resolve_config(config).device == "cpu"


def test_cuda_command_and_env_leave_sglang_alone(tmp_path: Path) -> None:
    config = WorkerConfig(state_dir=tmp_path, device="cuda", model_path=Path("org/model"), tool_call_parser="qwen25")
    command = build_command(config)
    assert "--device" not in command
    assert "--attention-backend" not in command
    assert "--hicache-io-backend" not in command
    assert flag_value(command, "--model-path") == "org/model"
    assert flag_value(command, "--dtype") == "auto"
    assert flag_value(command, "--tool-call-parser") == "qwen25"
    assert "--constrained-json-disable-any-whitespace" not in command
    env = build_env(config, {"PATH": "/usr/bin"})
    # only the plug-in's switch and a health check that generates nothing
    assert env == {
        "PATH": "/usr/bin",
        "SESSIONGATE_EXTENSION": "1",
        "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false",
    }


def test_options_reach_the_command(tmp_path: Path) -> None:
    config = WorkerConfig(
        state_dir=tmp_path,
        device="cpu",
        pool_dir=tmp_path / "pool",
        prefetch_threshold=64,
        page_size=16,
        served_model_name="tiny",
        extra_args=("--enable-priority-scheduling",),
    )
    command = build_command(config)
    extra = json.loads(flag_value(command, "--hicache-storage-backend-extra-config"))
    assert (extra["file_storage_path"], extra["prefetch_threshold"]) == (str(tmp_path / "pool"), 64)
    assert flag_value(command, "--page-size") == "16"
    assert flag_value(command, "--served-model-name") == "tiny"
    assert command[-1] == "--enable-priority-scheduling"
    no_l3 = build_command(WorkerConfig(state_dir=tmp_path, device="cpu", storage_backend=None))
    assert "--hicache-storage-backend" not in no_l3
    assert "--enable-hierarchical-cache" in no_l3
    no_hicache = build_command(WorkerConfig(state_dir=tmp_path, device="cpu", hierarchical_cache=False))
    assert "--enable-hierarchical-cache" not in no_hicache
    assert "--hicache-storage-backend" not in no_hicache


def test_cli_flags_beat_environment_beat_defaults(tmp_path: Path) -> None:
    environ = {
        "SESSIONGATE_WORKER_PORT": "31001",
        "SESSIONGATE_WORKER_PAGE_SIZE": "32",
        "SESSIONGATE_WORKER_HIERARCHICAL_CACHE": "false",
        "SESSIONGATE_WORKER_EXTRA_ARGS": "--schedule-policy lpm",
    }
    config = parse_worker_config(["--port", "31002", "--pool-dir", str(tmp_path)], environ)
    assert config.port == 31002  # flag
    assert config.page_size == 32  # environment
    assert config.hierarchical_cache is False
    assert config.pool_dir == tmp_path
    assert config.max_total_tokens == WorkerConfig().max_total_tokens  # default
    assert config.extra_args == ("--schedule-policy", "lpm")
    passthrough = parse_worker_config(["--model-size", "medium", "--", "--enable-metrics-for-all-schedulers"], environ)
    assert passthrough.model_size == "medium"
    assert passthrough.extra_args == ("--enable-metrics-for-all-schedulers",)
    assert parse_worker_config(["--model-path", "none"], {}).model_path is None
    with pytest.raises(SystemExit):
        parse_worker_config(["--device", "tpu"], {})


def test_priority_eviction_is_off_by_default_and_sets_sglang_priority_flags(tmp_path: Path) -> None:
    plain = build_command(WorkerConfig(state_dir=tmp_path, device="cpu"))
    assert "--radix-eviction-policy" not in plain
    assert "--enable-priority-scheduling" not in plain
    command = build_command(WorkerConfig(state_dir=tmp_path, device="cpu", priority_eviction=True))
    assert flag_value(command, "--radix-eviction-policy") == "priority"
    assert "--enable-priority-scheduling" in command
    assert int(flag_value(command, "--default-priority-value")) > 0  # above a one-off request's 0
    parsed = parse_worker_config(["--priority-eviction", "true"], {})
    assert parsed.priority_eviction is True


def test_a_mooncake_pool_reaches_sglangs_mooncake_backend(tmp_path: Path) -> None:
    parsed = parse_worker_config(
        [
            "--storage-backend",
            "mooncake",
            "--mooncake-master",
            "10.0.0.5:50051",
            "--mooncake-metadata-server",
            "http://10.0.0.5:8080/metadata",
            "--mooncake-segment-bytes",
            str(1 << 30),
            "--state-dir",
            str(tmp_path),
            "--host",
            "10.0.0.7",
        ],
        {},
    )
    command = build_command(parsed)
    assert flag_value(command, "--hicache-storage-backend") == "dynamic"  # SGLang's MooncakeStore, guarded
    extra = json.loads(flag_value(command, "--hicache-storage-backend-extra-config"))
    assert extra == {
        "backend_name": "mooncake",
        "module_path": "sessiongate.sglang_ext.internals.guarded_mooncake_store",
        "class_name": "GuardedMooncakeStore",
        "interface_v1": 1,
        "master_server_address": "10.0.0.5:50051",
        "metadata_server": "http://10.0.0.5:8080/metadata",
        "global_segment_size": 1 << 30,
        "protocol": "tcp",
        "local_hostname": "10.0.0.7",  # where the other workers' transfer engines reach this one
    }
    everywhere = build_command(WorkerConfig(state_dir=tmp_path, storage_backend="mooncake", host="0.0.0.0"))
    assert "local_hostname" not in json.loads(flag_value(everywhere, "--hicache-storage-backend-extra-config"))
    # A worker that lends the pool nothing, reaching it over the interface that faces it (benchmarks.pool_link).
    client = build_command(
        WorkerConfig(
            state_dir=tmp_path,
            storage_backend="mooncake",
            mooncake_segment_bytes=0,
            mooncake_local_hostname="198.18.0.1",
        )
    )
    client_extra = json.loads(flag_value(client, "--hicache-storage-backend-extra-config"))
    assert (client_extra["global_segment_size"], client_extra["local_hostname"]) == (0, "198.18.0.1")


def test_the_unchecked_file_pool_is_sglangs_own_file_backend_on_the_pool_directory(tmp_path: Path) -> None:
    command = build_command(WorkerConfig(state_dir=tmp_path, storage_backend="file-unchecked"))
    assert flag_value(command, "--hicache-storage-backend") == "dynamic"
    extra = json.loads(flag_value(command, "--hicache-storage-backend-extra-config"))
    assert extra == {
        "backend_name": "file-unchecked",
        "module_path": "sglang.srt.mem_cache.hicache_storage",
        "class_name": "HiCacheFile",
        "file_storage_path": str(tmp_path / "kv-pool"),
    }


def test_a_mooncake_master_listens_on_the_configured_address_only(tmp_path: Path) -> None:
    master = MasterConfig(host="127.0.0.1", rpc_port=5001, metadata_port=5002, admin_port=5003)
    command = build_master_command(master)
    assert command[1:3] == ["-m", "mooncake.cli"]
    for flag in ("rpc_address", "http_metadata_server_host", "metrics_host"):
        assert f"--{flag}=127.0.0.1" in command
    worker = master.pool_of(WorkerConfig(state_dir=tmp_path))
    assert (worker.storage_backend, worker.mooncake_master) == ("mooncake", "127.0.0.1:5001")
    assert worker.mooncake_metadata_server == "http://127.0.0.1:5002/metadata"


def test_smollm2_is_a_named_model_with_its_own_kv_pool_and_the_tool_template(tmp_path: Path) -> None:
    config = parse_worker_config(["--model-size", "smollm2", "--state-dir", str(tmp_path), "--device", "cpu"], {})
    assert config.model_size == "smollm2"
    command = build_command(config)
    assert flag_value(command, "--model-path") == str(tmp_path / "models" / "smollm2")
    assert flag_value(command, "--max-total-tokens") == "8192"  # the model's full context
    assert flag_value(command, "--tool-call-parser") == TINY_TOOL_CALL_PARSER  # sessiongate's template
    assert resolve_config(config).max_total_tokens == 8192
    assert parse_worker_config(["--max-total-tokens", "1024", "--model-size", "smollm2"], {}).max_total_tokens == 1024
    # Nothing is known of another model's KV: the conservative pool.
    other = build_command(WorkerConfig(model_path=tmp_path / "elsewhere", state_dir=tmp_path, device="cpu"))
    assert flag_value(other, "--max-total-tokens") == "4096"
    assert "--tool-call-parser" not in other
    with pytest.raises(SystemExit):
        parse_worker_config(["--model-size", "llama-70b"], {})
