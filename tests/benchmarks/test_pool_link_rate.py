"""The pool link's arithmetic (`benchmarks.pool_link.pool_link_rate_mbit`): no link, no worker."""

from __future__ import annotations

import pytest

from sessiongate.benchmarks.pool_link import H100_POOL_READ_RATIO, pool_link_rate_mbit
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
