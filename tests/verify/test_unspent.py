"""No share of a job's budget left unspent: the window tree's exact calibration spends its share, a
transform that cannot (the paper's certified sigma, a clock too short for the tree) says so at
construction, and the summary and manifest show planned against spendable."""

from __future__ import annotations

import json
import logging

import pytest

from beam_dp.beam import ContinualSumParams, WindowedSumParams
from beam_dp.core import StepClock
from beam_dp.core.budget import JobBudget, compose, max_spend_of, share_use
from beam_dp.io import read_releases
from beam_dp.io.manifest import JobManifest
from beam_dp.verify import verify_job
from pipelines import continual_stats

JOB = ["--window", "8", "--noise", "gaussian", "--delta", "1e-6"]  # the demo job, epsilon 1


def _plan(argv):
    from apache_beam.options.pipeline_options import PipelineOptions

    return continual_stats.plan(PipelineOptions(argv))


def test_the_window_job_spends_its_share_and_the_whole_budget(tmp_path, capsys):
    out = tmp_path / "out"
    argv = JOB + ["--output", str(out)]  # (the suite's conftest sets the noise key)
    uses = {name: share_use(name, p) for name, p in _plan(argv).params.items()}
    assert set(uses) == {"sum", "windowed"}
    assert uses["windowed"].ratio >= 0.95 and not uses["windowed"].unspent
    assert continual_stats.main(argv) == 0
    summary = capsys.readouterr().out
    assert "windowed 0.6889 -> 0.6889 (100.0%)" in summary
    rows = [r for name in ("sum", "windowed") for r in read_releases(str(out / f"{name}-*"))]
    verdict = verify_job(rows)
    assert verdict.ok
    windowed = next(d for d in verdict.domains if d.domain == "WindowedSum")
    assert windowed.epsilon_spent >= 0.95 * uses["windowed"].planned_epsilon  # recomputed from the rows' declarations
    assert verdict.worst_epsilon >= 0.95 * 1.0  # of the job's total 1
    manifest = JobManifest.from_json((out / "_beam_dp_manifest.json").read_text())
    spendable = {t.noise_domain: (t.epsilon, t.epsilon_spendable) for t in manifest.transforms}
    assert spendable["WindowedSum"][1] == pytest.approx(spendable["WindowedSum"][0], rel=1e-6)


def test_the_paper_calibration_says_it_leaves_its_share_unspent(caplog):
    argv = JOB + ["--calibration", "paper", "--output", "/tmp/unused-h5-unspent"]
    with caplog.at_level(logging.WARNING, logger="beam_dp.continual_stats"):
        params = _plan(argv).params
    said = [r.getMessage() for r in caplog.records if "left unspent" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("beam_dp: windowed:") and "--calibration analytic" in said[0]
    use = share_use("windowed", params["windowed"])
    assert use.unspent and use.ratio < 0.1  # the paper's sigma spends a few percent of the share
    assert continual_stats.warn_unspent({"sum": params["sum"]}) == []  # the sum (BLT) spends its share


def test_share_use_follows_the_public_horizon_and_the_wrapped_mechanisms():
    budget = JobBudget(2.0).split({"windowed": "pure"})
    share = budget["windowed"]
    long = WindowedSumParams(window=8, dim=1, clock=StepClock(0.0, 1.0, 100), **share.params())
    short = WindowedSumParams(window=8, dim=1, clock=StepClock(0.0, 1.0, 2), **share.params())
    assert share_use("w", long).ratio == pytest.approx(1.0, rel=1e-12)
    # 2 steps complete 2 of the 4 levels of a step's nodes: half the pure share
    assert share_use("w", short).spendable_epsilon == pytest.approx(share.epsilon * 2 / 4, rel=1e-12)
    assert share_use("w", short).unspent
    snapped = WindowedSumParams(window=8, dim=1, granularity=0.01, clock=StepClock(0.0, 1.0, 100), **share.params())
    assert max_spend_of(snapped.build_mechanism()) is not None  # through the SnappedSum's inner tree
    # a mechanism that does not say is taken at its guarantee
    plain = ContinualSumParams(dim=1, clock=StepClock(0.0, 1.0, 16), counter="tree", epsilon=1.0)
    assert max_spend_of(plain.build_mechanism()) is None and share_use("s", plain).ratio == 1.0


def test_shares_compose_to_the_total_when_every_transform_spends_its_share():
    plan = JobBudget(1.0, 1e-6).split({"sum": "gaussian", "windowed": "gaussian"})
    clock = StepClock(0.0, 1.0, 50)
    windowed = WindowedSumParams(window=8, dim=2, noise="gaussian", clock=clock, **plan["windowed"].params())
    use = share_use("windowed", windowed)
    spent = compose([("gaussian", plan["sum"].epsilon, plan["sum"].delta),
                     ("gaussian", use.spendable_epsilon, use.spendable_delta)], 1e-6)
    assert spent >= 0.999 and spent <= 1.0 + 1e-7
    assert json.loads(json.dumps(use.describe()))  # printable
