"""The BLT fitted for the mean per-step variance (``error="mean"``, shipped as ``BLT_MEAN``): its closed
form, that it beats the max-error fit on the mean and not on the max, that its privacy calibration is
the max-error fit's rule (σ on the column norm of the BLT in use) and that the verifier recomputes it,
and its plumbing (``ContinualSumParams.blt_error``, ``--blt-error`` on ``continual_stats``)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from beam_dp.beam import ContinualCountParams, ContinualSumParams
from beam_dp.core import StepClock
from beam_dp.core.calibration import analytic_gaussian_sigma
from beam_dp.core.noise import NoiseSource
from beam_dp.core.noise_declaration import loss_of_declaration, recomputed_epsilon
from beam_dp.io import read_releases
from beam_dp.mechanisms.sums import fitted_params_data as data
from beam_dp.mechanisms.sums.blt import BLTSum
from beam_dp.mechanisms.sums.blt_math import BLT, fit_blt
from beam_dp.mechanisms.sums.factory import make_counter
from beam_dp.mechanisms.sums.fitted_params import blt_for
from beam_dp.verify import verify_job
from beam_dp.verify_calibration import SumCalibrations
from pipelines import continual_stats
from tests.conftest import TEST_KEY

EPS, DELTA = 0.7, 1e-6


def test_mean_closed_form_matches_the_explicit_sum():
    """(1/T)Σ_{j<T}(T − j)b_j² against the mean of the explicit cumulative sums (O(T·n)); 1e-9
    relative: both are float64 sums of a few thousand terms of one sign pattern."""
    for horizon in (1, 2, 7, 64, 1000, 4096):
        for blt in (blt_for(horizon), blt_for(horizon, "mean"), blt_for(None), blt_for(None, "mean")):
            direct = float(np.mean(blt.direct_row_norm_sq(horizon)))
            assert blt.mean_row_norm_sq(horizon) == pytest.approx(direct, rel=1e-9)


@pytest.mark.parametrize("horizon", [1024, 4096])
def test_mean_fit_has_lower_mean_and_no_lower_max_variance(horizon):
    """Exact explicit sums (not the fits' own closed forms): the mean-error fit's mean variance is at
    least 2 % below the max-error fit's (measured 3.36 % / 3.02 %), its max variance no lower."""
    fit_max, fit_mean = blt_for(horizon), blt_for(horizon, "mean")
    assert fit_max != fit_mean

    def explicit(blt: BLT) -> tuple[float, float]:
        col, rows = blt.col_norm_sq(horizon), blt.direct_row_norm_sq(horizon)
        return col * float(rows.max()), col * float(rows.mean())

    max_of_max, mean_of_max = explicit(fit_max)
    max_of_mean, mean_of_mean = explicit(fit_mean)
    assert mean_of_mean <= 0.98 * mean_of_max
    assert max_of_mean >= max_of_max * (1 - 1e-12)


def test_the_shipped_tables_cover_the_same_horizons():
    assert set(data.BLT_MEAN) == set(data.BLT) and len(data.BLT_MEAN_UNBOUNDED[0]) == 4
    for k in (0, 5, 12, 20):  # the shipped parameters are valid BLTs whose mean is no worse than the max fit's
        horizon = 2**k
        mean_fit, max_fit = blt_for(horizon, "mean"), blt_for(horizon)
        assert mean_fit.mean_variance_units(horizon) <= max_fit.mean_variance_units(horizon) * (1 + 1e-9)
    with pytest.raises(ValueError, match="error"):
        blt_for(64, "median")
    with pytest.raises(ValueError, match="error"):
        fit_blt(8, error="median")


@pytest.mark.parametrize("horizon", [100, None])
def test_privacy_calibration_is_the_same_rule_and_the_verifier_recomputes_it(horizon):
    """σ = analytic Gaussian σ on Δ₂·‖column‖ of the BLT in use (over T, or over all steps), the
    declaration's weight is that squared column norm, the spend recomputes from it, and the verifier,
    rebuilding the mechanism from the release's public meta, accepts the mean-fit release and rejects
    it when the meta claims the max-error fit."""
    mech = make_counter("blt", horizon=horizon, blt_error="mean", dim=1, epsilon=EPS, delta=DELTA,
                        clip_bound=1.0, noise="gaussian")
    assert isinstance(mech, BLTSum) and mech.blt == blt_for(horizon, "mean")
    column = mech.blt.col_norm_sq(math.inf if horizon is None else horizon)
    assert mech.sigma == pytest.approx(analytic_gaussian_sigma(EPS, DELTA, 2.0 * math.sqrt(column)), rel=1e-12)
    state, noise = mech.init_state("s"), NoiseSource(TEST_KEY)
    for _ in range(8):
        state, (release,) = mech.step(state, np.array([0.5]), noise)
    (law, sensitivity, scale, weight), = json.loads(release.noise)["terms"]
    assert (law, sensitivity, scale) == ("gaussian", 2.0, pytest.approx(mech.sigma, rel=1e-12))
    assert weight == pytest.approx(mech.blt.col_norm_sq(8), rel=1e-12)
    recomputed = recomputed_epsilon(loss_of_declaration(release.noise), DELTA)
    assert recomputed == pytest.approx(release.epsilon_spent, rel=1e-9)
    assert release.meta["fit_error"] == "mean"
    meta = json.dumps(release.meta)
    assert SumCalibrations().problem("blt", meta, EPS, DELTA, 8, release.noise) is None
    as_max = json.dumps({**release.meta, "fit_error": "max"})
    assert SumCalibrations().problem("blt", as_max, EPS, DELTA, 8, release.noise) is not None


def test_params_field_and_refusal_for_other_counters():
    clock = StepClock(0.0, 1.0, 64.0)
    params = ContinualSumParams(dim=1, clip_bound=1.0, epsilon=EPS, delta=DELTA, noise="gaussian", clock=clock,
                                blt_error="mean")
    assert params.build_mechanism().blt == blt_for(64, "mean")  # counter "auto" with gaussian noise is the BLT
    count = ContinualCountParams(epsilon=EPS, delta=DELTA, noise="gaussian", clock=clock, blt_error="mean",
                                 granularity=None)
    assert count.build_mechanism().blt == blt_for(64, "mean")
    assert ContinualSumParams(dim=1, clip_bound=1.0, epsilon=EPS, delta=DELTA, noise="gaussian",
                              clock=clock).build_mechanism().blt == blt_for(64)
    with pytest.raises(ValueError, match="blt_error"):  # auto with gamma noise is the k-ary tree
        ContinualSumParams(dim=1, clip_bound=1.0, epsilon=EPS, clock=clock, blt_error="mean")
    with pytest.raises(ValueError, match="blt_error"):
        make_counter("toeplitz", horizon=64, blt_error="mean", dim=1, epsilon=EPS, delta=DELTA, clip_bound=1.0,
                     noise="gaussian")


@pytest.mark.pipeline
def test_continual_stats_blt_error_flag(tmp_path, capsys):
    rng = np.random.default_rng(5)
    lines = ["stream_id,timestamp,value"] + [f"{s},{float(t)!r},{float(v)!r}" for s, t, v in
                                             zip(rng.choice(["x", "y"], 40), rng.random(40) * 50, rng.normal(size=40))]
    (tmp_path / "e.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    argv = ["--input", str(tmp_path / "e.csv"), "--output", str(out), "--start", "0", "--period", "5", "--end", "50",
            "--epsilon", "1", "--delta", "1e-6", "--noise", "gaussian", "--counter", "blt", "--blt-error", "mean"]
    assert continual_stats.main(argv) == 0
    rows = read_releases(str(out / "sum-*"))
    assert rows and all(r["meta"]["fit_error"] == "mean" for r in rows)
    assert verify_job(rows).ok
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:  # gamma noise: the counter is the k-ary tree, not a BLT
        continual_stats.main(argv[:-8] + ["--blt-error", "mean", "--output", str(tmp_path / "o2")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "blt_error" in err
