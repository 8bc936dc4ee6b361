"""The instruction-count benchmark's driver serves real turns through each system (fake worker processes upstream),
counts the ones that fail, and, where valgrind is installed, reports a count per turn."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessiongate.benchmarks import instructions
from sessiongate.benchmarks.processes import FakeWorkerProcess

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    started = [FakeWorkerProcess(tmp_path_factory.mktemp("workers"), prefix_cache=False) for _ in range(2)]
    try:
        for worker in started:
            worker.wait_ready()
        yield [worker.url for worker in started]
    finally:
        for worker in started:
            worker.stop()


@pytest.mark.parametrize(
    ("system", "stream"),
    [
        ("sessiongate", False),
        ("sessiongate", True),
        ("floor", False),
        ("stored-floor", False),
        ("stored-floor", True),
        ("store", False),
    ],
)
async def test_every_turn_is_served(workers: list[str], system: str, stream: bool) -> None:
    assert await instructions.serve_turns(system, workers, warm=16, turns=32, stream=stream) == 0


async def test_failed_turns_are_counted() -> None:
    # Nothing listens on the discard port: the floor answers 502 for every turn.
    failed = await instructions.serve_turns("floor", ["http://127.0.0.1:9"], warm=0, turns=20, stream=False)
    assert failed == 20


def test_the_report_gives_each_system_against_the_floor() -> None:
    counts = [
        instructions.Count("sessiongate", False, 1_500_000),
        instructions.Count("floor", False, 200_000),
        instructions.Count("store", False, 900_000),
    ]
    lines = instructions.report(counts).splitlines()
    assert lines[2:] == [
        "| sessiongate | non-streamed | 1,500,000 | 7.50x |",
        "| floor | non-streamed | 200,000 | - |",
        "| store | non-streamed | 900,000 | 4.50x |",
    ]


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed (apt-get install valgrind)")
def test_a_count_under_valgrind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "counts.json"
    instructions.main(["--systems", "floor", "--warm", "8", "--short", "16", "--long", "48", "--json", str(out)])
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| floor ")]
    per_turn = int(row.split("|")[3].strip().replace(",", ""))
    assert 10_000 < per_turn < 10_000_000  # a Python proxy's turn: far more than nothing, far less than a second
    assert str(per_turn) in out.read_text()
