"""A discrete-event simulator of a sessiongate cluster, driving the gateway's own routing and advisor objects.

Modules: `calibration` (hardware numbers as data: an H100 with Llama-3.1-8B, or our measured CPU workers),
`engine` (a worker: KV tiers, continuous batching, copies), `cluster` (N workers behind the gateway's policy,
KV belief and advisor; `simulate`), `experiments` (load and hint sweeps, validation against a replay), `cli`
(`python -m sessiongate.benchmarks.sim`, `sessiongate bench sim`), `calibrate_cpu` (measures one real CPU worker).
See docs/simulator.md.
"""

from __future__ import annotations

from .calibration import Calibration, cpu_profile, h100_llama8b
from .cli import main
from .cluster import SYSTEMS, SimResult, simulate

__all__ = ["SYSTEMS", "Calibration", "SimResult", "cpu_profile", "h100_llama8b", "main", "simulate"]
