"""The DP-SGD learners' PLD accountant: against exact values, a second discretisation and RDP; its
calibration at the known value; the learners' ``"dpsgd_pld"`` declarations and the RDP option."""

import json
import math

import numpy as np
import pytest
from scipy import optimize, stats

from beam_dp.core.accounting import lifelong as acc
from beam_dp.core.accounting.lifelong import PLD_INTERVAL, dpsgd_event, epsilon_of, example_event
from beam_dp.core.calibration import analytic_gaussian_epsilon
from beam_dp.core.noise_declaration import loss_of_declaration, recomputed_epsilon
from beam_dp.mechanisms.lifelong.factory import build_learner

MNIST_Q = 32 / 60_000  # λ = 32 of 60 000 rows: one permuted-MNIST task
DELTA = 1e-5


def _one_step_delta(epsilon: float, q: float, z: float) -> float:
    """Exact δ(ε) of one Poisson(q)-subsampled Gaussian step (sensitivity 1, noise z), add/remove one: the
    hockey-stick divergences of P = (1−q)N(0, z²) + qN(1, z²) and Q = N(0, z²) in both orders, in closed
    form (the likelihood ratio P/Q = 1 − q + q·exp((2x − 1)/(2z²)) is increasing in x)."""
    e = math.exp(epsilon)
    # P over Q: the ratio exceeds e^ε for x > x1
    x1 = z * z * math.log((e - 1 + q) / q) + 0.5
    remove = (1 - q) * stats.norm.sf(x1 / z) + q * stats.norm.sf((x1 - 1) / z) - e * stats.norm.sf(x1 / z)
    add = 0.0
    if math.exp(-epsilon) > 1 - q:  # Q over P exceeds e^ε for x < x2
        x2 = z * z * math.log((math.exp(-epsilon) - 1 + q) / q) + 0.5
        add = stats.norm.cdf(x2 / z) - e * ((1 - q) * stats.norm.cdf(x2 / z) + q * stats.norm.cdf((x2 - 1) / z))
    return max(remove, add)


def _one_step_epsilon(q: float, z: float, delta: float) -> float:
    return optimize.brentq(lambda e: _one_step_delta(e, q, z) - delta, 1e-9, 60.0, xtol=1e-12)


@pytest.mark.parametrize("q,z", [(0.1, 0.8), (0.5, 1.0), (0.02, 0.6)])
def test_one_step_pld_is_an_upper_bound_within_one_grid_step_of_the_exact_value(q, z):
    """One step: the pessimistic PLD rounds each privacy loss up by less than one grid step h, so
    exact ≤ PLD ≤ exact + h (1e-9: the closed form's floating point), at h = 1e-4 and at 1e-3."""
    exact = _one_step_epsilon(q, z, DELTA)
    for h in (1e-4, 1e-3):
        pld = epsilon_of(dpsgd_event(q, z, 1), DELTA, "pld", h)
        assert exact - 1e-9 <= pld <= exact + h, (h, pld, exact)


def test_composed_gaussian_uses_match_the_analytic_gaussian():
    """K unsampled Gaussian uses (the memory stream) are one Gaussian of μ = √K/z: PLD is within one grid
    step above its exact (analytic) ε."""
    for k, z in ((100, 30.0), (20, 5.0)):
        exact = analytic_gaussian_epsilon(math.sqrt(k) / z, DELTA)
        pld = epsilon_of(dpsgd_event(1.0, z, k), DELTA, "pld")
        assert exact - 1e-9 <= pld <= exact + PLD_INTERVAL, (k, z, pld, exact)


@pytest.mark.parametrize("q,z,steps", [(MNIST_Q, 0.8, 1875), (MNIST_Q, 0.6, 600), (32 / 480, 1.2, 15)])
def test_a_coarser_grid_bounds_the_finer_one_and_rdp_bounds_both(q, z, steps):
    """Many steps: the coarser grid (1e-3) is ≥ the finer (1e-4), and they differ by at most T·h_coarse
    (each step's losses rounded up by < h); RDP on its order grid is a looser upper bound (PLD ≤ RDP)."""
    event = dpsgd_event(q, z, steps)
    fine, coarse = (epsilon_of(event, DELTA, "pld", h) for h in (1e-4, 1e-3))
    assert fine <= coarse + 1e-12 and coarse - fine <= steps * 1e-3
    assert coarse <= epsilon_of(event, DELTA, "rdp")


