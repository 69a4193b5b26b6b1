"""``python -m beam_dp.flink.run`` writes the job's manifest into --output and ``python -m beam_dp.verify
<output>`` passes on the honest releases (issue 23, "Done when": Flink output); a doctored copy (every
``epsilon_spent`` 0, or the release files gone) fails. Needs .venv-flink (``make flink-test``)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("pyflink")

from beam_dp.io.manifest import MANIFEST_NAME, read_manifest  # noqa: E402
from beam_dp.verify import main as verify_main  # noqa: E402
from tests.conftest import TEST_KEY  # noqa: E402
from tests.flink.cases import csv_lines, entry_args, good_events  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def output(tmp_path_factory) -> Path:
    """One honest run of the entry point on CSV events (a few seconds of MiniCluster start-up)."""
    from beam_dp.flink.run import main

    tmp = tmp_path_factory.mktemp("flink")
    (tmp / "in").mkdir()
    (tmp / "in" / "events.csv").write_text(csv_lines(good_events(12)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        mp.setenv("BEAM_DP_NOISE_KEY", TEST_KEY.hex())
        assert main(entry_args(tmp / "in", tmp / "out", "--noise-domain", "sums-job-7")) == 0
    return tmp / "out"


def _release_files(folder: Path) -> list[Path]:
    return [f for f in folder.rglob("part-*") if f.is_file()]


def _verdict(folder: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = verify_main([str(folder)])
    return code, capsys.readouterr().out


def test_the_flink_output_has_a_manifest_and_verifies(output, capsys):
    manifest = read_manifest(str(output))
    assert [(t.noise_domain, t.mechanism, t.composition, t.files) for t in manifest.transforms] == [
        ("sums-job-7", "hybrid_tree", "pure", ("*/part",))]
    assert (manifest.epsilon, manifest.delta) == (1.0, 0.0)  # the entry point's default --epsilon, pure
    assert _release_files(output)
    code, said = _verdict(output, capsys)
    assert code == 0 and "sums-job-7: pure" in said and said.rstrip().endswith("verified: within the job's total"), said


def test_a_doctored_flink_output_fails(output, tmp_path, capsys):
    folder = tmp_path / "copy"
    shutil.copytree(output, folder)
    for path in _release_files(folder):  # every stated spend 0: the noise declarations say otherwise
        rows = [json.loads(line) for line in path.read_text().splitlines() if line]
        path.write_text("".join(json.dumps(dict(r, epsilon_spent=0.0)) + "\n" for r in rows))
    code, said = _verdict(folder, capsys)
    assert code == 1 and "below the spend recomputed from its noise declaration" in said, said
    for path in _release_files(folder):
        path.unlink()
    code, said = _verdict(folder, capsys)
    assert code == 1 and "are missing" in said and (folder / MANIFEST_NAME).exists(), said
