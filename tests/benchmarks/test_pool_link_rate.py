"""The pool link's arithmetic (`benchmarks.pool_link.pool_link_rate_mbit`): no link, no worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessiongate.benchmarks.pool_link import H100_POOL_READ_RATIO, LinkSpec, link_spec, pool_link_rate_mbit
from sessiongate.benchmarks.pool_link_rate import PrefillRate


def test_the_h100_ratio_is_an_8b_models_kv_over_100_gbit_against_its_prefill() -> None:
    assert 0.415 < H100_POOL_READ_RATIO < 0.425
    # The H100's own numbers give back its own link: 128 KiB a token at 40k tokens/s is 100 Gb/s.
    assert pool_link_rate_mbit(131072, 40000) == pytest.approx(100_000)


def test_the_rate_grows_with_the_kv_and_the_prefill_and_falls_with_the_ratio() -> None:
    smollm2 = pool_link_rate_mbit(46080, 316)  # float32 KV, the prefill measured on 2 cores before
    assert smollm2 == pytest.approx(46080 * 8 * 316 / H100_POOL_READ_RATIO / 1e6)
    assert 270 < smollm2 < 285
    assert pool_link_rate_mbit(2 * 46080, 316) == pytest.approx(2 * smollm2)
    assert pool_link_rate_mbit(46080, 2 * 316) == pytest.approx(2 * smollm2)
    assert pool_link_rate_mbit(46080, 316, ratio=2 * H100_POOL_READ_RATIO) == pytest.approx(smollm2 / 2)


@pytest.mark.parametrize(("kv", "tokens_per_s", "ratio"), [(0, 316, 0.42), (46080, 0, 0.42), (46080, 316, 0)])
def test_nonsense_is_refused(kv: int, tokens_per_s: float, ratio: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        pool_link_rate_mbit(kv, tokens_per_s, ratio)


def test_a_measured_prefill_takes_the_median_run() -> None:
    measured = PrefillRate("smollm2", 2048, [8.2, 8.0, 30.0], 46080)
    assert measured.tokens_per_s == pytest.approx(2048 / 8.2)
    assert measured.rate_mbit() == pytest.approx(pool_link_rate_mbit(46080, 2048 / 8.2))


def test_auto_gives_each_model_the_rate_of_its_measured_prefill() -> None:
    assert link_spec("auto", "tiny").rate_mbit == pytest.approx(413, abs=1)
    assert link_spec("auto", "medium").rate_mbit == pytest.approx(265, abs=1)
    assert link_spec("auto", "smollm2").rate_mbit == pytest.approx(218, abs=1)
    assert link_spec("150", "smollm2", delay_ms=2) == LinkSpec(150.0, 2.0)
    with pytest.raises(ValueError, match="positive"):
        link_spec("0", "tiny")


def test_the_replay_puts_its_pool_behind_the_link_and_tells_kv_aware(tmp_path: Path) -> None:
    from sessiongate.benchmarks.replay.common import cluster_config
    from sessiongate.benchmarks.replay.runner import build_parser

    plain = cluster_config(build_parser().parse_args(["--state-dir", str(tmp_path)]))
    assert plain.pool_link is None
    linked = cluster_config(build_parser().parse_args(["--state-dir", str(tmp_path), "--pool-link", "auto"]))
    assert linked.pool_link == link_spec("auto", "tiny", delay_ms=0.5)
    assert plain.cost is not None
    assert linked.cost is not None
    # The tiny profile's pool (a directory here) is faster than the link: kv_aware is told the link's rate.
    assert plain.cost.pool_to_device_bytes_per_s > linked.pool_link.rate_mbit * 1e6 / 8
    assert linked.cost.pool_to_device_bytes_per_s == pytest.approx(linked.pool_link.rate_mbit * 1e6 / 8)