def test_pld_is_tight_where_rdp_is_not():
    """σ = 0.8, 1 875 steps at q = 32/60 000: RDP on the learners' grid reports ≈ 1.22, PLD ≈ 0.19 (PLD
    within 1% of its finer-grid value at 2.5e-5, which bounds the exact ε from above)."""
    event = dpsgd_event(MNIST_Q, 0.8, 1875)
    rdp, pld, finer = epsilon_of(event, DELTA, "rdp"), epsilon_of(event, DELTA, "pld"), \
        epsilon_of(event, DELTA, "pld", 2.5e-5)
    assert rdp == pytest.approx(1.22, abs=0.01) and pld == pytest.approx(0.19, abs=0.005)
    assert finer <= pld <= 1.01 * finer


def test_the_known_noise_multiplier_brackets_epsilon_one():
    """ε = 1, δ = 1e-5, 1 875 steps, q = 32/60 000: z = 0.61 spends ≤ 1 and z = 0.598·0.98 spends > 1, so the
    calibrated z (monotone ε) lies within 2% of 0.598 and ≤ 0.61 (the calibration itself: the slow test)."""
    assert epsilon_of(dpsgd_event(MNIST_Q, 0.61, 1875), DELTA, "pld") <= 1.0
    assert epsilon_of(dpsgd_event(MNIST_Q, 0.598 * 0.98, 1875), DELTA, "pld") > 1.0


@pytest.mark.slow
def test_calibration_at_the_known_value():
    """The PLD calibration lands on the grid, within 2% of 0.598 (≤ 0.61), spends ≤ 1 and is tight
    (0.1% less noise spends more than 1); the RDP calibration needs ≥ 1.3× the noise."""
    acc.dpsgd_noise_multiplier.cache_clear()
    z = acc.dpsgd_noise_multiplier(MNIST_Q, 1875, 1.0, DELTA, accountant="pld")
    assert abs(z - 0.598) <= 0.02 * 0.598 and z <= 0.61
    assert z / acc.PLD_Z_GRID == pytest.approx(round(z / acc.PLD_Z_GRID), abs=1e-6)
    assert epsilon_of(dpsgd_event(MNIST_Q, z, 1875), DELTA, "pld") <= 1.0
    assert epsilon_of(dpsgd_event(MNIST_Q, z * 0.999, 1875), DELTA, "pld") > 1.0
    assert acc.dpsgd_noise_multiplier(MNIST_Q, 1875, 1.0, DELTA, accountant="rdp") >= 1.3 * z


def test_calibration_stays_within_the_target_and_is_tight():
    """A short task with its K memory uses (the bounded learner's event): the calibrated z spends ≤ ε under
    PLD, 0.01% less noise spends more, and z is a multiple of the grid."""
    event = lambda v: example_event(32 / 480, v, 6, 20.0, 10)  # noqa: E731
    z = acc.calibrate_noise_multiplier(event, 1.0, DELTA, "pld")
    assert epsilon_of(event(z), DELTA, "pld") <= 1.0 < epsilon_of(event(z * (1 - 1e-4)), DELTA, "pld")
    assert z / acc.PLD_Z_GRID == pytest.approx(round(z / acc.PLD_Z_GRID), abs=1e-6)
    assert z < acc.calibrate_noise_multiplier(event, 1.0, DELTA, "rdp")


@pytest.mark.parametrize("bad", [
    dict(value_discretization_interval=0.0), dict(value_discretization_interval=1e-9),
    dict(value_discretization_interval=2.0), dict(noise_multiplier=0.0), dict(steps=2.5), {"delta": 1.0}])
def test_malformed_pld_accounts_are_refused(bad):
    params = dict(kind="dpsgd_pld", sampling_rate=0.5, noise_multiplier=1.0, steps=3, delta=1e-5,
                  value_discretization_interval=1e-4)
    with pytest.raises(ValueError):
        loss_of_declaration(json.dumps({"terms": [], "accounts": [{**params, **bad}]}))
    missing = {k: v for k, v in params.items() if k != "value_discretization_interval"}
    with pytest.raises(ValueError):
        loss_of_declaration(json.dumps({"terms": [], "accounts": [missing]}))


def test_unknown_accountant_is_refused():
    from beam_dp.mechanisms.lifelong import BoundedAGEMConfig

    with pytest.raises(ValueError, match="accountant"):
        BoundedAGEMConfig(input_dim=4, n_classes=2, task_size=30, accountant="moments")
    with pytest.raises(ValueError, match="accountant"):
        epsilon_of(dpsgd_event(0.5, 1.0, 3), DELTA, "moments")


# -- the learners -------------------------------------------------------------------------------------
TASKS = ("a", "b", "c")


