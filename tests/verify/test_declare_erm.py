"""ERM model releases declare their noise: every release of every ERM mechanism (multi-resolution,
continual cumulative/basic/independent, sliding window; K-norm, Gaussian and the sampling variants;
numpy and torch solvers) carries the noise of its worst-hit block, the spend recomputed from that
declaration alone equals its ``epsilon_spent``, and the verifier fails a doctored row. The
``model_release`` job's folders verify with ``--strict``."""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from beam_dp.core.accounting import erm as accounting
from beam_dp.core.noise import NoiseSource
from beam_dp.core.noise_declaration import ACCOUNT_KINDS, _account_function, loss_of_declaration, recomputed_epsilon
from beam_dp.mechanisms.erm import (
    ContinualReleaseMechanism,
    MultiResolutionMechanism,
    SlidingWindowMechanism,
    base,
    declaration,
)
from beam_dp.mechanisms.erm.declaration import SAMPLED_K_NORM
from beam_dp.verify import verify_job
from tests.conftest import TEST_KEY
from tests.mechanisms.erm.util import TINY, blocks

# the stated spend sums each call's cost per block (ln(1 + p(e^{Δ/b} − 1)), or μ² = (Δ/σ)²) in event
# order, the recomputed one sums the declared keys' costs times their counts: they agree to float
# rounding (~1e-15 relative over a few dozen calls) and the analytic-Gaussian bisection, the same
# function on both sides; 1e-9 is far above both and far below a 10% under-report
REL = 1e-9
GAUSS = dict(noise="gaussian", delta=1e-6)


def _mechanisms():
    common = dict(model=TINY, lam=1.0, epsilon=0.8)
    yield "multires", MultiResolutionMechanism(block=4, **common), 4
    yield "multires-gauss", MultiResolutionMechanism(block=4, max_level=2, **common, **GAUSS), 4
    yield "multires-sampled", MultiResolutionMechanism(block=4, sampling=True, **common), 4
    yield "continual", ContinualReleaseMechanism(update=2, base=4, **common), 2
    yield "continual-gauss", ContinualReleaseMechanism(update=2, base=4, base_fraction=0.3, **common, **GAUSS), 2
    yield "continual-sampled", ContinualReleaseMechanism(update=2, base=4, sampling=True, **common), 2
    yield "continual-basic-gauss", ContinualReleaseMechanism(update=2, base=4, variant="basic", **common, **GAUSS), 2
    yield "independent", ContinualReleaseMechanism(update=2, base=4, variant="independent", **common), 2
    yield "sliding", SlidingWindowMechanism(block=2, levels=3, **common), 2
    yield "sliding-gauss", SlidingWindowMechanism(block=2, levels=3, **common, **GAUSS), 2
    yield "sliding-sampled", SlidingWindowMechanism(block=2, levels=3, sampling=True, **common), 2
    yield "sliding-snapped", SlidingWindowMechanism(block=2, levels=2, granularity=2.0**-10, **common), 2


MECHANISMS = list(_mechanisms())
IDS = [name for name, *_ in MECHANISMS]


def _releases(mechanism, size, steps=24, state=None):
    noise, state = NoiseSource(TEST_KEY), state or mechanism.init_state("s")
    out = []
    for block in blocks(steps, size):
        state, releases = mechanism.step(state, block, noise)
        out += releases
    return out


def _rows(mechanism, releases):
    g = mechanism.guarantee
    return [dict(stream=r.stream, step=r.step, mechanism=r.mechanism, meta=dict(r.meta), purpose=r.purpose,
                 epsilon_spent=r.epsilon_spent, delta_spent=r.delta_spent, epsilon_budget=g.epsilon,
                 delta_budget=g.delta, noise_domain="Models", composition="pure" if g.delta == 0 else "approx",
                 noise=r.noise, job_epsilon_budget=g.epsilon, job_delta_budget=g.delta) for r in releases]


def _recomputed(release) -> float:
    return recomputed_epsilon(loss_of_declaration(release.noise), release.delta_spent)


@pytest.mark.parametrize("name,mechanism,size", MECHANISMS, ids=IDS)
def test_every_erm_release_declares_the_noise_its_spend_is_recomputed_from(name, mechanism, size):
    releases = _releases(mechanism, size)
    assert releases
    for r in releases:
        assert r.noise, f"{name}: the release at step {r.step} declares no noise"
        assert _recomputed(r) == pytest.approx(r.epsilon_spent, rel=REL), (name, r.step)
    declared = [json.loads(r.noise) for r in releases]
    laws = {law for d in declared for law, *_ in d["terms"]}
    assert laws == {mechanism.noise_law}
    kinds = {a["kind"] for d in declared for a in d.get("accounts", ())}
    # the sampling variants' sampled calls are accounts; a worst block of multires/sliding lies in one
    assert kinds == ({SAMPLED_K_NORM} if mechanism.sampling and name != "continual-sampled" else set())
    assert verify_job(_rows(mechanism, releases), strict=True).ok


