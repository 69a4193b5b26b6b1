"""The verifier against a doctored ``continual_stats --count`` folder, in every form a user runs it:
the folder (its manifest), a glob of its files (the manifest beside them is used), and a glob of a
copy without the manifest. Each doctoring must fail in each form; the honest folder verifies in each.

Doctorings: a transform's declaration emptied by hand (zero weights, ``{"terms": []}``) with its
spend zeroed; a declaration reweighted to match a zeroed spend; a transform relabelled into another's
domain under a purpose its mechanism never writes; a non-finite job total; a transform's files
deleted; a release file duplicated (exact copies verify, counted once; a copy that differs fails, its
problem lines capped); files that are not releases in the folder (named, their content never printed)."""

from __future__ import annotations

import glob
import json
import math
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_dp.io.manifest import MANIFEST_NAME
from beam_dp.verify import PROBLEM_LINES
from beam_dp.verify import main as verify_main

pytestmark = pytest.mark.pipeline

MARKER = "RAW-MARKER-7f3a9"  # a raw value planted in files that are not releases: never printed


def _copy(job, tmp_path, name="copy"):
    folder = str(tmp_path / name)
    shutil.copytree(job, folder)
    return folder


def _rewrite(folder, name, change):
    """Replace every ``name`` release file's table by ``change(table)``."""
    for path in glob.glob(f"{folder}/{name}-*.parquet"):
        pq.write_table(change(pq.read_table(path)), path)


def _set(table, column, values):
    i = table.schema.get_field_index(column)
    field = table.schema.field(i)
    values = values if isinstance(values, list) else [values] * table.num_rows
    return table.set_column(i, field, pa.array(values, field.type))


def _declarations(table, change):
    return _set(table, "noise", [json.dumps(change(json.loads(text))) for text in table.column("noise").to_pylist()])


def _run(args, capsys):
    capsys.readouterr()
    code = verify_main(args)
    return code, capsys.readouterr().out


def _forms(folder, tmp_path, capsys):
    """(form, exit code, output) for the folder, a glob of its files, and a glob of a copy without the
    manifest."""
    bare = _copy(folder, tmp_path, "bare")
    os.remove(f"{bare}/{MANIFEST_NAME}")
    return [(form, *_run(args, capsys)) for form, args in
            (("folder", [folder]), ("glob", [folder + "/*.parquet"]), ("glob, no manifest", [bare + "/*.parquet"]))]


def _fails_everywhere(folder, tmp_path, capsys, *reasons):
    for form, code, out in _forms(folder, tmp_path, capsys):
        assert code == 1 and out.rstrip().endswith("NOT verified"), (form, out)
        assert any(reason in out for reason in reasons), (form, out)


def test_the_honest_job_verifies_in_every_form(job, tmp_path, capsys):
    for form, code, out in _forms(job, tmp_path, capsys):
        assert code == 0 and out.rstrip().endswith("verified: within the job's total"), (form, out)
        assert "PROBLEM" not in out and "WARNING" not in out, (form, out)
        assert ("not checked without the job's manifest" in out) == (form == "glob, no manifest"), (form, out)
    assert "checked against the manifest beside the files" in _forms(job, tmp_path / "again", capsys)[1][2]


@pytest.mark.parametrize("emptied", ["zero-weights", "no-terms"])
def test_an_emptied_declaration_with_a_zeroed_spend_fails(job, tmp_path, capsys, emptied):
    folder = _copy(job, tmp_path)

    def doctor(table):
        table = _set(table, "epsilon_spent", 0.0)
        if emptied == "no-terms":
            return _set(table, "noise", json.dumps({"terms": []}))
        return _declarations(table, lambda d: {"terms": [[law, s, c, 0.0] for law, s, c, _ in d["terms"]]})

    _rewrite(folder, "count", doctor)
    _fails_everywhere(folder, tmp_path, capsys, "lack the noise declaration their mechanism writes")


def test_a_declaration_reweighted_to_a_lower_spend_fails(job, tmp_path, capsys):
    """Every weight divided by 1000 and the stated spend lowered to match: consistent with itself, but
    not what a k-ary tree of that budget declares at those steps."""
    folder = _copy(job, tmp_path)

    def doctor(table):
        table = _declarations(table, lambda d: {"terms": [[law, s, c, w / 1000] for law, s, c, w in d["terms"]]})
        return _set(table, "epsilon_spent", [e / 1000 for e in table.column("epsilon_spent").to_pylist()])

    _rewrite(folder, "count", doctor)
    _fails_everywhere(folder, tmp_path, capsys, "do not declare the noise their mechanism's public calibration gives")


def test_a_transform_relabelled_under_a_foreign_purpose_fails(job, tmp_path, capsys):
    folder = _copy(job, tmp_path)
    _rewrite(folder, "count", lambda t: _set(_set(t, "noise_domain", "ContinualSum"), "purpose", "x"))
    _fails_everywhere(folder, tmp_path, capsys, "carry purpose 'x', which that mechanism never writes")


@pytest.mark.parametrize("total", [math.inf, 0.0, -1.0])
def test_a_job_total_that_is_not_finite_and_positive_fails(job, tmp_path, capsys, total):
    folder = _copy(job, tmp_path)
    for name in ("sum", "count", "windowed"):
        _rewrite(folder, name, lambda t: _set(t, "job_epsilon_budget", total))
    _fails_everywhere(folder, tmp_path, capsys, "is not a finite epsilon > 0", "the releases state job totals")