def _tiny(**overrides) -> dict:
    """d = 4, two classes, 3 steps per task: seconds of training; one public task size (one calibration)."""
    kw = dict(input_dim=4, n_classes=2, hidden=4, g_layers=(4,), batch_size=8, task_ids=TASKS, device="cpu",
              steps_per_task=3, task_size=40, delta=1e-5)
    kw.update(overrides)
    return kw


def _run(config):
    from beam_dp.core.noise import NoiseSource
    from beam_dp.mechanisms.lifelong import TaskData
    from tests.conftest import TEST_KEY

    pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    learner, noise, releases = build_learner(config), NoiseSource(TEST_KEY), []
    state = learner.init_state("s")
    for t in TASKS:
        state, out = learner.step(state, TaskData(t, rng.uniform(-1, 1, (40, 4)), rng.integers(0, 2, 40)), noise)
        releases += out
    return learner, releases


def _rows(releases, guarantee):
    return [dict(noise_domain="ll", composition="approx", stream=r.stream, step=r.step, mechanism=r.mechanism,
                 meta="", epsilon_spent=r.epsilon_spent, delta_spent=r.delta_spent,
                 epsilon_budget=guarantee.epsilon, delta_budget=guarantee.delta,
                 job_epsilon_budget=guarantee.epsilon, job_delta_budget=guarantee.delta, purpose=r.purpose,
                 noise=r.noise) for r in releases]


@pytest.fixture(scope="module")
def pld_runs():
    from beam_dp.mechanisms.lifelong import BoundedAGEMConfig, NaiveGaussianConfig

    return {"bounded": _run(BoundedAGEMConfig(**_tiny(), epsilon=1.0, memory_uses=4)),
            "naive": _run(NaiveGaussianConfig(**_tiny(), epsilon=50.0, num_tasks=3, noise_multiplier=1.3))}


@pytest.mark.parametrize("name", ["bounded", "naive"])
def test_pld_is_the_default_and_releases_declare_it_with_its_discretisation(pld_runs, name):
    """Every release declares ``"dpsgd_pld"`` accounts naming the interval; the verifier recomputes
    ``epsilon_spent`` from them (the same memoised function: equal to 1e-12) and accepts the job."""
    from beam_dp.verify import verify_job

    learner, releases = pld_runs[name]
    assert learner.config.accountant == "pld"
    for r in releases:
        accounts = json.loads(r.noise)["accounts"]
        assert {a["kind"] for a in accounts} == {"dpsgd_pld"}
        assert all(a["value_discretization_interval"] == PLD_INTERVAL for a in accounts)
        assert recomputed_epsilon(loss_of_declaration(r.noise), r.delta_spent) == pytest.approx(
            r.epsilon_spent, rel=1e-12)
        assert "PLD" in r.meta["accountant"] and f"{PLD_INTERVAL:g}" in r.meta["accountant"]
    assert verify_job(_rows(releases, learner.guarantee), strict=True).ok


def test_bounded_pld_learner_spends_at_most_its_target_with_less_noise_than_rdp(pld_runs):
    """The PLD learner's spend is ≤ ε (and within 0.1% of it: a tight calibration); an RDP learner of the
    same config declares ``"dpsgd"`` and needs more noise for the same ε, on the task and the memory."""
    from beam_dp.mechanisms.lifelong import BoundedAGEMConfig

    learner, releases = pld_runs["bounded"]
    assert all(0.999 <= r.epsilon_spent <= 1.0 for r in releases)
    rdp = build_learner(BoundedAGEMConfig(**_tiny(), epsilon=1.0, memory_uses=4, accountant="rdp"))
    account = rdp._task_account(8 / 40, 3)
    assert account[0] == "dpsgd" and "RDP" in acc.accountant_label("rdp")
    assert account[1]["noise_multiplier"] > releases[-1].meta["noise_multiplier"]
    assert rdp.memory_noise_multiplier > learner.memory_noise_multiplier


def test_a_declared_smaller_noise_or_a_lower_stated_spend_fails_verification(pld_runs):
    """Mis-stated rows are caught: z lowered 10% in the declaration, or the stated spend lowered 10%."""
    from beam_dp.verify import verify_job

    learner, releases = pld_runs["bounded"]
    rows = _rows(releases, learner.guarantee)

    def doctor(text):
        data = json.loads(text)
        data["accounts"][0]["noise_multiplier"] *= 0.9
        return json.dumps(data)

    for bad in ([dict(row, noise=doctor(row["noise"])) for row in rows],
                [dict(row, epsilon_spent=0.9 * row["epsilon_spent"]) for row in rows]):
        report = verify_job(bad)
        assert any("below the spend recomputed" in p for p in report.problems), report.problems