def test_a_sampled_continual_block_declares_its_sampled_updates():
    """Continual with sampling: a block's worst loss may lie in base + small updates only; the block
    of a sampled (large) update declares it as an account, and recomputes to its loss."""
    mechanism = ContinualReleaseMechanism(model=TINY, lam=1.0, epsilon=0.8, update=2, base=16, sampling=True)
    releases = _releases(mechanism, 2, steps=12)
    assert any(SAMPLED_K_NORM in r.noise for r in releases)
    for r in releases:
        assert _recomputed(r) == pytest.approx(r.epsilon_spent, rel=REL), r.step


def test_the_account_is_the_function_the_mechanism_charges_sampled_calls_with():
    assert base.sampled_k_norm_loss is accounting.sampled_k_norm_loss
    assert _account_function(SAMPLED_K_NORM) is accounting.sampled_k_norm_loss
    assert ACCOUNT_KINDS[SAMPLED_K_NORM] is accounting.sampled_k_norm_loss
    mechanism = MultiResolutionMechanism(model=TINY, lam=1.0, epsilon=0.8, block=4, sampling=True)
    for r in _releases(mechanism, 4, steps=8):
        p, scale, n_norm = r.meta["sample_p"], r.meta["noise_scale"], r.meta["n_norm"]
        own = accounting.sampled_k_norm_loss(sensitivity=mechanism.sens(n_norm), scale=scale, p=p)
        assert own == (r.meta["epsilon"], 0.0)  # the same function on the same floats: equal exactly
    for bad in (dict(p=0.0), dict(p=1.5), dict(scale=0.0), dict(count=-1.0), dict(count=0.5)):
        with pytest.raises(ValueError):
            accounting.sampled_k_norm_loss(**{**dict(sensitivity=1.0, scale=1.0, p=0.5), **bad})


@pytest.mark.parametrize("name", ["continual-sampled", "sliding-gauss", "multires-sampled"])
def test_the_verifier_fails_a_doctored_erm_row(name):
    (_, mechanism, size), = [m for m in MECHANISMS if m[0] == name]
    releases = _releases(mechanism, size)
    rows = _rows(mechanism, releases)
    assert verify_job(rows, strict=True).ok
    i = len(rows) - 1

    def fails(row, reason):
        verdict = verify_job(rows[:i] + [row], strict=True)
        assert not verdict.ok and any(reason in p for p in verdict.problems), verdict.problems

    fails(dict(rows[i], epsilon_spent=rows[i]["epsilon_spent"] * 0.9), "below the spend recomputed")
    declared = json.loads(rows[i]["noise"])
    declared["terms"] = [[law, s, scale / 2, w] for law, s, scale, w in declared["terms"]]  # half the noise
    fails(dict(rows[i], noise=json.dumps(declared)), "below the spend recomputed")
    fails(dict(rows[i], noise=""), "lack the noise declaration")


def test_a_doctored_sampling_probability_or_count_fails():
    mechanism = MultiResolutionMechanism(model=TINY, lam=1.0, epsilon=0.8, block=4, sampling=True)
    rows = _rows(mechanism, _releases(mechanism, 4, steps=8))
    last = rows[-1]
    for change in (dict(p=1.0), dict(count=2.0)):
        declared = json.loads(last["noise"])
        declared["accounts"] = [{**a, **change} for a in declared["accounts"]]
        verdict = verify_job(rows[:-1] + [dict(last, noise=json.dumps(declared))], strict=True)
        assert any("below the spend recomputed" in p for p in verdict.problems), change


def test_a_restored_state_declares_the_same_noise():
    """Fresh worker / restore: the per-block counts travel in the encoded state."""
    (_, mechanism, size), = [m for m in MECHANISMS if m[0] == "sliding-sampled"]
    noise, state = NoiseSource(TEST_KEY), mechanism.init_state("s")
    data = blocks(20, size)
    straight, restored = [], []
    for block in data:
        state, releases = mechanism.step(state, block, noise)
        straight += releases
    state = mechanism.init_state("s")
    for block in data:
        state, releases = mechanism.step(mechanism.decode_state(mechanism.encode_state(state)), block, noise)
        restored += releases
    assert [r.noise for r in restored] == [r.noise for r in straight]  # text from the same floats: exact


