"""Spec §9 check 12: sampling variants (Algorithms 6, 8 and sliding-window fine-tuning sampling)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from beam_dp.core import NoiseSource
from beam_dp.core.accounting.erm_log import events_of, spend_from_log
from beam_dp.mechanisms.erm import (
    ContinualReleaseMechanism,
    MultiResolutionMechanism,
    SlidingWindowMechanism,
    sampling_probability,
)
from tests.mechanisms.erm.util import TINY, blocks, run


def test_probabilities_match_target_shares():
    eps = 1.0
    mech = MultiResolutionMechanism(block=4, model=TINY, lam=1.0, epsilon=eps, sampling=True)
    p = [mech.level_noise(k)[1] for k in range(5)]
    assert np.allclose(p, [1, 0.437823, 0.205248, 0.099418, 0.048932], atol=1e-6)
    for k, pk in enumerate(p):
        assert math.log1p(pk * math.expm1(eps / 2)) == pytest.approx(eps / 2 ** (k + 1), abs=1e-12)
    sw = SlidingWindowMechanism(block=1, levels=5, model=TINY, lam=1.0, epsilon=eps, sampling=True)
    assert np.allclose([sw.bucket_noise(2**j)[1] for j in range(4)], [1, 0.479179, 0.234599, 0.116077], atol=1e-6)
    for j in range(4):
        assert math.log1p(sampling_probability(eps / (6 * 2**j), eps / 6) * math.expm1(eps / 6)) == pytest.approx(
            eps / (6 * 2**j), abs=1e-12)


@pytest.mark.parametrize("pair", [
    lambda s: MultiResolutionMechanism(block=2, model=TINY, lam=1.0, epsilon=1.0, sampling=s),
    lambda s: ContinualReleaseMechanism(update=2, base=4, model=TINY, lam=1.0, epsilon=1.0, sampling=s),
    lambda s: SlidingWindowMechanism(block=2, levels=3, model=TINY, lam=1.0, epsilon=1.0, sampling=s),
])
def test_ledgers_equal_unsampled_and_n_norm_is_block_size(pair):
    plain, sampled = pair(False), pair(True)
    unit = getattr(plain, "b0", None) or getattr(plain, "w0", None) or plain.block
    data = blocks(40, unit)
    rel_p = [r for rels in run(plain, data) for r in rels]
    rel_s = [r for rels in run(sampled, data) for r in rels]
    a = spend_from_log(events_of(rel_p), 80, plain.guarantee)[0]
    b = spend_from_log(events_of(rel_s), 80, sampled.guarantee)[0]
    assert np.allclose(a, b, atol=1e-12)
    assert [r.epsilon_spent for r in rel_p] == pytest.approx([r.epsilon_spent for r in rel_s], abs=1e-12)
    for e in events_of(rel_s):  # n_norm is the (pre-sampling) block size
        (first, last), = e["members"]
        assert e["n_norm"] == last - first + 1
    assert any(e["sample_p"] < 1 for e in events_of(rel_s))


def test_empirical_inclusion_rate():
    """Over 10 000 keys each position is kept with probability p ± 4 s.e. (s.e. = sqrt(p(1−p)/10 000))."""
    mech = MultiResolutionMechanism(block=8, model=TINY, lam=1.0, epsilon=1.0, sampling=True)
    n, keys = 8, 10_000
    for k in (1, 2, 3):
        p = mech.level_noise(k)[1]
        kept = np.stack([mech.sample_mask(NoiseSource(i.to_bytes(4, "little") * 8), "s", 7, n, p) for i in range(keys)])
        se = math.sqrt(p * (1 - p) / keys)
        assert np.all(np.abs(kept.mean(axis=0) - p) <= 4 * se)
