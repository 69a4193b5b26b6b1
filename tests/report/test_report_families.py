"""The report on the real releases of every family (through their Beam transforms): no crash, a value
figure per mechanism whose title only promises noise bands it draws, accuracy where snapshots carry it
(lifelong snapshots carry a per-task mapping), and one-line errors on files that are not releases."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_dp.io import RELEASE_SCHEMA, read_releases
from beam_dp.report.__main__ import main
from beam_dp.report.figures import accuracy, noise_std
from tests.reliability import targets
from tests.reliability.harness import run_pipeline

FAMILIES = {
    "sum": targets.continual_sum,
    "erm": lambda: targets.erm_targets()[1],
    "online": targets.online_learner,
    "regression": targets.incremental_regression,
    "growing_db": targets.growing_db,
}


def _lifelong_with_eval_sets():
    from beam_dp.beam import LifelongLearner, LifelongParams
    from beam_dp.mechanisms.lifelong import BoundedAGEMConfig

    rng = np.random.default_rng(0)
    eval_x = rng.integers(-4, 5, (32, 4)) / 8.0
    config = BoundedAGEMConfig(input_dim=4, n_classes=2, hidden=4, g_layers=(4,), batch_size=4, epochs=1,
                               task_ids=("t0", "t1"), device="cpu", epsilon=1.0, delta=1e-5, task_size=8,
                               eval_sets={"t0": (eval_x, (eval_x[:, 0] > 0).astype(int)),
                                          "t1": (eval_x, (eval_x[:, 1] > 0).astype(int))})
    params = LifelongParams(config, streams=("a",), allow_cuda=False, torch_threads=1)
    good = [("a", ("t0", "t1")[i // 8], (rng.integers(-4, 5, 4) / 8.0).tolist(), int(i % 2)) for i in range(16)]
    return targets.Target("LifelongLearner", targets._simple(lambda: LifelongLearner(params)), good, None)


def _write(target, folder) -> int:
    out = run_pipeline(lambda p: target.build(p, list(target.good)))
    assert out.releases
    pq.write_table(pa.Table.from_pylist([r._asdict() for r in out.releases], schema=RELEASE_SCHEMA),
                   folder / "releases-00000-of-00001.parquet")
    return len(out.releases)


@pytest.mark.parametrize("family", [*FAMILIES, "lifelong"])
def test_report_handles_every_family(family, tmp_path, capsys):
    if family == "lifelong":
        pytest.importorskip("torch")
    target = _lifelong_with_eval_sets() if family == "lifelong" else FAMILIES[family]()
    n = _write(target, tmp_path)
    out = tmp_path / "report"
    assert main([str(tmp_path / "releases-*"), "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"beam_dp report: {n} release rows from 1 files")
    summary = json.loads((out / "summary.json").read_text())
    rows = read_releases(str(tmp_path / "releases-*"))
    for mechanism in {r["mechanism"] for r in rows}:
        assert f"values_{mechanism}.png" in summary["figures"]
    assert ("accuracy.png" in summary["figures"]) == any(accuracy(r["meta"]) is not None for r in rows)
    if family == "lifelong":
        assert "accuracy.png" in summary["figures"]  # the per-task mapping that used to crash float()
    if family in ("sum", "erm"):  # both report their error law: the bands are drawn
        assert all(np.isfinite(noise_std(r["meta"], len(r["value"]))) and noise_std(r["meta"], len(r["value"])) > 0
                   for r in rows)


def test_model_noise_std_follows_the_output_perturbation_law():
    assert noise_std({"law": "gaussian", "noise_scale": 0.5}, 8) == 0.5
    # K-norm in d = 8 dimensions: each coordinate has variance (d + 1) b^2
    assert noise_std({"law": "gamma", "noise_scale": 0.5}, 8) == pytest.approx(1.5)
    assert np.isnan(noise_std({"x": 1}, 8))
    assert accuracy({"accuracy": {"t1": 0.5, "t2": 1.0}, "average_accuracy": 0.75}) == 0.75
    assert accuracy({"accuracy": {}, "average_accuracy": None}) is None


@pytest.mark.parametrize("content", ["a,b\n1,2\n", '{"x": 1}\n', "\x00\x01 not parquet"])
def test_a_file_that_is_not_releases_is_a_one_line_error(content, tmp_path, capsys):
    bad = tmp_path / "releases.csv"
    bad.write_text(content)
    with pytest.raises(SystemExit) as exc:
        main([str(bad), "--out", str(tmp_path / "r")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not a beam_dp release file" in err, err
    assert "Expecting value" not in err
