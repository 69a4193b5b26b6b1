"""ERM model releases verify with their sensitivities recomputed from public meta
(``beam_dp.verify_calibration.ErmCalibrations``): honest releases of every calibration pass; a release
whose declared sensitivity was lowered, or whose meta ``lambda``/``n_norm`` was changed, each with its
stated spend lowered to match (so the spend recomputed from its declaration agrees with it), fails."""

from __future__ import annotations

import json

import pytest

from beam_dp.core.noise_declaration import loss_of_declaration, recomputed_epsilon
from beam_dp.mechanisms.erm import HuberRegression, MultiResolutionMechanism, SlidingWindowMechanism
from beam_dp.verify import verify_job
from beam_dp.verify_calibration import Calibrations
from tests.mechanisms.erm.util import TINY
from tests.verify.test_declare_erm import GAUSS, MECHANISMS, _releases, _rows

CALIBRATION = "do not declare the noise their mechanism's public calibration gives"
SPEC = {"multires-spec": (MultiResolutionMechanism(block=4, model=TINY, lam=1.0, epsilon=0.8, calibration="spec"), 4),
        "sliding-huber-gauss": (SlidingWindowMechanism(block=2, levels=2, model=HuberRegression(n_features=1, huber=0.5),
                                                       lam=0.5, epsilon=0.8, **GAUSS), 2)}
CASES = {name: (mechanism, size) for name, mechanism, size in MECHANISMS} | SPEC
STEPS = 12  # several levels / windows: declarations with calls of several n_norm


def _job(name: str) -> list[dict]:
    mechanism, size = CASES[name]
    return _rows(mechanism, _releases(mechanism, size, steps=STEPS))


def _restated(row: dict, noise: dict, **meta) -> dict:
    """``row`` with declaration ``noise`` and ``meta`` changes, its stated spend recomputed from that
    declaration (a doctored row consistent with itself)."""
    text = json.dumps(noise)
    epsilon = recomputed_epsilon(loss_of_declaration(text), row["delta_spent"])
    return dict(row, noise=text, meta=dict(row["meta"], **meta), epsilon_spent=epsilon)


def _scaled_sensitivities(row: dict, factor: float) -> dict:
    """Every declared call's sensitivity times ``factor`` (terms and sampled accounts)."""
    noise = json.loads(row["noise"])
    noise["terms"] = [[law, s * factor, c, w] for law, s, c, w in noise.get("terms", [])]
    noise["accounts"] = [dict(a, sensitivity=a["sensitivity"] * factor) for a in noise.get("accounts", [])]
    return {k: v for k, v in noise.items() if v}


def _fails_calibration(rows: list[dict]) -> bool:
    return any(CALIBRATION in p for p in verify_job(rows).problems)


@pytest.mark.parametrize("name", sorted(CASES))
def test_honest_erm_releases_verify_with_their_sensitivities_recomputed(name):
    rows = _job(name)
    verdict = verify_job(rows)
    assert verdict.ok, verdict.problems
    checks = Calibrations()
    for r in rows:  # each row passes the family check itself (not only the job's sums)
        assert checks.problem(r["mechanism"], json.dumps(r["meta"]), r["epsilon_budget"], r["delta_budget"],
                              r["step"], r["noise"]) is None


@pytest.mark.parametrize("name", ["multires", "multires-sampled", "continual-gauss", "sliding-snapped",
                                  "multires-spec"])
@pytest.mark.parametrize("factor", [0.9, 0.5])
def test_a_lowered_declared_sensitivity_fails(name, factor):
    # 0.9: no whole n has that Δ(n); 0.5: Δ(2n), beyond the positions the release's chain covers
    rows = _job(name)
    last = rows[-1]
    doctored = _restated(last, _scaled_sensitivities(last, factor))
    assert doctored["epsilon_spent"] < last["epsilon_spent"]  # the doctoring pays: a lower stated spend
    assert _fails_calibration(rows[:-1] + [doctored])
    # the release's own call lowered too (meta sensitivity and the spend of its event)
    event = {"sensitivity": last["meta"]["sensitivity"] * factor, "epsilon": last["meta"]["epsilon"] * factor,
             "mu": last["meta"]["mu"] * factor}
    assert _fails_calibration(rows[:-1] + [_restated(last, _scaled_sensitivities(last, factor), **event)])


