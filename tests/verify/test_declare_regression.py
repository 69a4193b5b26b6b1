"""Incremental regression declares its spend on every path (issue 23 item 2): PRIVINCERM's reruns (the
Thm A.4 account ``"advanced_composition"``, or the default solver's Gaussian iterations where their exact
composition is smaller), PRIVINCREG₂'s projected trees and the torch backend's trees; the verifier
recomputes each release's ``epsilon_spent`` from its row, and rows stating less fail."""

import csv
import json

import numpy as np
import pytest

from beam_dp.core.accounting.regression import advanced_composition
from beam_dp.core.noise import NoiseSource
from beam_dp.core.noise_declaration import loss_of_declaration, recomputed_epsilon
from beam_dp.mechanisms.online.regression import PrivIncERM, make_incremental_regression
from beam_dp.verify import verify_job
from tests.verify.strict_jobs import run_and_verify_strictly

KEY = bytes(range(32))
DIM, T = 3, 12
# Stated and recomputed spends: the same function on the same parameters (A.4; JSON floats round-trip
# exactly), or the same Gaussian mu^2 summed in another order (~1e-16) through the analytic-Gaussian
# bisection (relative 1e-12); 1e-9 is far above both and far below a 10% under-report.
REL = 1e-9


def _blocks(n=T, seed=0):
    rng = np.random.default_rng(seed)
    return [[(rng.uniform(-0.6, 0.6, DIM), float(rng.uniform(-1, 1))) for _ in range(2)] for _ in range(n)]


def _run(mechanism, n=T):
    return mechanism.run("s", _blocks(n), NoiseSource(KEY))


def _first_theta(X, y, theta0, epsilon, delta, noise, stream, call):
    """A stand-in batch solver (it releases its start): the custom-solver path declares Thm A.4 only."""
    return theta0


def _mechanisms():
    yield "erm-default", PrivIncERM(dim=DIM, epsilon=1.0, delta=1e-6, horizon=T, tau=3, iterations=20)
    yield "erm-custom", PrivIncERM(dim=DIM, epsilon=1.0, delta=1e-6, horizon=T, tau=4, solver=_first_theta)
    yield "reg2", make_incremental_regression("privincreg2", dim=DIM, m=2, epsilon=1.0, delta=1e-6, horizon=T)
    yield "reg1-torch", make_incremental_regression("privincreg1", dim=DIM, epsilon=1.0, delta=1e-6, horizon=T,
                                                    backend="torch")
    yield "reg2-torch-hybrid", make_incremental_regression("privincreg2", dim=DIM, m=2, epsilon=1.0, delta=1e-6,
                                                           horizon=T, backend="torch", calibration="analytic")


def _built(name):
    if "torch" in name:
        pytest.importorskip("torch")
    return dict(_mechanisms())[name]


NAMES = [name for name, _ in _mechanisms()]


def _rows(releases, epsilon=1.0, delta=1e-6):
    return [dict(noise_domain="reg", composition="approx", stream=r.stream, step=r.step, mechanism=r.mechanism,
                 meta="", epsilon_spent=r.epsilon_spent, delta_spent=r.delta_spent, epsilon_budget=epsilon,
                 delta_budget=delta, job_epsilon_budget=epsilon, job_delta_budget=delta, purpose=r.purpose,
                 noise=r.noise) for r in releases]


@pytest.mark.parametrize("name", NAMES)
def test_every_release_declares_what_recomputes_its_spend(name):
    mechanism = _built(name)
    releases = _run(mechanism)
    assert len(releases) == T
    for r in releases:
        assert r.noise, (name, r.step)
        recomputed = recomputed_epsilon(loss_of_declaration(r.noise), r.delta_spent)
        if name.startswith("erm"):  # PRIVINCERM states exactly the declared loss
            assert recomputed == pytest.approx(r.epsilon_spent, rel=REL, abs=1e-300), (name, r.step)
        else:  # the trees' Gaussians composed exactly: at most the stated sum of the two trees' spends
            assert 0.5 * r.epsilon_spent < recomputed <= r.epsilon_spent * (1 + REL), (name, r.step)
    assert verify_job(_rows(releases), strict=True).ok