@pytest.mark.parametrize("name", ["sliding", "sliding-gauss", "sliding-sampled"])
def test_a_departed_blocks_counts_declare_its_loss(name):
    """Sliding window: blocks that left the window keep the counts of the worst of them, so a release
    whose worst loss lies only in a departed block declares that block (the schedule keeps an
    in-window block as hit, so the test calls ``worst`` with the departed block strictly worse)."""
    (_, mechanism, size), = [m for m in MECHANISMS if m[0] == name]
    noise, state = NoiseSource(TEST_KEY), mechanism.init_state("s")
    for block in blocks(20, size):
        state, _ = mechanism.step(state, block, noise)
    assert state.departed.max() > 0
    departed = (state.departed, declaration.padded(state.departed_counts, len(state.keys)))
    epsilon, delta = mechanism.spent(state.departed)
    text = declaration.declaration_of(mechanism.noise_law, state.keys, departed[1])
    assert recomputed_epsilon(loss_of_declaration(text), delta) == pytest.approx(epsilon, rel=REL)
    # every in-window block below the departed one (and declaring nothing, so that a declaration
    # taken from the window instead of the departed block shows)
    lower = state.spend * 0.5
    worst, declared = mechanism.worst(lower, state.keys, np.zeros_like(state.counts), departed)
    assert declared == text and np.array_equal(worst, np.maximum(state.departed, lower.max(axis=0)))


def test_the_torch_solver_declares_the_same_noise():
    pytest.importorskip("torch")
    for name in ("continual-gauss", "sliding-sampled"):
        (_, mechanism, size), = [m for m in MECHANISMS if m[0] == name]
        kwargs = dict(model=TINY, lam=1.0, epsilon=0.8, backend="torch")
        if name == "continual-gauss":
            torch_mech = ContinualReleaseMechanism(update=2, base=4, base_fraction=0.3, **kwargs, **GAUSS)
        else:
            torch_mech = SlidingWindowMechanism(block=2, levels=3, sampling=True, **kwargs)
        numpy_releases, torch_releases = _releases(mechanism, size, steps=10), _releases(torch_mech, size, steps=10)
        # the declaration and spend are functions of the public schedule only: exactly equal
        assert [(r.noise, r.epsilon_spent) for r in torch_releases] == [(r.noise, r.epsilon_spent)
                                                                         for r in numpy_releases]
        assert all(r.noise for r in torch_releases)


def test_not_private_releases_declare_nothing_and_the_verifier_fails_them_without_crashing():
    from beam_dp.mechanisms.erm import SoftmaxRegression
    model = SoftmaxRegression(n_features=1, clip_bound=1.0, n_classes=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mechanism = MultiResolutionMechanism(model=model, lam=1.0, epsilon=0.8, block=4,
                                             as_published_not_private=True)
    releases = _releases(mechanism, 4, steps=4)
    assert releases and all(r.noise == "" and r.epsilon_spent == np.inf for r in releases)
    verdict = verify_job(_rows(mechanism, releases))
    assert not verdict.ok


def test_uncertified_releases_declare_nothing_so_a_strict_verifier_fails_them():
    """Replication SGD (``uncertified=True``) does not prove the Δ(n) a declaration would state."""
    mechanism = MultiResolutionMechanism(model=TINY, lam=1.0, epsilon=0.8, block=4, uncertified=True)
    releases = _releases(mechanism, 4, steps=4)
    assert releases and all(r.noise == "" and not r.meta["certified"] for r in releases)
    assert any("lack the noise declaration" in p for p in verify_job(_rows(mechanism, releases)).problems)


ROOT = Path(__file__).resolve().parents[2]
JOBS = {
    "continual-gaussian": ["--algorithm", "continual", "--update-size", "4", "--base-size", "8",
                           "--noise", "gaussian", "--delta", "1e-6"],
    "sliding-sampled": ["--algorithm", "sliding", "--block-size", "8", "--window", "24", "--sampling", "true"],
    "multires-sampled": ["--algorithm", "multiresolution", "--block-size", "8", "--sampling", "true"],
}


@pytest.mark.pipeline
@pytest.mark.parametrize("job", list(JOBS))
def test_a_model_release_job_verifies_strictly(job, tmp_path):
    rng = np.random.default_rng(0)
    lines = ["stream_id,x_0,x_1,label"] + [f"{s},{x:.4f},{z:.4f},{int(x > 0)}" for s in "ab"
                                           for x, z in rng.normal(size=(48, 2))]
    (tmp_path / "in.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT), BEAM_DP_NOISE_KEY=TEST_KEY.hex())
    done = subprocess.run([sys.executable, "-m", "pipelines.model_release", "--input", str(tmp_path / "in.csv"),
                           "--output", str(out), "--dim", "2", "--classes", "0,1", *JOBS[job]],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    verified = subprocess.run([sys.executable, "-m", "beam_dp.verify", str(out), "--strict"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
    assert verified.returncode == 0, verified.stdout[-3000:]
    assert verified.stdout.strip().endswith("verified: within the job's total")
    assert "declare no noise" not in verified.stdout


@pytest.mark.pipeline
@pytest.mark.slow
def test_the_model_release_yaml_templates_output_verifies_strictly(tmp_path, monkeypatch, capsys):
    from beam_dp.verify import main as verify_main
    from tests.verify.test_verify_yaml import _run_template

    out = _run_template("model_release", tmp_path, monkeypatch)
    capsys.readouterr()
    code = verify_main([str(out), "--strict"])
    said = capsys.readouterr().out
    assert code == 0 and said.rstrip().endswith("verified: within the job's total"), said
    assert "declare no noise" not in said
