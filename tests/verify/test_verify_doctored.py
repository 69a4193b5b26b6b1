"""The verifier on a real ``continual_stats --count`` job's folder (its manifest beside its releases):
the honest folder verifies, and each doctored case of issue 23 fails verification with its own reason.

(a) count rows relabelled into the sum's noise domain, (b) every ``epsilon_spent`` set to 0,
(c) ``job_epsilon_budget`` raised on every row, (d) a transform's file missing, (e) a pure domain
reporting delta 0.5."""

import glob
import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_dp.io.manifest import MANIFEST_NAME, JobManifest, read_manifest
from beam_dp.verify import main as verify_main

pytestmark = pytest.mark.pipeline


def _copy(job, tmp_path):
    folder = str(tmp_path / "copy")
    shutil.copytree(job, folder)
    return folder


def _doctor(folder, name, column, value):
    """Set ``column`` to ``value`` on every row of the ``name`` release files."""
    for path in glob.glob(f"{folder}/{name}-*.parquet"):
        table = pq.read_table(path)
        i = table.schema.get_field_index(column)
        field = table.schema.field(i)
        table = table.set_column(i, field, pa.array([value] * table.num_rows, field.type))
        pq.write_table(table, path)


def _verdict(args, capsys):
    code = verify_main(args)
    return code, capsys.readouterr().out


def test_the_honest_job_verifies_by_folder_and_by_files(job, capsys):
    manifest = read_manifest(job)
    assert {t.noise_domain for t in manifest.transforms} == {"ContinualSum", "ContinualCount/Sum", "WindowedSum"}
    assert sorted(f for t in manifest.transforms for f in t.files) == ["count", "sum", "windowed"]
    assert (manifest.epsilon, manifest.delta) == (1.0, 0.0) and not manifest.problems()
    code, out = _verdict([job], capsys)
    assert code == 0 and out.strip().endswith("verified: within the job's total"), out
    code, out = _verdict([job + "/*.parquet", "--manifest", job + "/" + MANIFEST_NAME], capsys)
    assert code == 0, out


def test_a_count_relabelled_into_the_sums_domain_fails(job, tmp_path, capsys):
    folder = _copy(job, tmp_path)
    _doctor(folder, "count", "noise_domain", "ContinualSum")
    code, out = _verdict([folder], capsys)
    assert code == 1 and "two transforms share the noise domain" in out and "appears 2 times" in out, out
    # without the manifest too: the duplicate key is (domain, stream, step, purpose), whatever the meta
    code, out = _verdict([folder + "/*.parquet"], capsys)
    assert code == 1 and "appears 2 times" in out, out


def test_a_relabelled_transform_of_another_mechanism_fails(job, tmp_path, capsys):
    folder = _copy(job, tmp_path)
    _doctor(folder, "count", "noise_domain", "WindowedSum")  # kary_tree rows in the window tree's domain
    code, out = _verdict([folder + "/*.parquet"], capsys)
    assert code == 1 and "comes from mechanism" in out, out


@pytest.mark.parametrize("column,value,reason", [
    ("epsilon_spent", 0.0, "below the spend recomputed from its noise declaration"),  # (b)
    ("job_epsilon_budget", 10.0, "the releases state job totals [(10.0, 0.0)]"),        # (c)
], ids=["b-every-epsilon-spent-zero", "c-job-budget-raised"])
def test_a_column_doctored_on_every_row_fails(job, tmp_path, capsys, column, value, reason):
    folder = _copy(job, tmp_path)
    for name in ("sum", "count", "windowed"):
        _doctor(folder, name, column, value)
    code, out = _verdict([folder], capsys)
    assert code == 1 and reason in out, out


def test_a_missing_transform_file_fails(job, tmp_path, capsys):
    folder = _copy(job, tmp_path)
    for path in glob.glob(f"{folder}/count-*"):
        shutil.os.remove(path)
    code, out = _verdict([folder], capsys)
    assert code == 1 and "'ContinualCount/Sum''s release files" in out and "are missing" in out, out
    assert "none of its releases was read" in out


def test_a_pure_domain_reporting_a_delta_fails(job, tmp_path, capsys):
    folder = _copy(job, tmp_path)
    _doctor(folder, "sum", "delta_spent", 0.5)
    _doctor(folder, "sum", "delta_budget", 0.5)  # so that it is not merely "more than its own budget"
    code, out = _verdict([folder], capsys)
    assert code == 1 and "is 'pure' but reports delta 0.5" in out, out
    code, out = _verdict([folder + "/*.parquet"], capsys)  # caught from the rows alone
    assert code == 1 and "is 'pure' but reports delta 0.5" in out, out


def test_a_manifest_whose_shares_exceed_its_total_or_that_is_missing_fails(job, tmp_path, capsys):
    folder = _copy(job, tmp_path)
    path = f"{folder}/{MANIFEST_NAME}"
    data = json.loads(open(path).read())
    data["transforms"][0]["epsilon"] = 0.9
    open(path, "w").write(json.dumps(data))
    assert any("compose to epsilon" in p for p in read_manifest(folder).problems())
    code, out = _verdict([folder], capsys)
    assert code == 1 and "compose to epsilon" in out, out
    shutil.os.remove(path)
    code, out = _verdict([folder], capsys)
    assert code == 1 and "no beam_dp manifest" in out, out
    with pytest.raises(ValueError, match="malformed"):
        JobManifest.from_json(json.dumps({"beam_dp_manifest": 1, "job": "x"}))
