"""WorkerConfig: the same validation from the constructor, the environment, `replace` and the CLI; each bad value
one error naming its variable (the CLI: its flag, as a usage error); the constructor reads no environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessiongate.sglang_ext.worker_config import WorkerConfig, WorkerConfigError, parse_worker_config


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("cpu_threads", "0", "SESSIONGATE_WORKER_CPU_THREADS='0': Input should be greater than or equal to 1"),
        ("port", "http", "SESSIONGATE_WORKER_PORT='http': Input should be a valid integer"),
        ("device", "tpu", "SESSIONGATE_WORKER_DEVICE='tpu': Input should be 'auto', 'cpu' or 'cuda'"),
        ("model_size", "huge", "SESSIONGATE_WORKER_MODEL_SIZE='huge': Input should be 'tiny', 'medium' or 'smollm2'"),
        (
            "hierarchical_cache",
            "maybe",
            "SESSIONGATE_WORKER_HIERARCHICAL_CACHE='maybe': Input should be a valid boolean",
        ),
    ],
)
def test_a_bad_value_is_one_error_naming_the_variable(
    field: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(WorkerConfigError) as from_env:
        WorkerConfig.from_env({f"SESSIONGATE_WORKER_{field.upper()}": value})
    with pytest.raises(WorkerConfigError) as from_constructor:
        WorkerConfig(**{field: value})
    assert str(from_env.value).startswith(message)
    assert str(from_constructor.value) == str(from_env.value)
    assert from_env.value.__cause__ is None
    with pytest.raises(WorkerConfigError, match=message.split("=")[0]):
        WorkerConfig().replace(**{field: value})

    with pytest.raises(SystemExit) as usage:
        parse_worker_config([f"--{field.replace('_', '-')}", value], {})
    assert usage.value.code == 2
    flag_message = message.replace(f"SESSIONGATE_WORKER_{field.upper()}", f"--{field.replace('_', '-')}")
    assert flag_message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_worker_config([], {f"SESSIONGATE_WORKER_{field.upper()}": value})
    assert message in capsys.readouterr().err


def test_the_constructor_takes_only_its_keywords(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SESSIONGATE_WORKER_PORT", "31999")
    assert WorkerConfig().port == 30000
    assert WorkerConfig.from_env().port == 31999
    assert parse_worker_config([], {"SESSIONGATE_WORKER_PORT": "31998"}).port == 31998


def test_replace_validates_and_keeps_the_rest(tmp_path: Path) -> None:
    config = WorkerConfig(state_dir=tmp_path, port=31000, extra_args=("--x",))
    moved = config.replace(nccl_port=41000)
    assert (moved.nccl_port, moved.state_dir, moved.port, moved.extra_args) == (41000, tmp_path, 31000, ("--x",))
    assert config.nccl_port is None
    with pytest.raises(WorkerConfigError, match="SESSIONGATE_WORKER_MAX_TOTAL_TOKENS=-5"):
        config.replace(max_total_tokens=-5)
    assert WorkerConfig(model_path="none").model_path is None  # "none" is None for an optional setting
    assert WorkerConfig.from_env({"SESSIONGATE_WORKER_EXTRA_ARGS": "--a 'b c'"}).extra_args == ("--a", "b c")
