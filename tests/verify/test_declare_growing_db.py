"""Growing databases declare their spend (issue 23, item 2): every PMWG, BBScheduler and BBImprover release
(answers, scheduler runs, synthetic histograms) carries an account whose registered function, the one the
mechanism reports its spend with, recomputes ``epsilon_spent`` from public parameters; the declared
parameters are the mechanism's own (an independent ledger agrees); a doctored row fails the verifier."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from beam_dp.core.accounting.growing_db import (
    bbimprover_epsilon,
    bbimprover_spend,
    bbscheduler_spend,
    cdp_epsilon,
    pmwg_spend,
)
from beam_dp.core.noise import NoiseSource
from beam_dp.core.noise_declaration import loss_of_declaration, recomputed_epsilon
from beam_dp.mechanisms.growing_db.base import GrowingBlock, Query
from beam_dp.mechanisms.growing_db.pmwg import PMWG
from beam_dp.mechanisms.growing_db.schedulers import BBImprover, BBScheduler, LaplaceHistogram
from beam_dp.verify import DECLARING_MECHANISMS, verify_job
from tests.conftest import TEST_KEY

ROOT = Path(__file__).resolve().parents[2]
N, n = 4, 30
# The verifier recomputes with the mechanism's own function on the parameters read back from the JSON
# (floats round-trip exactly through repr, the sizes are whole numbers): equal to the last bit in fact;
# 1e-12 leaves room for nothing but rounding and is far below the 10% mutants below.
REL = 1e-12
# independent ledgers (a sum over runs, a closed form against a sum of squares) differ from the
# accountant by summation order only: ~1e-15 relative per term, a few hundred terms
LEDGER_REL = 1e-11


def _cases():
    yield "pmwg", lambda: PMWG(universe_size=N, n=n, epsilon=2.0, alpha=0.3, xi_n=0.2)
    yield "pmwg-cdp", lambda: PMWG(universe_size=N, n=n, epsilon=4.0, alpha=0.3, delta=1e-6, xi_n=0.2)
    yield "bbscheduler", lambda: BBScheduler(LaplaceHistogram(N), universe_size=N, n=n, epsilon=1.0, gamma=0.5)
    yield "bbscheduler-cdp", lambda: BBScheduler(LaplaceHistogram(N), universe_size=N, n=n, epsilon=1.0,
                                                 delta=1e-6, gamma=0.5)
    yield "bbimprover", lambda: BBImprover(LaplaceHistogram(N), universe_size=N, n=n, epsilon=1.0, delta=1e-6)


CASES = dict(_cases())


def _run(mech, steps: int = 120):
    """A stream concentrated on cell 0 (PMWG's uniform start is far off: hard queries), one point query
    per arrival from size n, a snapshot after every 10 arrivals; yields (state after the release, release)."""
    noise, rng = NoiseSource(TEST_KEY), np.random.default_rng(23)
    state = mech.init_state("s")
    state, releases = mech.step(state, GrowingBlock(np.zeros(n, np.int64), (Query(n, "q0", np.eye(N)[0]),)), noise)
    out = [(state, r) for r in releases]
    for k in range(1, steps):
        element = np.array([0 if rng.random() < 0.7 else rng.integers(1, N)], np.int64)
        query = Query(state.t + 1, f"q{k}", np.eye(N)[rng.integers(0, N)])
        state, releases = mech.step(state, GrowingBlock(element, (query,)), noise)
        out += [(state, r) for r in releases]
        if k % 10 == 0:
            out.append((state, mech.snapshot(state)))
    return out


def _rows(mech, released):
    composition = "pure" if mech.guarantee.delta == 0 else "approx"
    return [dict(stream=r.stream, step=r.step, mechanism=r.mechanism, meta=json.dumps(dict(r.meta)),
                 epsilon_spent=r.epsilon_spent, delta_spent=r.delta_spent, epsilon_budget=mech.guarantee.epsilon,
                 delta_budget=mech.guarantee.delta, noise_domain="GrowingDatabaseQueries", composition=composition,
                 purpose=r.purpose, noise=r.noise, job_epsilon_budget=mech.guarantee.epsilon,
                 job_delta_budget=mech.guarantee.delta) for _, r in released]


def _account(release) -> dict:
    declared = json.loads(release.noise)
    assert declared["terms"] == [] and len(declared["accounts"]) == 1
    return declared["accounts"][0]


@pytest.mark.parametrize("case", list(CASES))
def test_every_release_declares_an_account_that_recomputes_its_spend(case):
    mech = CASES[case]()
    released = _run(mech)
    kinds = {r.mechanism for _, r in released}
    assert kinds == {mech.name, f"{mech.name}_synthetic"} | ({f"{mech.name}_run"} if "bb" in case else set())
    assert kinds <= DECLARING_MECHANISMS
    for _, r in released:
        assert _account(r)["kind"] == mech.account_kind, (case, r.mechanism, r.step)
        loss = loss_of_declaration(r.noise)
        assert loss.account_delta == r.delta_spent  # both the same branch of the same function: exact
        assert recomputed_epsilon(loss, r.delta_spent) == pytest.approx(r.epsilon_spent, rel=REL, abs=1e-300)
        assert r.epsilon_spent <= mech.guarantee.epsilon * (1 + 1e-12)
    assert released[-1][1].epsilon_spent > 0


@pytest.mark.parametrize("case", ["pmwg", "pmwg-cdp"])
def test_pmwg_declares_its_own_segments_and_noise_and_the_ledger_agrees(case):
    mech = CASES[case]()
    released = _run(mech)
    assert len(released[-1][0].segments) >= 3  # several segments ...
    assert any(r.meta.get("unchecked") for _, r in released)  # ... and the budget ran out: paused answers
    power = 1.0 if mech.delta == 0 else 2.0
    for state, r in released:
        declared = _account(r)
        assert declared["segments"] == len(state.segments)  # a count: exact
        assert (declared["n"], declared["xi_n"], declared["a"], declared["delta"]) == (
            mech.n, mech.xi_n, mech.a, mech.delta)  # the parameters themselves, not computed: exact
        # the load of the state's own segment log, summed here in another order (rounding only)
        load = math.fsum((n / t0) ** (power * (1 - mech.a)) for t0 in state.segments[:, 0].tolist())
        assert declared["load"] == pytest.approx(load, rel=LEDGER_REL)
        # the per-element ledger (a separate formula over the segment log) peaks at the stated spend
        assert mech.element_spend(state, np.array([n])).max() == pytest.approx(r.epsilon_spent, rel=LEDGER_REL)


@pytest.mark.parametrize("case", ["bbscheduler", "bbscheduler-cdp"])
def test_bbscheduler_declares_the_runs_it_made(case):
    mech = CASES[case]()
    released = _run(mech)
    run_eps = []
    for _, r in released:
        if r.mechanism.endswith("_run"):
            run_eps.append(r.meta["epsilon_run"])
        declared = _account(r)
        assert declared["epochs"] == len(run_eps) and declared["gamma"] == mech.plan.gamma  # exact: counts, params
        # an element present from n is in every run so far: the released runs' own epsilons composed
        ledger = math.fsum(run_eps) if mech.plan.delta == 0 else cdp_epsilon(math.fsum(e * e for e in run_eps),
                                                                              mech.plan.delta)
        assert ledger == pytest.approx(r.epsilon_spent, rel=LEDGER_REL)
    assert len(run_eps) >= 4


def test_bbimprover_declares_the_size_and_the_runs_sum_to_it():
    mech = CASES["bbimprover"]()
    for _, r in _run(mech):
        assert _account(r)["t"] == r.step
        s = math.fsum(bbimprover_epsilon(np.arange(n, r.step + 1), n, mech.s_tot) ** 2)  # every size charged
        assert cdp_epsilon(s, 1e-6) == pytest.approx(r.epsilon_spent, rel=LEDGER_REL)


def _doctored(text: str, **change) -> str:
    declared = json.loads(text)
    declared["accounts"][0].update(change)
    declared["accounts"][0] = {k: v for k, v in declared["accounts"][0].items() if v is not None}
    return json.dumps(declared, sort_keys=True)


def _more_spend(case: str, account: dict) -> dict:
    """A change of the declared parameters that claims more spend than the row states."""
    if case.startswith("pmwg"):
        return {"xi_n": account["xi_n"] / 2}  # half the noise scale: twice the cost per segment
    if case.startswith("bbscheduler"):
        return {"epochs": account["epochs"] + 1}
    return {"t": account["t"] * 2}


@pytest.mark.parametrize("case", list(CASES))
def test_doctored_rows_fail_the_verifier(case):
    mech = CASES[case]()
    released = _run(mech, steps=60)
    rows = _rows(mech, released)
    assert verify_job(rows, strict=True).ok, verify_job(rows, strict=True).problems
    last = rows[-1]

    def problems(doctored_last):
        return " | ".join(verify_job(rows[:-1] + [doctored_last], strict=True).problems)

    assert "below the spend recomputed" in problems(dict(last, epsilon_spent=last["epsilon_spent"] * 0.9))
    more = _more_spend(case, _account(released[-1][1]))
    assert "below the spend recomputed" in problems(dict(last, noise=_doctored(last["noise"], **more)))
    assert "lack the noise declaration" in problems(dict(last, noise=""))
    if case.startswith("pmwg"):  # more segments claimed than ... a segment opened before n; a parameter missing
        account = _account(released[-1][1])
        assert "below the spend recomputed" in problems(dict(last, noise=_doctored(
            last["noise"], segments=account["segments"] + 1, load=account["load"] + 0.5)))
        assert "declares its noise as" in problems(dict(last, noise=_doctored(
            last["noise"], load=account["segments"] + 0.5)))
        assert "declares its noise as" in problems(dict(last, noise=_doctored(last["noise"], segments=None)))
    assert "declares its noise as" in problems(dict(last, noise=_doctored(last["noise"], delta=1.5)))


def test_account_functions_refuse_parameters_out_of_range():
    good = dict(n=30, xi_n=0.2, a=0.5, delta=0.0, segments=2, load=1.5)
    assert pmwg_spend(**good) == pytest.approx((2.25 / (30 * 0.2) * 1.5, 0.0), rel=1e-15)  # 2 ops, rounding
    assert pmwg_spend(**{**good, "segments": 0, "load": 0.0}) == (0.0, 0.0)
    for bad in (dict(n=0), dict(xi_n=0.0), dict(a=1.0), dict(delta=-0.1), dict(segments=1.5), dict(load=2.5),
                dict(load=0.0), dict(segments=0), dict(load=-1.0)):
        with pytest.raises(ValueError):
            pmwg_spend(**{**good, **bad})
    assert bbscheduler_spend(epsilon=1.0, delta=0.0, gamma=0.5, epochs=0) == (0.0, 0.0)
    for bad in (dict(epochs=-1), dict(epochs=1.5), dict(gamma=0.0), dict(epsilon=math.inf), dict(delta=1.0)):
        with pytest.raises(ValueError):
            bbscheduler_spend(**{**dict(epsilon=1.0, delta=0.0, gamma=0.5, epochs=3), **bad})
    assert bbimprover_spend(n=30, epsilon=1.0, delta=1e-6, t=29) == (0.0, 0.0)
    for bad in (dict(n=2), dict(delta=0.0), dict(t=-1), dict(epsilon=-1.0)):
        with pytest.raises(ValueError):
            bbimprover_spend(**{**dict(n=30, epsilon=1.0, delta=1e-6, t=40), **bad})


def test_the_account_functions_load_without_beam_or_torch_in_a_fresh_process():
    declared = {k: r.noise for k, r in ((k, _run(CASES[k](), steps=5)[-1][1]) for k in CASES)}
    code = ("import json, sys\n"
            "from beam_dp.core.noise_declaration import loss_of_declaration\n"
            "losses = [loss_of_declaration(t) for t in json.loads(sys.argv[1]).values()]\n"
            "assert all(l.account_epsilon > 0 for l in losses), losses\n"
            "assert not {'apache_beam', 'torch'} & set(sys.modules), 'imported beam or torch'\n")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(declared)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.pipeline
@pytest.mark.parametrize("args", [["--mechanism", "pmwg", "--delta", "1e-6"], ["--mechanism", "bbscheduler"],
                                  ["--mechanism", "bbimprover", "--delta", "1e-6"]], ids=lambda a: "-".join(a[1::2]))
def test_the_job_declares_every_release_and_verifies_strictly(args, tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT), BEAM_DP_NOISE_KEY=TEST_KEY.hex())
    done = subprocess.run([sys.executable, "-m", "pipelines.growing_db_queries", "--output", str(out), "--snapshots",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    noise = [t for f in sorted(out.glob("*.parquet")) for t in pq.read_table(f, columns=["noise"]).column(0).to_pylist()]
    assert len(noise) >= 30 and all(noise)
    verified = subprocess.run([sys.executable, "-m", "beam_dp.verify", str(out), "--strict"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
    assert verified.returncode == 0, verified.stdout[-3000:]
    assert verified.stdout.strip().endswith("verified: within the job's total")
