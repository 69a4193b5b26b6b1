"""The verifier recomputes a per-record family's unit-level spend by group privacy (beam_dp.verify_units)."""

from __future__ import annotations

import json

import pytest

from beam_dp.beam import MultiResolutionParams, MultiResolutionRelease
from beam_dp.io.manifest import JobManifest, ManifestTransform
from beam_dp.verify import verify_job
from tests.beam.test_erm_units import UNIT, examples
from tests.beam.test_erm_units import run as run_erm
from tests.beam.test_growing_db_units import QUERIES, elements, params_of
from tests.beam.test_growing_db_units import run as run_growing
from tests.conftest import TEST_KEY


@pytest.fixture(scope="module")
def outputs() -> dict[str, list[dict]]:
    """Honest unit-level rows of one ERM release (pure and Gaussian noise) and of PMWG, by name."""
    from beam_dp.beam import GrowingDatabaseQueries

    rows = {}
    with pytest.MonkeyPatch.context() as mp:  # the key units are hashed with (module scope: set here)
        mp.setenv("BEAM_DP_NOISE_KEY", TEST_KEY.hex())
        for name, noise, delta in (("erm", "gamma", 0.0), ("erm-gaussian", "gaussian", 1e-6)):
            params = MultiResolutionParams(n_features=2, block=4, epsilon=1.0, noise=noise, delta=delta)
            rows[name] = [r._asdict() for r in run_erm(MultiResolutionRelease(params, privacy_unit=UNIT),
                                                       examples())[0]]
        rows["pmwg"] = [r._asdict() for r in run_growing(
            GrowingDatabaseQueries(params_of("pmwg"), privacy_unit=UNIT), elements(), QUERIES)[0]]
    return rows


def _manifest(rows: list[dict], unit: str | None = "user") -> JobManifest:
    r = rows[0]
    transform = ManifestTransform(r["noise_domain"], r["mechanism"], r["composition"], r["job_epsilon_budget"],
                                  r["job_delta_budget"], ("out",), privacy_unit=unit)
    return JobManifest("job", r["job_epsilon_budget"], r["job_delta_budget"], (transform,))


def _meta(rows: list[dict], **change) -> list[dict]:
    """``rows`` with their meta fields changed (a value None: the field removed)."""
    out = []
    for r in rows:
        meta = {**json.loads(r["meta"]), **change}
        out.append(dict(r, meta=json.dumps({k: v for k, v in meta.items() if v is not None}, sort_keys=True)))
    return out


def _fails(verdict, text: str) -> bool:
    return not verdict.ok and any(text in p for p in verdict.problems)


NAMES = ["erm", "erm-gaussian", "pmwg"]


@pytest.mark.parametrize("name", NAMES)
def test_honest_unit_level_outputs_verify_with_and_without_the_manifest(outputs, name):
    rows = outputs[name]
    assert rows and all(json.loads(r["meta"])["max_records"] == UNIT.max_records for r in rows)
    verdict = verify_job(rows)
    assert verdict.ok, verdict.problems
    assert verdict.worst_epsilon <= 1.0 * (1 + 1e-9)
    assert verify_job(rows, manifest=_manifest(rows)).ok
    # the job composes the unit's spend, not the record's: at least k times the record-level (pure) spend
    if name != "erm-gaussian":
        assert verdict.worst_epsilon == pytest.approx(UNIT.max_records * max(r["epsilon_spent"] for r in rows))


@pytest.mark.parametrize("name", NAMES)
def test_a_lowered_or_raised_max_records_fails(outputs, name):
    rows = outputs[name]
    assert _fails(verify_job(_meta(rows, max_records=2)), "declares another bound")
    assert _fails(verify_job(_meta(rows, max_records=2), manifest=_manifest(rows)), "declares another bound")
    assert _fails(verify_job(_meta(rows, max_records=16)), "do not account for their privacy unit")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [None, 0, 2.5, True, "4"])
def test_a_missing_or_malformed_max_records_fails(outputs, name, bad):
    verdict = verify_job(_meta(outputs[name], max_records=bad))
    assert _fails(verdict, "max_records")


@pytest.mark.parametrize("name", NAMES)
def test_a_lowered_job_spend_fails(outputs, name):
    rows = outputs[name]
    lowered = [dict(r, job_epsilon_spent=r["epsilon_spent"]) for r in rows]  # the record's, not the unit's
    assert _fails(verify_job(lowered), "do not account for their privacy unit")
    assert _fails(verify_job(lowered, manifest=_manifest(rows)), "do not account for their privacy unit")


@pytest.mark.parametrize("name", NAMES)
def test_the_unit_removed_fails_with_the_manifest(outputs, name):
    rows = outputs[name]
    removed = _meta(rows, privacy_unit=None, max_records=None)
    assert _fails(verify_job(removed, manifest=_manifest(rows)), "must be on every release")
    assert _fails(verify_job(rows, manifest=_manifest(rows, None)), "declares the transform event-level")
    assert _fails(verify_job(rows[:-1] + removed[-1:]), "one transform's releases declare one unit")


def test_a_mutant_calibrated_at_the_unit_budget_fails_against_the_share(outputs):
    """Rows stating a record-level budget k times the honest one (the unit's budget not divided by k):
    one unit then spends k times the share, and k times the job's total."""
    rows = outputs["erm"]
    k = UNIT.max_records
    mutant = [dict(r, epsilon_spent=k * r["epsilon_spent"], epsilon_budget=k * r["epsilon_budget"]) for r in rows]
    verdict = verify_job(mutant, manifest=_manifest(rows))
    assert _fails(verdict, "above the share (1, 0) the manifest declares")
    assert _fails(verdict, "more than the declared total 1")
    assert _fails(verify_job(mutant), "do not account for their privacy unit")



@pytest.mark.parametrize("name", ["erm", "erm-gaussian"])
def test_the_record_level_calibration_check_still_runs_on_unit_level_rows(outputs, name):
    """A unit-level row whose declared sensitivity is lowered (its spend restated from it) fails the ERM
    calibration check, as at record level (tests/verify/test_verify_families.py)."""
    from tests.verify.test_verify_families import _restated, _scaled_sensitivities

    rows = [dict(r, meta=json.loads(r["meta"])) for r in outputs[name]]
    last = rows[-1]
    doctored = _restated(last, _scaled_sensitivities(last, 0.9))
    assert doctored["epsilon_spent"] < last["epsilon_spent"]
    verdict = verify_job(rows[:-1] + [doctored])
    assert _fails(verdict, "public calibration gives")
    assert verify_job(rows).ok
