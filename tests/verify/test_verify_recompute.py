"""The verifier rebuilds each family's calibration from the public parameters its rows declare (the
budget and the meta) and never takes a stated noise scale or spend on trust: an honest run verifies;
a row whose noise scale was halved (spend kept), whose spend was lowered (scale kept), or one of whose
public parameters was changed fails with a problem line naming the row and the cause. Growing
databases (PMWG, BBScheduler, BBImprover), incremental regression (PRIVINCREG₁/₂, PRIVINCERM), L2DP-ML
and the ERM model releases' noise scales: the rows are the mechanisms' own releases on small settings
(those of tests/verify/test_declare_*.py), and each family's job on its demo data verifies strictly;
outputs of the previous release still verify, with a note where a parameter was not declared yet."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from beam_dp.core.accounting.erm import sampled_k_norm_loss
from beam_dp.core.noise import NoiseSource
from beam_dp.mechanisms.erm import ContinualReleaseMechanism, MultiResolutionMechanism, SlidingWindowMechanism
from beam_dp.mechanisms.growing_db.base import GrowingBlock, Query
from beam_dp.mechanisms.growing_db.pmwg import PMWG
from beam_dp.mechanisms.growing_db.schedulers import BBImprover, BBScheduler, LaplaceHistogram
from beam_dp.mechanisms.online.regression import PrivIncERM, make_incremental_regression
from beam_dp.verify import verify_job
from beam_dp.verify_calibration import RECOMPUTED_FAMILIES
from tests.conftest import TEST_KEY
from tests.mechanisms.erm.util import TINY, blocks

PREVIOUS = Path(__file__).resolve().parents[1] / "fixtures" / "previous_release" / "jobs"
N, n = 4, 30
CALIBRATION = "do not declare the noise their mechanism's public calibration gives"
BELOW = "below the spend recomputed"


def _growing_db():
    yield "pmwg", lambda: PMWG(universe_size=N, n=n, epsilon=2.0, alpha=0.3)
    yield "pmwg-cdp", lambda: PMWG(universe_size=N, n=n, epsilon=4.0, alpha=0.3, delta=1e-6)
    yield "bbscheduler", lambda: BBScheduler(LaplaceHistogram(N), universe_size=N, n=n, epsilon=1.0)
    yield "bbscheduler-cdp", lambda: BBScheduler(LaplaceHistogram(N), universe_size=N, n=n, epsilon=1.0, delta=1e-6)
    yield "bbimprover", lambda: BBImprover(LaplaceHistogram(N), universe_size=N, n=n, epsilon=1.0, delta=1e-6)


def _regression():
    yield "privincreg1", lambda: make_incremental_regression("privincreg1", dim=3, epsilon=1.0, delta=1e-6, horizon=12)
    yield "privincreg2", lambda: make_incremental_regression("privincreg2", dim=3, m=2, epsilon=1.0, delta=1e-6)
    yield "privincerm", lambda: PrivIncERM(dim=3, epsilon=1.0, delta=1e-6, horizon=12, tau=3, iterations=20)
    yield "privincerm-a4", lambda: PrivIncERM(dim=3, epsilon=1.0, delta=1e-6, horizon=12, tau=4,
                                              solver=lambda X, y, theta0, *args: theta0)


GROWING_DB, REGRESSION = dict(_growing_db()), dict(_regression())


def _growing_db_releases(mech, steps: int = 60):
    """Arrivals concentrated on cell 0, a point query per arrival, a snapshot every 10 (hard queries)."""
    noise, rng = NoiseSource(TEST_KEY), np.random.default_rng(23)
    state = mech.init_state("s")
    state, out = mech.step(state, GrowingBlock(np.zeros(n, np.int64), (Query(n, "q0", np.eye(N)[0]),)), noise)
    for k in range(1, steps):
        element = np.array([0 if rng.random() < 0.7 else rng.integers(1, N)], np.int64)
        state, releases = mech.step(state, GrowingBlock(element, (Query(state.t + 1, f"q{k}", np.eye(N)[k % N]),)),
                                    noise)
        out += releases
        if k % 10 == 0:
            out.append(mech.snapshot(state))
    return out


def _regression_releases(mech, steps: int = 12):
    rng = np.random.default_rng(0)
    blocks = [[(rng.uniform(-0.6, 0.6, 3), float(rng.uniform(-1, 1))) for _ in range(2)] for _ in range(steps)]
    return mech.run("s", blocks, NoiseSource(TEST_KEY))


def _rows(releases, epsilon: float, delta: float, domain: str) -> list[dict]:
    composition = "pure" if delta == 0 else "approx"
    return [dict(stream=r.stream, step=r.step, mechanism=r.mechanism, meta=json.dumps(dict(r.meta)),
                 epsilon_spent=r.epsilon_spent, delta_spent=r.delta_spent, epsilon_budget=epsilon,
                 delta_budget=delta, noise_domain=domain, composition=composition, purpose=r.purpose, noise=r.noise,
                 job_epsilon_budget=epsilon, job_delta_budget=delta) for r in releases]


def _doctor(rows: list[dict], index: int, *, noise=None, meta=None, **fields) -> list[dict]:
    """``rows`` with row ``index`` changed: ``noise``/``meta`` functions of the parsed JSON, other fields set."""
    row = dict(rows[index], **fields)
    for name, change in (("noise", noise), ("meta", meta)):
        if change is not None:
            parsed = json.loads(row[name])
            change(parsed)
            row[name] = json.dumps(parsed, sort_keys=True)
    return rows[:index] + [row] + rows[index + 1:]


def _fails_naming(rows: list[dict], index: int, cause: str, also: str | None = None) -> None:
    """The verifier fails ``rows`` with one calibration problem line naming row ``index`` and ``cause``
    (and, with ``also``, a line naming the row and ``also``)."""
    problems = verify_job(rows, strict=True).problems
    where = f"release (stream {rows[index]['stream']!r}, step {rows[index]['step']})"
    lines = [p for p in problems if CALIBRATION in p and where in p and cause in p]
    assert len(lines) == 1, problems
    if also is not None:
        assert any(also in p and where in p for p in problems), problems


def _honest(rows: list[dict]) -> None:
    verdict = verify_job(rows, strict=True)
    assert verdict.ok and not verdict.notes, verdict.describe()


def _account(row: dict) -> dict:
    return json.loads(row["noise"])["accounts"][0]


# -- growing databases -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def growing_db_rows():
    out = {}
    for case, make in GROWING_DB.items():
        mech = make()
        out[case] = _rows(_growing_db_releases(mech), mech.guarantee.epsilon, mech.guarantee.delta, "queries")
    return out


@pytest.mark.parametrize("case", list(GROWING_DB))
def test_an_honest_growing_db_run_verifies_with_every_account_recomputed(case, growing_db_rows):
    rows = growing_db_rows[case]
    plan = {"pmwg": "xi_n_plan", "bbscheduler": "gamma_plan"}.get(case.split("-")[0])
    assert plan is None or all(json.loads(r["meta"])[plan] is not None for r in rows)  # declared on every row
    _honest(rows)


def _scaled_row(case: str, rows: list[dict]) -> int:
    """The row whose noise scale is doctored: PMWG's last answer (ξ_n), a scheduler's last run (ε_run)."""
    runs = [i for i, r in enumerate(rows) if r["mechanism"].endswith("_run")]
    return len(rows) - 1 if case.startswith("pmwg") else runs[-1]


@pytest.mark.parametrize("case", list(GROWING_DB))
def test_a_growing_db_row_with_half_its_noise_and_its_spend_kept_fails(case, growing_db_rows):
    rows = growing_db_rows[case]
    i = _scaled_row(case, rows)
    if case.startswith("pmwg"):
        doctored = _doctor(rows, i, noise=lambda d: d["accounts"][0].update(xi_n=d["accounts"][0]["xi_n"] / 2))
        _fails_naming(doctored, i, "it declares noise xi_n", also=BELOW)
    else:  # the black box's noise scale is 2/ε_run: half of it, twice ε_run
        doctored = _doctor(rows, i, meta=lambda m: m.update(epsilon_run=2 * m["epsilon_run"]))
        _fails_naming(doctored, i, "states epsilon_run")


@pytest.mark.parametrize("case", list(GROWING_DB))
def test_a_growing_db_row_with_its_spend_lowered_and_its_noise_kept_fails(case, growing_db_rows):
    rows = growing_db_rows[case]
    i = len(rows) - 1
    doctored = _doctor(rows, i, epsilon_spent=rows[i]["epsilon_spent"] / 2)
    problems = verify_job(doctored, strict=True).problems
    assert len(problems) == 1 and BELOW in problems[0] and f"step {rows[i]['step']})" in problems[0], problems


def _changed_parameter(case: str):
    """A public parameter changed so that the recompute differs, and the cause the verifier names."""
    if case.startswith("pmwg"):
        return dict(meta=lambda m: m.update(xi_n_plan=m["xi_n_plan"] + 1)), "PMWG's plan of 17 segments"
    if case.startswith("bbscheduler"):
        return dict(meta=lambda m: m["gamma_plan"].update(beta=m["gamma_plan"]["beta"] / 2)), "it declares gamma"
    return dict(noise=lambda d: d["accounts"][0].update(t=d["accounts"][0]["t"] - 1)), "charged at size t"


@pytest.mark.parametrize("case", list(GROWING_DB))
def test_a_growing_db_row_with_a_public_parameter_changed_fails(case, growing_db_rows):
    rows = growing_db_rows[case]
    i = len(rows) - 1
    change, cause = _changed_parameter(case)
    _fails_naming(_doctor(rows, i, **change), i, cause)


def test_a_growing_db_budget_the_account_does_not_carry_fails(growing_db_rows):
    rows = growing_db_rows["bbscheduler"]
    i = len(rows) - 1  # a smaller epsilon in the account: the same epochs cost less
    doctored = _doctor(rows, i, noise=lambda d: d["accounts"][0].update(epsilon=0.5))
    _fails_naming(doctored, i, "its account states epsilon 0.5, its budget's is 1.0")


# -- incremental regression --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def regression_rows():
    return {case: _rows(_regression_releases(make()), 1.0, 1e-6, "regression") for case, make in REGRESSION.items()}


@pytest.mark.parametrize("case", list(REGRESSION))
def test_an_honest_regression_run_verifies_with_its_calibration_rebuilt(case, regression_rows):
    _honest(regression_rows[case])


def _halve_scale(declared: dict) -> None:
    if declared["terms"]:
        declared["terms"] = [[law, s, c / 2, w] for law, s, c, w in declared["terms"]]
    else:  # Thm A.4: the per-call epsilon of a call whose noise was halved doubles
        declared["accounts"][0]["epsilon"] *= 2


@pytest.mark.parametrize("case", list(REGRESSION))
def test_a_regression_row_with_half_its_noise_and_its_spend_kept_fails(case, regression_rows):
    rows = regression_rows[case]
    i = len(rows) - 1
    cause = "Thm A.4 of its budget" if case == "privincerm-a4" else "it declares [("
    _fails_naming(_doctor(rows, i, noise=_halve_scale), i, cause, also=BELOW)


def _last_row_with_its_spend_halved_fails(rows: list[dict]) -> None:
    """The last row's stated spend halved, its noise kept: one problem, naming that row's step."""
    i = len(rows) - 1
    problems = verify_job(_doctor(rows, i, epsilon_spent=rows[i]["epsilon_spent"] / 2), strict=True).problems
    assert len(problems) == 1 and BELOW in problems[0] and f"step {rows[i]['step']})" in problems[0], problems


@pytest.mark.parametrize("case", list(REGRESSION))
def test_a_regression_row_with_its_spend_lowered_and_its_noise_kept_fails(case, regression_rows):
    _last_row_with_its_spend_halved_fails(regression_rows[case])


@pytest.mark.parametrize("case", list(REGRESSION))
def test_a_regression_row_with_a_public_parameter_changed_fails(case, regression_rows):
    rows = regression_rows[case]
    i = len(rows) - 2
    if case.startswith("privincreg"):  # a longer horizon: deeper trees, another declaration
        meta, cause = (lambda m: m.update(horizon=(m["horizon"] or 6) * 4)), "the two trees of its budget and meta"
    else:  # fewer reruns planned: a larger per-call budget
        meta, cause = (lambda m: m.update(horizon=m["horizon"] // 2)), "calls of its budget get"
    _fails_naming(_doctor(rows, i, meta=meta), i, cause)


# -- ERM model releases -----------------------------------------------------------------------------
def _erm():
    common = dict(model=TINY, lam=1.0, epsilon=0.8)
    yield "multires", lambda: MultiResolutionMechanism(block=4, **common), 4, ("block", 8)
    yield "continual-gauss", lambda: ContinualReleaseMechanism(update=2, base=4, base_fraction=0.3, noise="gaussian",
                                                               delta=1e-6, **common), 2, ("base_fraction", 0.4)
    yield "sliding-sampled", lambda: SlidingWindowMechanism(block=2, levels=3, sampling=True, **common), 2, ("block", 4)


ERM = {name: rest for name, *rest in _erm()}


@pytest.fixture(scope="module")
def erm_rows():
    out = {}
    for case, (make, size, _) in ERM.items():
        mech, noise = make(), NoiseSource(TEST_KEY)
        state, releases = mech.init_state("s"), []
        for block in blocks(16, size):
            state, more = mech.step(state, block, noise)
            releases += more
        out[case] = _rows(releases, mech.guarantee.epsilon, mech.guarantee.delta, "models")
    return out


@pytest.mark.parametrize("case", list(ERM))
def test_an_honest_erm_run_verifies_with_every_calls_noise_rebuilt(case, erm_rows):
    assert all("schedule" in json.loads(r["meta"]) for r in erm_rows[case])
    _honest(erm_rows[case])


def _half_noise(meta: dict) -> None:
    """Every call the release logs at half its noise scale, its own cost restated to match (a consistent
    forger: the call checks pass, only the schedule tells)."""
    for call in [meta, *meta["events"]]:
        call["noise_scale"] /= 2
        if call["law"] == "gamma":
            call["epsilon"] = sampled_k_norm_loss(sensitivity=call["sensitivity"], scale=call["noise_scale"],
                                                  p=call["sample_p"])[0]
        else:
            call["mu"] = call["sensitivity"] / call["noise_scale"]


@pytest.mark.parametrize("case", list(ERM))
def test_an_erm_row_with_half_its_noise_and_its_spend_kept_fails(case, erm_rows):
    rows = erm_rows[case]
    i = len(rows) - 1
    _fails_naming(_doctor(rows, i, meta=_half_noise), i, "schedule at its budget gives")


@pytest.mark.parametrize("case", list(ERM))
def test_an_erm_row_with_its_spend_lowered_and_its_noise_kept_fails(case, erm_rows):
    _last_row_with_its_spend_halved_fails(erm_rows[case])


@pytest.mark.parametrize("case", list(ERM))
def test_an_erm_row_with_a_public_parameter_changed_fails(case, erm_rows):
    rows = erm_rows[case]
    i = len(rows) - 1
    name, value = ERM[case][2]
    _fails_naming(_doctor(rows, i, meta=lambda m: m["schedule"].update({name: value})), i,
                  "schedule at its budget gives")


# -- L2DP-ML -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def l2dp_rows():
    pytest.importorskip("torch")
    from beam_dp.mechanisms.lifelong import L2DPConfig, TaskData, build_learner

    config = L2DPConfig(input_dim=4, n_classes=2, hidden=4, g_layers=(4,), batch_size=8, epochs=1, task_ids=("a", "b"),
                        device="cpu", steps_per_task=2, epsilon=0.7)
    learner, noise, rng = build_learner(config), NoiseSource(TEST_KEY), np.random.default_rng(5)
    state, releases = learner.init_state("s"), []
    for i, task in enumerate(("a", "b")):
        state, out = learner.step(state, TaskData(task, rng.uniform(-1, 1, (24 + 8 * i, 4)),
                                                  rng.integers(0, 2, 24 + 8 * i)), noise)
        releases += out
    return _rows(releases, 0.7, 0.0, "lifelong")


def test_an_honest_l2dp_run_verifies_with_its_split_rebuilt(l2dp_rows):
    assert len(l2dp_rows) >= 2
    _honest(l2dp_rows)


def test_an_l2dp_row_with_half_its_noise_and_its_spend_kept_fails(l2dp_rows):
    i = len(l2dp_rows) - 1
    doctored = _doctor(l2dp_rows, i, noise=lambda d: d["accounts"][0].update(
        scale_chi3=d["accounts"][0]["scale_chi3"] / 2))
    _fails_naming(doctored, i, "it declares scale_chi3", also=BELOW)


def test_an_l2dp_row_with_its_spend_lowered_and_its_noise_kept_fails(l2dp_rows):
    i = len(l2dp_rows) - 1
    problems = verify_job(_doctor(l2dp_rows, i, epsilon_spent=l2dp_rows[i]["epsilon_spent"] / 2), strict=True).problems
    assert len(problems) == 1 and BELOW in problems[0], problems


def test_an_l2dp_row_with_a_public_parameter_changed_fails(l2dp_rows):
    i = len(l2dp_rows) - 1  # another split of the budget between the two functional mechanisms
    doctored = _doctor(l2dp_rows, i, meta=lambda m: m.update(rho_s=m["rho_s"] / 2))
    _fails_naming(doctored, i, "the split of its budget and meta gives")


# -- outputs written before the parameters were declared -----------------------------------------------
@pytest.mark.parametrize("family, case, dropped", [("growing_db", "pmwg", "xi_n_plan"),
                                                  ("growing_db", "bbscheduler", "gamma_plan"),
                                                  ("erm", "multires", "schedule")])
def test_rows_written_before_a_parameter_was_declared_verify_as_before_with_a_note(family, case, dropped,
                                                                                   growing_db_rows, erm_rows):
    written = {"growing_db": growing_db_rows, "erm": erm_rows}[family][case]
    rows = [dict(r, meta=json.dumps({k: v for k, v in json.loads(r["meta"]).items() if k != dropped}))
            for r in written]
    verdict = verify_job(rows, strict=True)
    assert verdict.ok, verdict.problems
    assert any(f"not recomputed: written before {dropped} was declared" in note for note in verdict.notes)
    i = len(rows) - 1  # the declaration checks still hold
    assert not verify_job(_doctor(rows, i, epsilon_spent=rows[i]["epsilon_spent"] / 2), strict=True).ok


@pytest.mark.parametrize("job, lacking", [("growing_db_pmwg", "xi_n_plan"), ("growing_db_bbscheduler", "gamma_plan"),
                                          ("erm_sampled", "schedule"), ("privincerm", "lipschitz and iterations"),
                                          ("lifelong_l2dp", "rho_s")])
def test_the_previous_releases_outputs_verify_with_a_note_where_a_parameter_was_not_declared(job, lacking, capsys):
    from beam_dp.verify import main

    assert main([str(PREVIOUS / job), "--strict"]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("verified: within the job's total")
    assert "not recomputed: written before " + lacking in out, out


@pytest.mark.pipeline
@pytest.mark.parametrize("job", ["growing_db_pmwg", "growing_db_bbscheduler", "growing_db_bbimprover", "erm_sampled",
                                 "privincerm", "lifelong_l2dp"])
def test_an_honest_job_output_verifies_strictly_with_every_calibration_recomputed(job, tmp_path):
    """Today's job on the previous release's small demo settings: strict, and no note (nothing left
    unrecomputed)."""
    from tests.fixtures.previous_release.make_fixtures import JOBS
    from tests.verify.strict_jobs import run_and_verify_strictly

    module, args = JOBS[job]
    run_and_verify_strictly(module.removeprefix("pipelines."), args, tmp_path / "out")


def test_every_family_of_the_issue_is_recomputed():
    names = {*(f"{m}{s}" for m in ("pmwg", "bbscheduler", "bbimprover") for s in ("", "_run", "_synthetic")),
             "privincreg1", "privincreg2", "privincerm", "l2dp_ml"}
    assert names <= RECOMPUTED_FAMILIES
