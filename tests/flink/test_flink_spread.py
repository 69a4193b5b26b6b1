"""Work spread at parallelism > 1: a single input file gives every parse subtask a split, and the stream
groups' Flink keys (:func:`beam_dp.flink.blocks.group_keys`) give every release subtask a group. The key
arithmetic runs in any venv; the checks against Flink itself (its key-group assignment, a MiniCluster job's
subtasks) need .venv-flink and are skipped elsewhere."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from beam_dp.flink.blocks import MIN_SPLIT_BYTES, file_splits, group_keys, key_group, subtask_of
from beam_dp.mechanisms.stream_groups import group_key


def _counts(keys, parallelism: int) -> list[int]:
    held = Counter(subtask_of(k, parallelism) for k in keys)
    return [held.get(i, 0) for i in range(parallelism)]


def test_bare_group_keys_leave_a_subtask_idle_where_the_spread_keys_do_not():
    bare = [group_key(g) for g in range(4)]
    assert 0 in _counts(bare, 4)  # why the keys are salted: the bare keys put 4 groups on 3 subtasks
    assert _counts(group_keys(4), 4) == [1, 1, 1, 1]
    assert _counts(group_keys(4), 2) == [2, 2]
    assert _counts(group_keys(16), 4) == [4, 4, 4, 4]


@pytest.mark.parametrize("groups", [1, 2, 3, 4, 5, 8, 13, 16, 31, 64])
def test_every_subtask_gets_a_group_at_every_parallelism_up_to_the_groups(groups):
    keys = group_keys(groups)
    for parallelism in range(1, min(groups, 16) + 1):
        counts = _counts(keys, parallelism)
        assert min(counts) >= 1 and max(counts) - min(counts) <= 2, (parallelism, counts)


def test_a_salt_only_places_its_group():
    keys = group_keys(8)
    assert [k.split("/", 1)[0] for k in keys] == [group_key(g) for g in range(8)]
    assert len(set(keys)) == 8 and keys == group_keys(8)  # the same keys at every call, whatever the parallelism


def test_one_file_is_split_for_every_parse_subtask(tmp_path):
    path = tmp_path / "events.csv"
    path.write_bytes(b"a,1.0,0.5\n" * (MIN_SPLIT_BYTES // 10 * 4 + 7))  # just over 4 MiB
    size = path.stat().st_size
    for parallelism, splits in ((1, 1), (2, 2), (4, 4), (64, 5)):  # never below MIN_SPLIT_BYTES a split
        got = file_splits(str(path), 64 << 20, parallelism)
        assert len(got) == splits, parallelism
        assert [(s, e) for _, s, e in got] == [(s, min(s + got[0][2], size)) for s in range(0, size, got[0][2])]
    assert len(file_splits(str(path), 1 << 20, 1)) == 5  # --split-mib still caps a split


def test_key_groups_are_flinks():
    """:func:`key_group` against Flink's own ``KeyGroupRangeAssignment`` of PyFlink's key (a one-field Row)."""
    pytest.importorskip("pyflink")
    from pyflink.java_gateway import get_gateway

    gateway = get_gateway()
    assign, row = gateway.jvm.org.apache.flink.runtime.state.KeyGroupRangeAssignment, gateway.jvm.org.apache.flink.types.Row
    keys = list(group_keys(16)) + [group_key(g) for g in range(16)] + ["", "a", "é/日本", "x" * 40, "\U0001F600"]
    for key in keys:
        java = row.withPositions(1)
        java.setField(0, key)
        assert assign.assignToKeyGroup(java, 128) == key_group(key), key
        assert assign.assignToKeyGroup(java, 256) == key_group(key, 256), key


@pytest.mark.slow
def test_a_job_at_parallelism_4_parses_and_releases_on_every_subtask(tmp_path, monkeypatch):
    """A MiniCluster job at parallelism 4: the splits of one file reach all 4 parse subtasks, and the keys
    of :func:`group_keys` reach the release subtasks :func:`subtask_of` names (all 4)."""
    pytest.importorskip("pyflink")
    from pyflink.common import Types
    from pyflink.datastream.functions import KeyedProcessFunction, MapFunction

    from beam_dp.flink.job import block_events, local_environment
    from beam_dp.flink.params import FlinkReleaseParams
    from tests.flink.cases import BUILD, CLOCK

    class Parsed(MapFunction):
        def open(self, runtime_context):
            self.index = runtime_context.get_index_of_this_subtask()

        def map(self, value):
            return f"parse\t{self.index}"

    class Placed(KeyedProcessFunction):
        def open(self, runtime_context):
            self.index = runtime_context.get_index_of_this_subtask()

        def process_element(self, value, ctx):
            yield f"{ctx.get_current_key()}\t{self.index}"

    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    path = tmp_path / "events.csv"
    path.write_text("".join(f"s{i % 50},{CLOCK.start + CLOCK.period * (i % 3)},0.125,0.25\n" for i in range(220_000)))
    assert path.stat().st_size > 4 * MIN_SPLIT_BYTES  # 4 splits at parallelism 4
    env = local_environment(4)
    events, _ = block_events(env, file_splits(str(path), 64 << 20, 4), FlinkReleaseParams(build=BUILD, clock=CLOCK))
    keys = group_keys(4)
    placed = (env.from_collection(list(keys), type_info=Types.STRING())
              .key_by(lambda k: k, key_type=Types.STRING()).process(Placed(), output_type=Types.STRING()))
    seen: dict[str, set] = {}
    with events.map(Parsed(), output_type=Types.STRING()).union(placed).execute_and_collect() as records:
        for record in records:
            name, index = record.split("\t")
            seen.setdefault(name, set()).add(int(index))
    assert seen["parse"] == {0, 1, 2, 3}
    assert {k: seen[k] for k in keys} == {k: {subtask_of(k, 4)} for k in keys} == {k: {i} for i, k in enumerate(keys)}


def test_a_grouped_release_function_has_its_own_operator_uid():
    """A savepoint of a job keyed by the bare group keys holds the groups' state under other keys, which a
    resume would leave behind (the groups restarting from nothing, releasing their steps again with the
    same noise): the grouped function's operator uid is its own, so Flink maps no such state to it and
    refuses that savepoint at start. A function keyed by stream keeps its domain's uid, and a domain is
    claimed once in a job either way."""
    pytest.importorskip("pyflink")
    from functools import partial

    from beam_dp.flink.job import EVENT_TYPE, GROUPED_UID, local_environment, release_stream, to_event
    from beam_dp.flink.params import FlinkReleaseParams
    from beam_dp.mechanisms.sums import BLTSum
    from tests.flink.cases import CLOCK

    build = partial(BLTSum, horizon=CLOCK.last_step, dim=2, epsilon=1.0, delta=1e-6, clip_bound=1.0, noise="gaussian")
    env = local_environment(1)
    events = env.from_collection([to_event("a", CLOCK.start, [0.1, 0.2])], type_info=EVENT_TYPE)
    grouped = FlinkReleaseParams(build=build, clock=CLOCK, stream_groups=4)
    release_stream(env, events, grouped, uid="grouped", stamp=False)
    release_stream(env, events, FlinkReleaseParams(build=build, clock=CLOCK), uid="by-stream", stamp=False)
    uids = {t.getUid() for t in env._j_stream_execution_environment.getTransformations() if t.getUid()}
    assert {"beam_dp/grouped" + GROUPED_UID, "beam_dp/by-stream"} <= uids and "beam_dp/grouped" not in uids
    for params, uid in ((grouped, "grouped"), (FlinkReleaseParams(build=build, clock=CLOCK, stream_groups=4),
                                               "by-stream")):
        with pytest.raises(ValueError, match="already claimed"):
            release_stream(env, events, params, uid=uid, stamp=False)
