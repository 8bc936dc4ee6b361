"""A running SGLang server process: wait until it is ready, stop it with its whole process group.

`WorkerProcess` wraps the `subprocess.Popen` that `sglang_ext.launcher.start_worker` made (with
`start_new_session=True`, so the server leads a process group that its scheduler and detokenizer
processes join). Readiness is `GET /health` answering 200, which SGLang does once its warm-up
request has run. Errors: `WorkerStartError` (the process exited, logged a failure it does not
always exit after, or did not become ready in time), with the tail of the server's log in the
message. `wait_all_ready(workers)` waits for several at once and fails as soon as any one fails,
instead of waiting out one worker's timeout while another is already dead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sessiongate.sglang_ext.ports import PortClaims
from sessiongate.sglang_ext.worker_config import WorkerConfig

__all__ = ["FATAL_LOG_MARKERS", "WorkerProcess", "WorkerStartError", "log_tail", "stop_all", "wait_all_ready"]

_POLL_SECONDS = 0.5
_GROUP_GRACE_SECONDS = 5.0
# Lines after which an SGLang server never becomes ready, though it may hang in its shutdown instead of exiting
# (seen: uvicorn's bind failure, after which the server waited for its scheduler for minutes).
FATAL_LOG_MARKERS = ("address already in use", "Scheduler hit an exception", "Received sigquit from a child process")


class WorkerStartError(RuntimeError):
    """The SGLang server exited or did not become ready; the message ends with its log's tail."""


def log_tail(path: Path, max_bytes: int = 6000) -> str:
    """The last `max_bytes` of a log file, decoded leniently ('' when there is none)."""
    try:
        with path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            size = log.tell()
            log.seek(max(0, size - max_bytes))
            return log.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


@dataclass
class WorkerProcess:
    """One started SGLang server. `stop()` is idempotent; use as a context manager to stop on exit."""

    config: WorkerConfig
    process: subprocess.Popen[bytes]
    log_file: Path
    claims: PortClaims | None = None
    """The ports claimed for this worker (`sglang_ext.ports`), released by `stop()`."""
    started_at: float = field(default_factory=time.monotonic)
    _log_offset: int = 0
    _terminated: bool = False

    @property
    def url(self) -> str:
        return self.config.url

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        """The server's exit code once it has ended, else None."""
        return self.process.poll()

    def _failure(self, what: str) -> WorkerStartError:
        return WorkerStartError(f"{what}; the end of {self.log_file}:\n{log_tail(self.log_file)}")

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5.0) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            # Not listening yet, or still warming up (503).
            return False

    def _logged_fatal(self) -> str | None:
        """A fatal line the server logged since the last look (its log is appended to, never rewritten)."""
        try:
            with self.log_file.open("rb") as log:
                log.seek(self._log_offset)
                text = log.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return None
        cut = text.rfind("\n") + 1  # a line still being written is read whole next time
        self._log_offset += len(text[:cut].encode("utf-8", errors="replace"))
        return next((marker for marker in FATAL_LOG_MARKERS if marker in text[:cut]), None)

    def check_started(self) -> bool:
        """One look: True once ready, False while starting; raises `WorkerStartError` once it has failed."""
        if self.process.poll() is not None:
            raise self._failure(f"SGLang server {self.url} exited with code {self.process.returncode}")
        fatal = self._logged_fatal()
        if fatal is not None:
            raise self._failure(f"SGLang server {self.url} failed to start ({fatal!r} in its log)")
        return self._healthy()

    def wait_ready(self, timeout: float = 300.0, cancel: threading.Event | None = None) -> float:
        """Block until `GET /health` answers 200; return the seconds since the process started.

        Raises `WorkerStartError` if the process exits first, logs a fatal error (`FATAL_LOG_MARKERS`) or
        `timeout` seconds pass. A set `cancel` event ends the wait early (returning the time so far), e.g. on a
        signal.
        """
        deadline = time.monotonic() + timeout
        while True:
            if self.check_started():
                return time.monotonic() - self.started_at
            if time.monotonic() > deadline:
                raise self._failure(f"SGLang server {self.url} was not ready after {timeout:.0f} s")
            if cancel is not None and cancel.wait(_POLL_SECONDS):
                return time.monotonic() - self.started_at
            if cancel is None:
                time.sleep(_POLL_SECONDS)

    def _signal_group(self, sig: signal.Signals) -> bool:
        """Send `sig` to the server's process group; False when the group is gone."""
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def begin_stop(self) -> None:
        """Send the server SIGTERM and return: `stop` then waits for it (`stop_all` stops several at once)."""
        if not self._terminated and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self._terminated = True

    def stop(self, timeout: float = 30.0) -> int:
        """Stop the server and everything in its process group; return the server's exit code.

        SIGTERM goes to the server process alone: SGLang then drains and shuts its scheduler and
        detokenizer down itself (signalling the whole group at once makes it mistake their exit for
        a crash, and it waits 5 s for diagnostics). The group gets SIGKILL if the server has not
        exited after `timeout` seconds, and whatever is left of it a few seconds after it has.
        """
        if self.process.poll() is None:
            self.begin_stop()  # once: a second SIGTERM is not a second request to drain
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
        # SGLang ends its scheduler and detokenizer as it exits; give stragglers a moment, no more:
        # with the server gone nothing else will stop them.
        grace_deadline = time.monotonic() + _GROUP_GRACE_SECONDS
        while self._group_alive() and time.monotonic() < grace_deadline:
            time.sleep(0.1)
        self._signal_group(signal.SIGKILL)
        code = self.process.wait()
        if self.claims is not None:
            self.claims.release_all()
        return code

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def stop_all(workers: Iterable[WorkerProcess], timeout: float = 30.0) -> None:
    """Stop every worker, their drains at the same time (each SGLang server takes seconds to shut down)."""
    workers = list(workers)
    for worker in workers:
        worker.begin_stop()
    for worker in workers:
        worker.stop(timeout)


def wait_all_ready(workers: list[WorkerProcess], timeout: float = 600.0) -> None:
    """Wait until every worker is ready; raise `WorkerStartError` as soon as one fails or `timeout` passes.

    The caller stops the workers (all of them) on an error, as after `wait_ready`.
    """
    deadline = time.monotonic() + timeout
    pending = list(workers)
    while pending:
        pending = [worker for worker in pending if not worker.check_started()]
        if pending and time.monotonic() > deadline:
            raise pending[0]._failure(f"SGLang server {pending[0].url} was not ready after {timeout:.0f} s")
        if pending:
            time.sleep(_POLL_SECONDS)