@pytest.mark.parametrize("flag", [["--epsilon", "-1"], ["--epsilon", "0"], ["--epsilon", "inf"], ["--epsilon", "nan"],
                                  ["--delta", "1"], ["--delta", "-0.1"]])
def test_a_total_on_the_command_line_that_is_not_finite_and_positive_is_a_usage_error(job, capsys, flag):
    with pytest.raises(SystemExit) as ended:
        verify_main([job + "/*.parquet", *flag])
    assert ended.value.code == 2 and "error:" in capsys.readouterr().err


def test_a_deleted_transform_fails_in_the_glob_form(job, tmp_path, capsys):
    folder = _copy(job, tmp_path)
    for path in glob.glob(f"{folder}/count-*"):
        os.remove(path)
    forms = _forms(folder, tmp_path, capsys)
    for form, code, out in forms[:2]:
        assert code == 1 and "'ContinualCount/Sum''s release files" in out, (form, out)
    form, code, out = forms[2]  # nothing tells the verifier the job ran it, but the rows' job spend
    assert "WARNING: the releases state a job spend of epsilon up to 1" in out and "a transform's releases may " \
        "be missing" in out, out


def test_a_glob_leaving_out_a_declared_file_fails(job, tmp_path, capsys):
    code, out = _run([job + "/sum-*", job + "/windowed-*"], capsys)
    assert code == 1 and "count-00000-of-00001.parquet is not among the files given" in out, out


def test_an_exactly_duplicated_release_file_is_one_release(job, tmp_path, capsys):
    folder = _copy(job, tmp_path)
    shutil.copy(f"{folder}/sum-00000-of-00001.parquet", f"{folder}/sum-00000-of-00001-retry.parquet")
    shutil.copy(f"{folder}/sum-00000-of-00001.parquet", f"{folder}/sum-00000-of-00001-retry2.parquet")
    for form, code, out in _forms(folder, tmp_path, capsys):
        assert code == 0, (form, out)
        assert "ContinualSum: pure, spent (0.333333, 0) of (0.333333, 0) over 3360 releases" in out, (form, out)
        assert "6720 release(s) of 'ContinualSum' are exact copies of another" in out, (form, out)


def test_a_duplicated_file_that_differs_fails_with_capped_lines(job, tmp_path, capsys):
    """A second release of the same keys with other values (a second noise draw): a real clash, reported
    with the right cause, the first lines of each kind then a count."""
    folder = _copy(job, tmp_path)
    table = pq.read_table(f"{folder}/sum-00000-of-00001.parquet")
    values = [[x + 1.0 for x in v] for v in table.column("value").to_pylist()]
    pq.write_table(_set(table, "value", values), f"{folder}/sum-00000-of-00001-other.parquet")
    for form, code, out in _forms(folder, tmp_path, capsys):
        problems = [line for line in out.splitlines() if "PROBLEM" in line]
        assert code == 1 and "appears 2 times: two transforms share the noise domain" in out, (form, out)
        assert len(problems) <= PROBLEM_LINES + 1, (form, len(problems))
        assert f"and {3360 - PROBLEM_LINES} more problem(s) of this kind: duplicate" in out, (form, out)


def _plant(folder):
    """Files that are not releases, each holding the raw marker."""
    with open(f"{folder}/events.csv", "w") as fh:
        fh.write(f"stream,value\n{MARKER},1.0\n")
    with open(f"{folder}/dead_letter-00000-of-00001.jsonl", "w") as fh:
        fh.write(json.dumps({"stage": "parse", "reason": "bad", "element": MARKER}) + "\n")
    with open(f"{folder}/notes.jsonl", "w") as fh:
        fh.write(json.dumps({"stream": MARKER, "value": [1.0]}) + "\n")
    pq.write_table(pa.table({"stream": [MARKER], "value": [1.0]}), f"{folder}/raw.parquet")
    os.mkdir(f"{folder}/extra")
    with open(f"{folder}/extra/input.csv", "w") as fh:
        fh.write(f"{MARKER},2.0\n")
    return ["events.csv", "dead_letter-00000-of-00001.jsonl", "notes.jsonl", "raw.parquet", "extra/input.csv"]


def test_files_that_are_not_releases_fail_and_are_named_without_their_content(job, tmp_path, capsys):
    folder = _copy(job, tmp_path)
    planted = _plant(folder)
    code, out = _run([folder], capsys)
    assert code == 1 and MARKER not in out, out
    for name in planted:
        assert f"file {folder}/{name} in the job's folder is none of its declared transforms' release files" in out
    for args in ([folder + "/*"], [folder + "/*.parquet"]):
        code, out = _run(args, capsys)
        assert code == 1 and MARKER not in out and f"{folder}/raw.parquet" in out, (args, out)
    code, out = _run([folder + "/*"], capsys)
    assert "events.csv is not a release file (neither Parquet nor JSON lines)" in out, out
    assert "notes.jsonl is not a release table" in out, out
    bare = _copy(folder, tmp_path, "bare")
    os.remove(f"{bare}/{MANIFEST_NAME}")
    code, out = _run([bare + "/*"], capsys)
    assert code == 1 and MARKER not in out, out
    for name in planted[:-1]:  # the glob reaches the folder's own files
        assert f"{bare}/{name} is not a release" in out, (name, out)
