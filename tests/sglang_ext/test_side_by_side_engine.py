"""Workers started side by side on one machine never meet on a port (real SGLang, CPU, tiny model).

Three workers are started at once, twice; each must come up. Every TCP port a worker listens on (its HTTP port
and its torch.distributed store, `--nccl-port`) is chosen and claimed by the launcher before SGLang starts, so
none of them can pick a port another is about to bind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sessiongate.sglang_ext.hardware import cores_per_worker
from sessiongate.sglang_ext.launcher import WorkerConfig, WorkerProcess, start_worker
from sessiongate.sglang_ext.ports import PortClaims
from sessiongate.sglang_ext.worker_process import stop_all, wait_all_ready

pytestmark = pytest.mark.engine

WORKERS = 3


@pytest.mark.parametrize("round_", [1, 2])
def test_workers_started_at_once_all_come_up(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, round_: int
) -> None:
    root = tmp_path_factory.mktemp(f"side-by-side-{round_}")
    # HTTP ports the way a harness picks them: each free when asked, and claimed by the launcher from then on.
    picker = PortClaims(root / "picker")
    ports = [picker.claim_free("127.0.0.1") for _ in range(WORKERS)]
    picker.release_all()
    started: list[WorkerProcess] = []
    try:
        for index, port in enumerate(ports):
            config = WorkerConfig(
                state_dir=root / f"w{index}",
                port=port,
                model_path=tiny_model_dir,
                storage_backend=None,
                cpu_threads=cores_per_worker(WORKERS),
                gpu_share=WORKERS,
            )
            started.append(start_worker(config))
        wait_all_ready(started, timeout=400)
        listening = [worker.config.port for worker in started] + [worker.config.nccl_port for worker in started]
        assert len(set(listening)) == 2 * WORKERS, listening
    finally:
        stop_all(started)
    claims_dir = PortClaims().directory
    assert not any((claims_dir / str(port)).exists() for port in listening)  # released on stop
