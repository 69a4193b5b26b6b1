"""The ERM job end to end: CLI on a small CSV equals the pure mechanism, bad rows to dead letters,
one-line usage errors, and a streaming run with a TestStream in place of Pub/Sub."""

from __future__ import annotations

import json

import numpy as np
import pytest

from beam_dp.beam import ContinualModelParams, SlidingWindowModelParams
from beam_dp.io import read_releases, release_to_row
from beam_dp.mechanisms.erm import LabelledRows
from pipelines import model_release
from tests.beam.helpers import domain_noise, labelled
from tests.pipelines.jobs_helpers import assert_usage_error, dead_letters, value_reasons_merged

pytestmark = pytest.mark.pipeline

CLASSES = ("a", "b", "c")
PROG = "python -m pipelines.model_release"


def _data(n=10, seed=0):
    rng = np.random.default_rng(seed)
    return {s: (rng.normal(size=(n, 3)), [CLASSES[i] for i in rng.integers(0, 3, n)]) for s in ("s1", "s2")}


def _expected(params, data, domain):
    """The pure mechanism per stream on blocks of ``block_size`` examples in file order, in the noise domain
    ``domain`` (the job applies the transform labelled with its class name)."""
    mech, rows, noise = params.build_mechanism(), [], domain_noise(params, domain)
    for stream, (x, y) in data.items():
        state, labels, unit = mech.init_state(stream), np.array([CLASSES.index(v) for v in y]), params.block_size
        for lo in range(0, len(x) - unit + 1, unit):
            state, rel = mech.step(state, LabelledRows(x[lo:lo + unit], labels[lo:lo + unit]), noise)
            rows += [release_to_row(r, mech.guarantee) for r in rel]
    return sorted(labelled(rows, params, domain), key=lambda r: (r.stream, r.step))


def _write_csv(path, data, extra=()):
    lines = ["stream_id,x_0,x_1,x_2,label"]
    for stream, (x, y) in data.items():
        lines += [f"{stream},{float(a)!r},{float(b)!r},{float(c)!r},{label}" for (a, b, c), label in zip(x, y)]
    path.write_text("\n".join(lines + list(extra)) + "\n")


def test_help_lists_the_job_flags(capsys):
    assert model_release.main(["--help"]) == 0
    text = capsys.readouterr().out
    for flag in ("--input", "--algorithm", "--classes", "--epsilon", "--update-size", "--block-size", "--window",
                 "--source", "--noise-key-file"):
        assert flag in text


@pytest.mark.parametrize("algorithm", ["continual", "sliding"])
def test_cli_on_a_csv_equals_the_pure_mechanism_and_dead_letters_bad_rows(tmp_path, capsys, algorithm):
    data = _data()
    bad = ["s1,0.1,0.2", "s1,0.1,0.2,0.3,z", "s2,nan,0.0,0.0,a", ",0.1,0.2,0.3,a", "s2,abc,0.0,0.0,b"]
    _write_csv(tmp_path / "train.csv", data, bad)
    out = tmp_path / "out"
    argv = [f"--input={tmp_path / 'train.csv'}", f"--output={out}", f"--algorithm={algorithm}", "--classes=a,b,c",
            "--epsilon=1.0", "--clip-bound=2.0"]
    if algorithm == "continual":
        argv += ["--update-size=2", "--base-size=4"]
        params = ContinualModelParams(n_features=3, classes=CLASSES, epsilon=1.0, clip_bound=2.0, update=2, base=4)
    else:
        argv += ["--block-size=2", "--window=6"]
        params = SlidingWindowModelParams(n_features=3, classes=CLASSES, epsilon=1.0, clip_bound=2.0, block=2,
                                          window=6)
    assert model_release.main(argv) == 0
    summary = capsys.readouterr().out
    want = _expected(params, data, "ContinualModelRelease" if algorithm == "continual" else "SlidingWindowModelRelease")
    assert want and f"models: {len(want)} releases" in summary
    got = read_releases(str(out / "models-*"))
    assert [(r["stream"], r["step"]) for r in got] == [(r.stream, r.step) for r in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g["value"], w.value, rtol=1e-9, atol=1e-12)
        assert g["epsilon_spent"] == w.epsilon_spent <= 1.0 and g["parts"] == w.parts
        assert (g["noise_domain"], g["composition"], g["job_epsilon_spent"]) == (
            w.noise_domain, w.composition, w.job_epsilon_spent)
    # a NaN feature and a text feature: value-level reasons (non_finite, bad_dtype today)
    assert value_reasons_merged(dead_letters(out)) == {"read:malformed": 1, "models:bad_label": 1,
                                                       "models:bad_input": 2, "models:bad_stream_id": 1}


@pytest.mark.parametrize("argv, fix", [
    (["--bogus=1"], "unknown flag --bogus"),
    (["--algorithm=magic"], "--algorithm"),
    (["--epsilon=0"], "epsilon"),
    (["--input=/no/such/file.csv"], "no files match --input"),
    (["--update-size=3", "--base-size=8"], "continual"),
    (["--source=kafka", "--streaming", "--kafka-topic=t", "--kafka-bootstrap-servers=h:9092"], "--dim is required"),
])
def test_usage_errors_are_one_line_with_exit_code_2(argv, fix, capsys, tmp_path):
    assert_usage_error(model_release.main, PROG, argv + [f"--output={tmp_path}"], fix, capsys)


def test_streaming_source_replaced_by_teststream_equals_the_pure_mechanism(tmp_path):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.test_stream import TestStream
    from apache_beam.testing.util import assert_that

    from tests.beam.helpers import rows_match

    data = _data(8, seed=3)
    messages = [json.dumps({"stream_id": s, "features": x[i].tolist(), "label": y[i]}).encode()
                for s, (x, y) in data.items() for i in range(len(y))]
    stream = (TestStream().add_elements(messages[:5]).add_elements([b"not json"]).add_elements(messages[5:])
              .advance_watermark_to_infinity())
    argv = ["--source=pubsub", "--pubsub-subscription=projects/p/subscriptions/s", "--streaming", "--dim=3",
            "--classes=a,b,c", "--update-size=2", "--base-size=4", f"--output={tmp_path}", "--format=jsonl"]
    options = PipelineOptions(argv)
    job = model_release.plan(options)
    params = ContinualModelParams(n_features=3, classes=CLASSES, epsilon=1.0, update=2, base=4)
    with beam.Pipeline(options=options) as p:
        out = model_release.build(p, job, options.view_as(model_release.ModelReleaseOptions), messages=stream)
        assert_that(out.releases, rows_match(_expected(params, data, "ContinualModelRelease")))
    assert dead_letters(tmp_path) == {"read:malformed": 1}
    assert len(read_releases(str(tmp_path / "models-*"))) == len(_expected(params, data, "ContinualModelRelease"))
