"""A host-to-device copy that finishes after the call that started it returns, as on a GPU.

On a GPU, HiCache's load-back (`L2TransferEngine.submit_host_to_device`) only *enqueues* a
layer-by-layer copy on a CUDA stream and returns; readers of the loaded pages must wait on the
per-layer events of `LayerDoneCounter`. On the CPU build every copy is done when the call returns,
so code that forgets to wait looks correct there. This module gives the CPU build the GPU's timing,
for tests (`SESSIONGATE_CPU_H2D_LAYER_DELAY_S`, see `sglang_ext.cpu_compat`):

- `DeferredEvent` stands in for a CUDA event: `arm()` when work is enqueued, `record()` when the
  copy thread reaches it; `query()` / `synchronize()` / `wait()` as CUDA's (`wait()` blocks the
  caller: the caller's thread is the stream that waits);
- `CopyStream` runs enqueued copies one after another on one thread (a stream is FIFO), each layer
  after a delay, then marks that layer's event.

Nothing here knows SGLang; `sglang_ext.internals.patches` binds it to HiCache's classes.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["CopyJob", "CopyStream", "DeferredEvent"]

logger = logging.getLogger(__name__)


class DeferredEvent:
    """A CUDA-like event whose completion a `CopyStream` (or the caller) reports."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._done.set()  # a CUDA event never recorded counts as complete

    def arm(self) -> None:
        """Work that ends at this event has been enqueued and has not run yet."""
        self._done.clear()

    def record(self, stream: object = None) -> None:
        self._done.set()

    def query(self) -> bool:
        return self._done.is_set()

    def synchronize(self) -> None:
        self._done.wait()

    def wait(self, stream: object = None) -> None:
        self._done.wait()


@dataclass(frozen=True)
class CopyJob:
    """One enqueued transfer: `copy_layer(i)` for each layer, then `layer_done(i)`."""

    layers: int
    copy_layer: Callable[[int], None]
    layer_done: Callable[[int], None]
    finished: DeferredEvent
    extra_events: Sequence[DeferredEvent] = ()
    """Events that complete with the job (the transfer's start and finish acknowledgements)."""


class CopyStream:
    """A FIFO of copies run by one daemon thread, `layer_delay_s` before each layer."""

    def __init__(self, layer_delay_s: float, name: str = "sessiongate-h2d") -> None:
        self._layer_delay_s = layer_delay_s
        self._jobs: queue.SimpleQueue[CopyJob] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: CopyJob) -> None:
        job.finished.arm()
        for event in job.extra_events:
            event.arm()
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            done = 0
            try:
                for layer in range(job.layers):
                    time.sleep(self._layer_delay_s)
                    job.copy_layer(layer)
                    job.layer_done(layer)
                    done += 1
            except Exception:  # a failed copy must not stall every later one or its readers: complete it, loudly
                logger.exception("sessiongate deferred host-to-device copy failed")
            finally:
                for layer in range(done, job.layers):
                    job.layer_done(layer)
                for event in job.extra_events:
                    event.record()
                job.finished.record()
