"""One calibration rule on both engines: the Beam job (``pipelines.continual_stats``) and the native Flink
entry (``beam_dp.flink.run``) given the same flags build the same mechanism at the same budget share
(``beam_dp.core.budget.flag_budget``): the same guarantee and the same noise variance at every public
step, to the last bit. Neither side imports PyFlink, so this runs in either venv."""

from __future__ import annotations

import pytest

pytest.importorskip("apache_beam")

from beam_dp.core.noise import KEY_ENV_VAR  # noqa: E402
from tests.conftest import TEST_KEY  # noqa: E402

START, PERIOD, END = 100.0, 5.0, 150.0  # 10 public steps

FLAGS = [
    ["--epsilon", "1.0"],
    ["--epsilon", "0.3", "--counter", "tree"],
    ["--epsilon", "2.0", "--counter", "honaker", "--clip-bound", "3.0"],
    ["--epsilon", "1.0", "--delta", "1e-6", "--noise", "gaussian"],
    ["--epsilon", "0.7", "--delta", "1e-5", "--noise", "gaussian", "--counter", "tree"],
    ["--epsilon", "0.7", "--delta", "1e-5", "--noise", "gaussian", "--counter", "tree", "--calibration", "paper"],
    ["--epsilon", "1.5", "--delta", "1e-7", "--noise", "gaussian", "--counter", "toeplitz"],
]


def _engines(tmp_path, flags: list[str]):
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_dp.flink.run import _args, _params
    from pipelines import continual_stats

    events = tmp_path / "events.csv"
    events.write_text("stream_id,timestamp,value_0,value_1\na,101.0,0.5,0.25\n")
    common = ["--start", str(START), "--period", str(PERIOD), "--end", str(END), *flags]
    beam = continual_stats.plan(PipelineOptions(["--input", str(events), "--output", str(tmp_path / "beam"),
                                                 *common])).params["sum"]
    flink = _params(_args(["--input", str(events), "--output", str(tmp_path / "flink"), "--dim", "2", *common]))
    return beam, flink


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: " ".join(f))
def test_matching_flags_calibrate_the_same_numbers_on_beam_and_flink(tmp_path, monkeypatch, flags):
    monkeypatch.setenv(KEY_ENV_VAR, TEST_KEY.hex())
    beam, flink = _engines(tmp_path, flags)
    b, f = beam.build_mechanism(), flink.build_mechanism()
    assert type(b) is type(f)
    assert (b.guarantee.epsilon, b.guarantee.delta) == (f.guarantee.epsilon, f.guarantee.delta)
    assert (beam.budget.epsilon, beam.budget.delta, beam.budget.composition) == (
        flink.budget.epsilon, flink.budget.delta, flink.budget.composition)
    assert (beam.budget.plan.epsilon, beam.budget.plan.delta) == (flink.budget.plan.epsilon, flink.budget.plan.delta)
    assert [b.noise_var(t) for t in range(1, 11)] == [f.noise_var(t) for t in range(1, 11)]
    epsilon = float(flags[flags.index("--epsilon") + 1])
    assert f.guarantee.epsilon <= epsilon and flink.budget.plan.epsilon == epsilon  # held back, never above


def test_the_flink_manifest_declares_the_flags_total_and_the_share(tmp_path, monkeypatch):
    from beam_dp.flink.run import job_manifest

    monkeypatch.setenv(KEY_ENV_VAR, TEST_KEY.hex())
    _, flink = _engines(tmp_path, ["--epsilon", "1.0", "--delta", "1e-6", "--noise", "gaussian"])
    manifest = job_manifest(flink)
    (transform,) = manifest.transforms
    assert (manifest.epsilon, manifest.delta) == (1.0, 1e-6)
    mechanism = flink.build_mechanism()
    assert (transform.epsilon, transform.delta) == (mechanism.guarantee.epsilon, mechanism.guarantee.delta)
    assert transform.epsilon < 1.0 and transform.delta <= 1e-6
