"""The verifier recomputes a unit-level release's spend from its declared bounding (beam_dp.verify_units)."""

from __future__ import annotations

import pytest

from beam_dp.beam import ContinualSumParams, WindowedSumParams
from beam_dp.beam.sums import PrivacyUnit
from beam_dp.core.clock import StepClock
from beam_dp.core.noise import NoiseSource
from beam_dp.io.manifest import JobManifest, ManifestTransform
from beam_dp.verify import verify_job
from tests.conftest import TEST_KEY

CLOCK = StepClock(start=0.0, period=1.0, end=12.0)
UNIT = PrivacyUnit("user", max_streams_per_step=2, max_contributions_per_step=3, max_steps=3, min_separation=2)
PARAMS = {
    "blt": ContinualSumParams(clock=CLOCK, noise="gaussian", delta=1e-6, clip_bound=0.5),
    "kary": ContinualSumParams(clock=CLOCK, clip_bound=0.5),
    "binary-gaussian": ContinualSumParams(clock=CLOCK, counter="tree", horizon=12, noise="gaussian", delta=1e-6),
    "window": WindowedSumParams(clock=CLOCK, window=4, noise="gaussian", delta=1e-6),
}


def _rows(params, declaration, steps=12):
    mechanism = params.build_mechanism()
    noise, state, rows = NoiseSource(TEST_KEY), mechanism.init_state("s"), []
    g = mechanism.guarantee
    for _ in range(steps):
        state, (r,) = mechanism.step(state, None, noise)
        rows.append(dict(stream=r.stream, step=r.step, mechanism=r.mechanism, meta={**r.meta, **declaration},
                         value=r.value, epsilon_spent=r.epsilon_spent, delta_spent=r.delta_spent,
                         epsilon_budget=g.epsilon, delta_budget=g.delta, noise_domain="Sum",
                         composition=mechanism.composition, purpose=r.purpose, noise=r.noise,
                         job_epsilon_budget=g.epsilon, job_delta_budget=g.delta))
    return rows


def _manifest(rows, unit):
    r = rows[0]
    transform = ManifestTransform("Sum", r["mechanism"], r["composition"], r["epsilon_budget"], r["delta_budget"],
                                  ("sum",), privacy_unit=unit)
    return JobManifest("job", r["epsilon_budget"], r["delta_budget"], (transform,))


def _fails(verdict, text):
    return not verdict.ok and any(text in p for p in verdict.problems)


@pytest.mark.parametrize("family", sorted(PARAMS))
def test_unit_level_releases_verify_and_doctored_bounding_fails(family):
    unit_params = PARAMS[family].with_privacy_unit(UNIT)
    declaration = unit_params.unit_declaration()
    rows = _rows(unit_params, declaration)
    verdict = verify_job(rows)
    assert verdict.ok, verdict.problems
    assert verify_job(rows, manifest=_manifest(rows, "user")).ok
    # a larger bound than the noise was calibrated for: the unit's joint sensitivity exceeds the declared one
    wider = [dict(r, meta={**r["meta"], "max_steps": 6}) for r in rows]
    assert _fails(verify_job(wider), "joint sensitivity")
    wider = [dict(r, meta={**r["meta"], "max_streams_per_step": 3}) for r in rows]
    assert _fails(verify_job(wider), "joint sensitivity")
    # bounding removed from the rows (the unit kept): refused
    stripped = [dict(r, meta={k: v for k, v in r["meta"].items() if k != "max_steps"}) for r in rows]
    assert _fails(verify_job(stripped), "without its bounding")
    # the unit removed from the rows of a job whose manifest names it
    event_level = [dict(r, meta={k: v for k, v in r["meta"].items() if k not in declaration}) for r in rows]
    assert _fails(verify_job(event_level, manifest=_manifest(rows, "user")), "must be on every release")
    # a release naming the unit under a manifest declaring the transform event-level
    assert _fails(verify_job(rows, manifest=_manifest(rows, None)), "declares the transform event-level")
    # one row stripped of its unit, without a manifest: the domain's releases disagree
    assert _fails(verify_job(rows[:-1] + event_level[-1:]), "one transform's releases declare one unit")


@pytest.mark.parametrize("family", sorted(PARAMS))
def test_event_level_noise_declared_unit_level_fails(family):
    """The mutant: event-level noise (F = 1) with a unit-level declaration states a spend below the unit's."""
    params = PARAMS[family]
    rows = _rows(params, params.with_privacy_unit(UNIT).unit_declaration())
    assert _fails(verify_job(rows), "joint sensitivity")


def test_event_level_releases_are_unaffected():
    rows = _rows(PARAMS["blt"], {})
    assert verify_job(rows).ok
    assert verify_job(rows, manifest=_manifest(rows, None)).ok
    assert "privacy_unit" not in _manifest(rows, None).to_json()
    assert JobManifest.from_json(_manifest(rows, "user").to_json()).transforms[0].privacy_unit == "user"


def test_malformed_bounding_fails():
    unit_params = PARAMS["kary"].with_privacy_unit(UNIT)
    rows = _rows(unit_params, unit_params.unit_declaration())
    for field, value in (("max_steps", 2.5), ("min_separation", "2"), ("clip_bound", -1.0), ("max_steps", True)):
        doctored = [dict(r, meta={**r["meta"], field: value}) for r in rows]
        assert not verify_job(doctored).ok, (field, value)
