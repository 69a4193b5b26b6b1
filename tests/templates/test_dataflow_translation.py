"""Each job's pipeline translated for the DataflowRunner offline, never submitted: the Runner API proto
(what Dataflow Runner v2 receives) has the job's source (file match or Pub/Sub read), its stateful
steps, its release and dead-letter sinks, and the options name the runner without the key. With
``apache-beam[gcp]`` installed, the DataflowRunner's own ``--dry_run`` translation runs too.
A remote run returns once submitted (no ``wait_until_finish``)."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_runner_api_pb2

import tests.pipelines.memfs  # noqa: F401  (registers memfs://, standing in for gs://)
from pipelines import continual_stats, growing_db_queries, lifelong, model_release, online_learning
from pipelines.runner import options_class
from pipelines.runner import run as run_job
from tests.conftest import TEST_KEY
from tests.pipelines.jobs_helpers import FakeSecretManager, user_functions
from tests.pipelines.memfs import MemFileSystem

pytestmark = pytest.mark.pipeline

SECRET = "projects/my-project/secrets/dp-key/versions/1"
DATAFLOW = ["--runner=DataflowRunner", "--project=my-project", "--region=us-central1",
            "--temp_location=gs://my-bucket/tmp", "--staging_location=gs://my-bucket/staging",
            "--output=memfs://bucket/out", f"--noise-key-secret={SECRET}"]
STREAM = ["--streaming", "--source=pubsub", "--pubsub-subscription=projects/my-project/subscriptions/events"]
FILES = {
    "memfs://bucket/in/events.csv": "stream_id,timestamp,value\na,1,0.5\n",
    "memfs://bucket/in/examples.csv": "stream_id,x_0,x_1,label\na,0.1,0.2,1\n",
    "memfs://bucket/in/tasks.csv": "stream_id,task_id,x_0,x_1,label\na,0,0.1,0.2,1\n",
    "memfs://bucket/in/elements.csv": "stream_id,timestamp,colour\na,1,red\n",
    "memfs://bucket/in/queries.jsonl": '{"stream_id": "a", "query_id": "q", "t": 1, "indices": [0]}\n',
}
#: job -> (module, batch flags, streaming flags, outputs, stateful transform labels)
JOBS = {
    "continual_stats": (continual_stats, ["--input=memfs://bucket/in/events.csv", "--start=0", "--period=10",
                                          "--end=30", "--count", "--window=4"],
                        ["--dim=1", "--start=0", "--period=10", "--count", "--window=4"],
                        ("sum", "count", "windowed"), ("ContinualSum", "ContinualCount", "WindowedSum")),
    "model_release": (model_release, ["--input=memfs://bucket/in/examples.csv", "--classes=0,1"],
                      ["--dim=2", "--classes=0,1"], ("models",), ("ContinualModelRelease",)),
    "growing_db_queries": (growing_db_queries, ["--input=memfs://bucket/in/elements.csv",
                                                "--queries=memfs://bucket/in/queries.jsonl",
                                                '--universe={"colour": ["red", "blue"]}', "--start=0",
                                                "--period=10", "--end=30"],
                           ['--universe={"colour": ["red", "blue"]}', "--start=0", "--period=10"],
                           ("answers",), ("GrowingDatabaseQueries",)),
    "online_learning": (online_learning, ["--input=memfs://bucket/in/examples.csv"], ["--dim=2"], ("models",),
                        ("OnlineLearner",)),
    "lifelong": (lifelong, ["--input=memfs://bucket/in/tasks.csv", "--tasks=0", "--classes=0,1", "--task-size=64"],
                 ["--dim=2", "--tasks=0", "--classes=0,1", "--task-size=64"], ("models",), ("LifelongLearner",)),
}


@pytest.fixture(autouse=True)
def _secret(monkeypatch):
    """The launch reads --noise-key-secret (as the workers will): a fake Secret Manager holds the key."""
    from beam_dp.io import keys

    monkeypatch.setattr(keys, "secret_manager_client", lambda: FakeSecretManager(TEST_KEY))


@pytest.fixture(autouse=True)
def _inputs():
    MemFileSystem.clear()
    MemFileSystem.files.update({k: v.encode() for k, v in FILES.items()})
    yield
    MemFileSystem.clear()


def _translate(job: str, streaming: bool):
    module, batch, stream, _, _ = JOBS[job]
    options = PipelineOptions(DATAFLOW + (STREAM + stream if streaming else batch))
    plan = module.plan(options)
    pipeline = beam.Pipeline(options=options)
    module.build(pipeline, plan, options.view_as(options_class(job)))
    return options, pipeline, pipeline.to_runner_api()


def _leaves(proto) -> dict[str, beam_runner_api_pb2.PTransform]:
    return {t.unique_name: t for t in proto.components.transforms.values() if not t.subtransforms}


def _stateful(transform) -> bool:
    if transform.spec.urn != "beam:transform:pardo:v1":
        return False
    payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
    return bool(payload.state_specs or payload.timer_family_specs)


@pytest.mark.parametrize("streaming", [False, True], ids=["batch", "streaming"])
@pytest.mark.parametrize("job", sorted(JOBS))
def test_job_translates_for_dataflow_offline(job, streaming):
    options, _, proto = _translate(job, streaming)
    leaves = _leaves(proto)
    _, _, _, outputs, transforms = JOBS[job]
    urns = {t.spec.urn for t in leaves.values()}
    if streaming:
        assert "beam:transform:pubsub_read:v1" in urns  # Dataflow's native Pub/Sub source
    else:
        assert "beam:transform:impulse:v1" in urns and "beam:transform:pubsub_read:v1" not in urns
        assert any("/Match" in name for name in leaves)  # the file pattern is matched on the workers
    stateful = {name.split("/")[0] for name, t in leaves.items() if _stateful(t)}
    grouped = {name.split("/")[0] for name, t in leaves.items() if t.spec.urn == "beam:transform:group_by_key:v1"}
    # state and timers live in the family's own transform; a batch replay of the sums, ERM and the learners
    # releases each key in one call after a grouping instead (docs/steps.md, two Beam shells)
    assert set(transforms) <= (stateful if streaming else stateful | grouped), (stateful, grouped)
    for name in outputs:  # a sink per output, and the dead letters
        assert any(n.startswith(f"Write-{name}") for n in leaves), name
    assert any(n.startswith("WriteDeadLetters") for n in leaves)
    fns = user_functions(proto)  # Beam compresses pickled functions: search them uncompressed
    assert SECRET.encode() in fns and TEST_KEY not in fns and TEST_KEY.hex().encode() not in fns
    flags = options.get_all_options()
    assert flags["runner"] == "DataflowRunner" and flags["streaming"] is streaming


def test_a_remote_run_returns_once_submitted(monkeypatch):
    class Submitted:
        def job_id(self):
            return "2026-11-25_job"

        def wait_until_finish(self):
            raise AssertionError("a template or remote launch must not block")

    options, _, _ = _translate("continual_stats", streaming=True)
    monkeypatch.setattr(beam.Pipeline, "run", lambda self: Submitted())
    plan = continual_stats.plan(options)
    text = run_job(options, continual_stats.JOB, plan)
    assert text.startswith("beam_dp continual_stats: submitted to DataflowRunner as job 2026-11-25_job")


@pytest.mark.parametrize("job", sorted(JOBS))
def test_dataflow_runner_dry_run_translation(job):
    pytest.importorskip("apitools", reason="the DataflowRunner itself needs apache-beam[gcp]")
    _, pipeline, _ = _translate(job, streaming=False)
    pipeline._options.view_as(beam.options.pipeline_options.TestOptions).dry_run = True  # never submitted
    result = pipeline.run()
    assert result.job.proto.steps or result.job.proto_pipeline
