"""Trace replay against real engines: the driver, the systems it compares, and `sessiongate bench replay`.

`driver.replay` sends `benchmarks.workloads` sessions to any running stack; `systems.running_stack` starts one of
the compared systems on fresh SGLang CPU workers; `runner.main` sweeps systems and loads and writes the report
(`benchmarks.report`); `busy.run_busy_worker` is the busy-worker scenario.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    from .runner import main as run

    return run(argv)
