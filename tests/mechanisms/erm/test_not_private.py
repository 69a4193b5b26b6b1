"""The as-published calibration (issue 17): NOT PRIVATE, so it must be requested explicitly, warn,
be refused outside the paper's setting and be flagged on every release; the Beam params cannot
request it. Its noise is coordinate Laplace at the paper's data-dependent scale."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from beam_dp.beam.erm import ContinualModelParams
from beam_dp.mechanisms.erm import ContinualReleaseMechanism, HuberRegression, SlidingWindowMechanism, SoftmaxRegression
from beam_dp.mechanisms.erm.base import NotPrivateWarning
from tests.mechanisms.erm.util import blocks, run, test_noise

MODEL = SoftmaxRegression(n_features=3, clip_bound=2.0, n_classes=3)
KW = dict(model=MODEL, lam=1.0, epsilon=1.0)


def continual(**extra) -> ContinualReleaseMechanism:
    return ContinualReleaseMechanism(update=8, base=16, **KW, **extra)


def test_default_is_private_and_unflagged():
    with warnings.catch_warnings():
        warnings.simplefilter("error", NotPrivateWarning)  # the default must not warn
        mech = continual()
    releases = [r for rs in run(mech, blocks(4, 8, 3, 3), test_noise()) for r in rs]
    assert releases and all("not_private" not in r.meta for r in releases)
    assert all(math.isfinite(r.epsilon_spent) and r.epsilon_spent <= 1.0 for r in releases)
    assert all(e["law"] == "gamma" for r in releases for e in r.meta["events"])


def test_not_private_mode_warns_and_flags_every_release():
    with pytest.warns(NotPrivateWarning, match="NOT PRIVATE"):
        mech = continual(as_published_not_private=True)
    assert mech.describe()["not_private"] is True
    releases = [r for rs in run(mech, blocks(4, 8, 3, 3), test_noise()) for r in rs]
    assert len(releases) == 3
    for r in releases:
        assert r.meta["not_private"] is True and "NOT PRIVATE" in r.meta["calibration"]
        assert r.epsilon_spent == math.inf and r.delta_spent == 1.0
        assert 0 < r.meta["claimed_epsilon"] <= 1.0
        assert all(e["not_private"] and "NOT_PRIVATE" in e["law"] for e in r.meta["events"])


@pytest.mark.parametrize("bad", [dict(noise="gaussian", delta=1e-5), dict(granularity=2.0**-10),
                                 dict(model=HuberRegression(n_features=3, clip_bound=2.0))])
def test_not_private_mode_refused_outside_the_papers_setting(bad):
    kw = {**KW, **bad}
    with pytest.raises(ValueError, match="as-published"):
        ContinualReleaseMechanism(update=8, base=16, **kw, as_published_not_private=True)


def test_flag_must_be_a_bool_and_params_cannot_request_it():
    with pytest.raises(ValueError):
        continual(as_published_not_private="yes")
    with pytest.raises(TypeError):  # the Beam transforms have no way to ask for it
        ContinualModelParams(n_features=3, classes=(0, 1, 2), update=8, base=16, as_published_not_private=True)


def test_scale_is_the_papers_data_dependent_one():
    """Independent recomputation of b = 2·L_data/(λ n ε_call) with L_data = (C−1)/(2mC)·‖X‖_F for the
    first (base) call of the cumulative release: n = m = B = 16, ε_call = ε_base/2 = ε/4."""
    with pytest.warns(NotPrivateWarning):
        mech = continual(as_published_not_private=True)
    data = blocks(2, 8, 3, 3, seed=5)
    (release,) = run(mech, data, test_noise())[1]
    X = MODEL.augment(np.concatenate([b.features for b in data]))
    l_data = (3 - 1) / (2 * 16 * 3) * np.linalg.norm(X)
    expected = 2 * l_data / (1.0 * 16 * (1.0 / 4))
    # the state stores rows in float32 (relative rounding ≤ 6e-8 per entry), hence rel=1e-6
    assert release.meta["noise_scale"] == pytest.approx(expected, rel=1e-6)
    assert release.meta["claimed_epsilon"] == pytest.approx(0.25, rel=1e-9)


def test_noise_is_coordinate_laplace():
    """2 000 independent streams of the sliding mechanism's first model: the release minus the
    noise-free model is Lap(b) per coordinate, whose variance is 2b² (K-norm would give (d+1)b²,
    d = 12, i.e. 6.5× more). The variance of 24 000 Laplace draws has relative s.e. √(5/24 000)
    ≈ 1.4 %, so a 10 % tolerance is > 6 s.e."""
    with pytest.warns(NotPrivateWarning):
        mech = SlidingWindowMechanism(block=8, levels=1, **KW, as_published_not_private=True)
    data = blocks(1, 8, 3, 3, seed=2)
    (clean,) = run(mech, data)[0]
    w0 = np.concatenate([clean.value["weights"], clean.value["intercepts"][:, None]], axis=1).ravel()
    draws, scales = [], set()
    for s in range(2000):
        (r,) = run(mech, data, test_noise(), stream=f"s{s}")[0]
        w = np.concatenate([r.value["weights"], r.value["intercepts"][:, None]], axis=1).ravel()
        draws.append((w - w0) / r.meta["noise_scale"])
        scales.add(r.meta["noise_scale"])
    assert len(scales) == 1  # same rows, same data-dependent scale
    assert np.var(np.concatenate(draws)) == pytest.approx(2.0, rel=0.10)