@pytest.mark.parametrize("name", ["multires", "continual-gauss", "sliding-sampled"])
def test_a_changed_lambda_or_n_norm_in_meta_fails(name):
    rows = _job(name)
    last = rows[-1]
    meta = last["meta"]
    # a doubled λ halves every Δ(n): the declaration and spend restated at that λ
    doubled = _restated(last, _scaled_sensitivities(last, 0.5), **{"lambda": 2 * meta["lambda"]},
                        sensitivity=meta["sensitivity"] / 2, epsilon=meta["epsilon"] / 2, mu=meta["mu"] / 2)
    assert doubled["epsilon_spent"] < last["epsilon_spent"]
    assert _fails_calibration(rows[:-1] + [doubled])
    # only the meta's λ or n_norm changed: the stated sensitivity is no longer Δ(n_norm) at that λ
    assert _fails_calibration(rows[:-1] + [dict(last, meta=dict(meta, **{"lambda": 2 * meta["lambda"]}))])
    assert _fails_calibration(rows[:-1] + [dict(last, meta=dict(meta, n_norm=2 * meta["n_norm"]))])
    # a smaller model constant (clip bound): a smaller L
    assert _fails_calibration(rows[:-1] + [dict(last, meta=dict(meta, clip_bound=meta["clip_bound"] / 2))])


def test_erm_meta_that_does_not_rebuild_the_model_fails():
    rows = _job("multires")
    broken = dict(rows[-1], meta={k: v for k, v in rows[-1]["meta"].items() if k != "lambda"})
    assert any("do not rebuild a erm_multires" in p for p in verify_job(rows[:-1] + [broken]).problems)


def test_a_mechanism_calibrated_to_a_lower_sensitivity_fails(monkeypatch):
    # a mis-calibrated mechanism: its calls scaled and charged at 0.9·Δ(n), every row consistent with
    # itself (spend = the declaration's); the verifier's own Δ(n) from the public meta catches it
    from beam_dp.mechanisms.erm import base

    true_sens = base.ERMMechanism.sens
    rows = _job("multires")
    assert verify_job(rows).ok
    monkeypatch.setattr(base.ERMMechanism, "sens", lambda self, n_norm: 0.9 * true_sens(self, n_norm))
    mis = _job("multires")
    assert all(m["epsilon_spent"] == pytest.approx(r["epsilon_spent"], rel=1e-9) for m, r in zip(mis, rows))
    assert _fails_calibration(mis)


# -- lifelong DP-SGD accounts -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def lifelong_rows():
    pytest.importorskip("torch")
    from tests.verify.test_declare_lifelong import LEARNERS, _run

    out = {}
    for name in ("naive", "bounded"):
        learner, releases = _run(LEARNERS[name])
        g = learner.guarantee
        out[name] = [dict(noise_domain="ll", composition="approx", stream=r.stream, step=r.step, mechanism=r.mechanism,
                          meta=dict(r.meta), epsilon_spent=r.epsilon_spent, delta_spent=r.delta_spent,
                          epsilon_budget=g.epsilon, delta_budget=g.delta, job_epsilon_budget=g.epsilon,
                          job_delta_budget=g.delta, purpose=r.purpose, noise=r.noise) for r in releases]
    return out


def _raised_multiplier(row: dict, factor: float, **meta) -> dict:
    """Every declared account's noise multiplier times ``factor`` (a lower recomputed spend)."""
    noise = json.loads(row["noise"])
    noise["accounts"] = [dict(a, noise_multiplier=a["noise_multiplier"] * factor) for a in noise["accounts"]]
    return _restated(row, noise, **meta)


@pytest.mark.parametrize("name", ["naive", "bounded"])
def test_lifelong_accounts_match_the_reported_noise_multipliers(lifelong_rows, name):
    rows = lifelong_rows[name]
    assert verify_job(rows).ok, verify_job(rows).problems
    last = rows[-1]
    raised = _raised_multiplier(last, 1.5)
    assert raised["epsilon_spent"] < last["epsilon_spent"]  # the doctoring pays
    assert _fails_calibration(rows[:-1] + [raised])
    # the meta's multiplier raised with it: the earlier tasks' accounts still state the reported ones,
    # the last task's account now matches no task any release reported
    meta_too = _raised_multiplier(last, 1.5, noise_multiplier=last["meta"]["noise_multiplier"] * 1.5)
    assert _fails_calibration(rows[:-1] + [meta_too])


def test_bounded_accounts_state_the_reported_memory_noise(lifelong_rows):
    rows = lifelong_rows["bounded"]
    last = rows[-1]
    noise = json.loads(last["noise"])
    noise["accounts"] = [dict(a, memory_noise_multiplier=2 * a["memory_noise_multiplier"]) for a in noise["accounts"]]
    assert _fails_calibration(rows[:-1] + [_restated(last, noise)])