def test_privincerm_declares_a4_before_its_first_call_and_for_a_custom_solver():
    """Before the first call: the A.4 account with k = 0 (spend 0). A custom solver: A.4 with the calls so
    far, the per-call (ε′, δ′) and δ* = δ/2, exactly the mechanism's spend."""
    mechanism = _built("erm-custom")
    releases = _run(mechanism)
    for r in releases:
        (a4,) = json.loads(r.noise)["accounts"]
        calls = r.step // 4
        assert a4 == {"kind": "advanced_composition", "k": calls, "epsilon": mechanism.epsilon_call,
                      "delta": mechanism.delta_call, "delta_star": 0.5e-6}
        assert (r.epsilon_spent, r.delta_spent) == advanced_composition(calls, mechanism.epsilon_call,
                                                                        mechanism.delta_call, 0.5e-6)
    default = _run(_built("erm-default"))
    assert json.loads(default[0].noise)["accounts"][0]["k"] == 0 and default[0].epsilon_spent == 0.0
    # after calls: the solver's 2L-sensitive Gaussian sums, K = 20 per call
    terms = json.loads(default[-1].noise)["terms"]
    assert [(law, weight) for law, _, _, weight in terms] == [("gaussian", 4 * 20)]


@pytest.mark.parametrize("name", ["erm-default", "erm-custom", "reg2", "reg1-torch"])
def test_a_row_stating_less_than_its_declaration_fails(name):
    """Epsilon lowered (PRIVINCERM: 10%; PRIVINCREG states the two trees' spends added, above their exact
    composition that the declaration recomputes but less than twice it: to 45%), a declared noise made
    smaller (sigma lowered, more calls) or stripped: flagged."""
    rows = _rows(_run(_built(name)))[4:]  # after a PRIVINCERM call
    factor = 0.9 if name.startswith("erm") else 0.45
    lowered = verify_job([dict(row, epsilon_spent=factor * row["epsilon_spent"]) for row in rows])
    assert any("below the spend recomputed" in p for p in lowered.problems), lowered.problems

    def doctor(text):
        data = json.loads(text)
        for term in data["terms"]:
            term[2] *= 0.5  # half the sigma: twice mu, more than twice the epsilon (above PRIVINCREG's sum)
        for account in data.get("accounts", ()):
            account["k"] += 2
        return json.dumps(data)

    doctored = verify_job([dict(row, noise=doctor(row["noise"])) for row in rows])
    assert any("below the spend recomputed" in p for p in doctored.problems), doctored.problems
    stripped = verify_job([dict(row, noise="") for row in rows], strict=False)
    assert any("lack the noise declaration" in p for p in stripped.problems), stripped.problems


def test_torch_and_numpy_declare_the_same_noise():
    """The torch trees are the numpy trees' noise on a device: the same declaration text per release."""
    pytest.importorskip("torch")
    kw = dict(dim=DIM, epsilon=1.0, delta=1e-6, horizon=T)
    numpy_rows = _run(make_incremental_regression("privincreg1", **kw))
    torch_rows = _run(make_incremental_regression("privincreg1", backend="torch", **kw))
    assert [r.noise for r in torch_rows] == [r.noise for r in numpy_rows]


@pytest.mark.parametrize("params", [dict(k=1.5, epsilon=0.1, delta=1e-7, delta_star=1e-7),
                                    dict(k=2, epsilon=1.5, delta=1e-7, delta_star=1e-7),
                                    dict(k=2, epsilon=0.1, delta=1e-7, delta_star=0.0)])
def test_malformed_a4_accounts_are_refused(params):
    with pytest.raises(ValueError):
        loss_of_declaration(json.dumps({"terms": [], "accounts": [{"kind": "advanced_composition", **params}]}))


@pytest.mark.pipeline
@pytest.mark.parametrize("algorithm", ["privincerm", "privincreg1", "privincreg2"])
def test_the_regression_job_verifies_strictly(algorithm, tmp_path):
    """``pipelines.online_learning --learner regression`` end to end on a tiny input (one stream, 10 steps of
    2 records): every release declares, so ``python -m beam_dp.verify --strict`` passes."""
    rng = np.random.default_rng(0)
    with open(tmp_path / "records.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["stream_id", "x_0", "x_1", "x_2", "label"])
        for x in rng.uniform(-0.5, 0.5, (20, 3)).round(4):
            out.writerow(["s", *x, round(float(x.sum()), 4)])
    extra = {"privincerm": ["--iterations", "20"], "privincreg2": ["--m", "2"]}.get(algorithm, [])
    run_and_verify_strictly("online_learning", [
        "--learner", "regression", "--algorithm", algorithm, "--input", str(tmp_path / "records.csv"), "--dim", "3",
        "--horizon", "10", "--block-size", "2", *extra], tmp_path / "out")
