"""``pipelines.local_runner``: the in-process runner's grouped inputs leave in pieces, unchanged; Beam's
methods are back when the block ends; a Beam release other than the checked one is left alone, with a
WARNING; a job's releases are the same with and without it.

Each change is checked against Beam's own code on the same input, called directly (not through Beam's
classes, which are Beam's own outside a block). The tests of Beam's internals skip on another Beam release."""

from __future__ import annotations

import contextlib
import logging
import threading

import apache_beam as beam
import numpy as np
import pytest
from apache_beam import coders
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.portability.fn_api_runner import execution
from apache_beam.runners.worker import bundle_processor, data_plane
from apache_beam.transforms import core, window
from apache_beam.utils.windowed_value import WindowedValue

from beam_dp.io import read_releases
from pipelines import continual_stats, local_runner, runner
from pipelines.local_runner import CHECKED_BEAM, tuned_local_runner

pytestmark = pytest.mark.pipeline

checked = pytest.mark.skipif(beam.__version__ != CHECKED_BEAM, reason=f"pipelines.local_runner replaces internals of "
                             f"Beam {CHECKED_BEAM} only; this is Beam {beam.__version__}")


def _beams(function):
    """Beam's own function, also inside a block of ``tuned_local_runner``."""
    return getattr(function, "__wrapped__", function)


_KV = coders.TupleCoder([coders.StrUtf8Coder(), coders.PickleCoder()])
_GROUPED = coders.TupleCoder([coders.StrUtf8Coder(), coders.IterableCoder(coders.PickleCoder())])


def _filled_buffer(keys: int, values_per_key: int, floats: int) -> execution.GroupingBuffer:
    buffer = execution.GroupingBuffer(coders.WindowedValueCoder(_KV), coders.WindowedValueCoder(_GROUPED),
                                      core.Windowing(window.GlobalWindows()))
    rng = np.random.default_rng(0)
    stream = coders.WindowedValueCoder(_KV).get_impl()
    for _v in range(values_per_key):
        out = beam.coders.coder_impl.create_OutputStream()
        for k in range(keys):
            value = WindowedValue((f"key-{k:04d}", rng.standard_normal(floats)), 0, [window.GlobalWindow()])
            stream.encode_to_stream(value, out, True)
        _beams(execution.GroupingBuffer.append)(buffer, out.get())  # Beam's table, also once a job applied ours
    return buffer


def _spilled(buffer: execution.GroupingBuffer) -> local_runner.SpilledValues:
    spill = local_runner.spilled(buffer)
    assert spill is not None
    return spill


def _spill_all(buffer: execution.GroupingBuffer, rows: list[bytes]) -> None:
    for data in rows:
        local_runner._append(buffer, data)


def _encoded_rows(keys: int, values_per_key: int, floats: int, seed: int = 0) -> list[bytes]:
    """``values_per_key`` data messages, each one value of every key (keys interleaved, as a shuffle's)."""
    rng = np.random.default_rng(seed)
    stream = coders.WindowedValueCoder(_KV).get_impl()
    rows = []
    for _v in range(values_per_key):
        out = beam.coders.coder_impl.create_OutputStream()
        for k in range(keys):
            value = WindowedValue((f"key-{k:04d}", rng.standard_normal(floats)), 0, [window.GlobalWindow()])
            stream.encode_to_stream(value, out, True)
        rows.append(out.get())
    return rows


def _buffer() -> execution.GroupingBuffer:
    return execution.GroupingBuffer(coders.WindowedValueCoder(_KV), coders.WindowedValueCoder(_GROUPED),
                                    core.Windowing(window.GlobalWindows()))


@checked
def test_spilled_pieces_joined_are_beams_bytes_and_the_values_wait_on_disk():
    # 300 keys x 4 values x 8 KB: ~10 MB encoded, so about two pieces of 8 MB
    rows = _encoded_rows(300, 4, 1024)
    ours, beams = _buffer(), _filled_buffer(300, 4, 1024)
    _spill_all(ours, rows)
    spill = _spilled(ours)
    assert not ours._table and spill._size > 300 * 4 * 8192  # nothing decoded is kept, the file holds it
    pieces = spill.pieces(local_runner.PIECE_BYTES)
    assert len(pieces) >= 2 and [k for piece in pieces for k in piece] == list(spill.spans)
    whole = _beams(execution.GroupingBuffer.partition)(beams, 1)[0]
    assert len(whole) == 1 and b"".join(spill.take(keys) for keys in pieces) == whole[0]
    assert not spill.spans and spill._file.closed  # read once, then gone


@checked
def test_a_partition_for_several_workers_is_beams_own():
    ours, beams = _buffer(), _filled_buffer(40, 2, 16)
    _spill_all(ours, _encoded_rows(40, 2, 16))
    assert local_runner._partition(ours, 3) == _beams(execution.GroupingBuffer.partition)(beams, 3)
    assert local_runner._partition(ours, 3) is ours._grouped_output  # partitioned once, as Beam's


@checked
def test_an_extended_spilled_buffer_is_beams_extended_buffer():
    ours, other = _buffer(), _buffer()
    _spill_all(ours, _encoded_rows(20, 2, 8, seed=1))
    _spill_all(other, _encoded_rows(30, 3, 8, seed=2))
    local_runner._extend(ours, other)
    beams, beams_other = _buffer(), _buffer()
    for buffer, rows in ((beams, _encoded_rows(20, 2, 8, seed=1)), (beams_other, _encoded_rows(30, 3, 8, seed=2))):
        for data in rows:
            _beams(execution.GroupingBuffer.append)(buffer, data)
    _beams(execution.GroupingBuffer.extend)(beams, beams_other)
    assert local_runner._partition(ours, 1) == _beams(execution.GroupingBuffer.partition)(beams, 1)


@checked
def test_windowed_and_other_buffers_stay_beams():
    windowed = execution.GroupingBuffer(coders.WindowedValueCoder(_KV), coders.WindowedValueCoder(_GROUPED),
                                        core.Windowing(window.FixedWindows(10)))
    other_values = execution.GroupingBuffer(coders.WindowedValueCoder(_KV),
                                            coders.WindowedValueCoder(coders.TupleCoder(
                                                [coders.StrUtf8Coder(), coders.IterableCoder(coders.BytesCoder())])),
                                            core.Windowing(window.GlobalWindows()))
    assert local_runner.spilled(windowed) is None and local_runner.spilled(other_values) is None
    local_runner._append(windowed, _encoded_rows(3, 1, 2)[0])
    assert len(windowed._table) == 3  # Beam's own table


def _data(instruction: str, payload: bytes, last: bool = False):
    return beam_fn_api_pb2.Elements.Data(instruction_id=instruction, transform_id="t", data=payload, is_last=last)


@checked
def test_read_messages_leave_the_channel_and_the_others_stay():
    messages = [_data("a", b"1"), _data("b", b"2"), _data("a", b""), _data("a", b"3"),
                beam_fn_api_pb2.Elements.Timers(instruction_id="a", transform_id="t", timers=b"x"),
                _data("a", b"", last=True)]
    ours, beams = data_plane.InMemoryDataChannel(), data_plane.InMemoryDataChannel()
    ours._inputs, beams._inputs = list(messages), list(messages)
    read = local_runner._releasing_inputs(ours, "a", None)
    first = next(read)
    assert first == messages[0] and not any(m is first for m in ours._inputs)
    assert [first, *read] == list(_beams(data_plane.InMemoryDataChannel.input_elements)(beams, "a", None))
    assert ours._inputs == beams._inputs == [messages[1]]


class _Worker:
    def __init__(self, channel):
        self.data_conn = channel


@checked
def test_each_piece_is_sent_once_the_buffer_is_full():
    channel = data_plane.InMemoryDataChannel()
    sender = type("Sender", (), {"_worker_handler": _Worker(channel)})()
    pieces = [b"x" * (6 << 20), b"y" * (6 << 20), b"z" * 10]
    local_runner._send_in_pieces(sender, "bundle", "read", pieces)
    sent = [m for m in channel.inverse()._inputs if isinstance(m, beam_fn_api_pb2.Elements.Data)]
    assert len([m for m in sent if m.data]) == 2  # 12 MB flushed past the 10 MB threshold, then the rest
    assert b"".join(m.data for m in sent) == b"".join(pieces)


@checked
def test_a_grouped_input_is_handed_on_once_piece_by_piece():
    ours, beams = _buffer(), _filled_buffer(300, 4, 1024)
    _spill_all(ours, _encoded_rows(300, 4, 1024))
    whole = _beams(execution.GroupingBuffer.partition)(beams, 1)[0][0]
    channel = data_plane.InMemoryDataChannel()
    sender = type("Sender", (), {"_worker_handler": _Worker(channel)})()
    local_runner._send_in_pieces(sender, "bundle", "read", ours)
    waiting = [m for m in channel.inverse()._inputs if isinstance(m, local_runner._Piece)]
    assert len(waiting) >= 2 and not ours._grouped_output  # nothing read yet: the pieces wait on disk
    read = list(local_runner._releasing_inputs(channel.inverse(), "bundle", None))
    assert all(isinstance(m, beam_fn_api_pb2.Elements.Data) for m in read)
    assert all(len(m.data) < 64 for m in read)  # the messages name their bytes, held until the worker takes them
    assert b"".join(local_runner._HELD.pop(m.data) for m in read) == whole
    assert all(piece.spill is None for piece in waiting) and not channel.inverse()._inputs
    with pytest.raises(RuntimeError, match="read twice"):
        local_runner._partition(ours, 1)


@checked
def test_a_workers_output_reaches_a_spilled_buffer_as_it_is_flushed():
    runner_side = data_plane.InMemoryDataChannel()
    buffer = _buffer()
    runner_side._beam_dp_deliver = {"write": buffer}
    out = local_runner._delivering_output_stream(runner_side.inverse(), "bundle", "write")
    rows = _encoded_rows(5, 2, 4)
    out.write(rows[0])
    out.flush()
    assert list(_spilled(buffer).spans) and not runner_side._inputs  # in the buffer, not queued
    out.write(rows[1])
    out.close()
    beams = _filled_buffer(5, 2, 4)
    assert local_runner._partition(buffer, 1) == _beams(execution.GroupingBuffer.partition)(beams, 1)
    other = local_runner._delivering_output_stream(runner_side.inverse(), "bundle", "another")
    other.write(b"x")
    other.close()
    assert [m.data for m in runner_side._inputs] == [b"x"]  # not registered: Beam's message


def _methods() -> list:
    return [owner.__dict__.get(name) for owner, name, _ in local_runner._replacements()]


def test_another_beam_release_is_left_alone_with_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(beam, "__version__", CHECKED_BEAM + ".post1")  # the exact release, not its major.minor
    before = _methods()
    with caplog.at_level(logging.WARNING, logger="beam_dp.local_runner"), tuned_local_runner() as applied:
        assert applied is False and _methods() == before
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "left as they are" in caplog.records[0].getMessage()
    assert runner._OwnWarnings().filter(caplog.records[0])  # shown by a job command's quiet logs too


@checked
def test_beams_methods_are_back_when_the_last_block_ends():
    beams = _methods()
    ours = [replacement for _, _, replacement in local_runner._replacements()]
    with pytest.raises(KeyError), tuned_local_runner() as applied:
        assert applied is True and _methods() == ours
        with tuned_local_runner():  # nested: still ours when the inner block ends
            pass
        assert _methods() == ours
        raise KeyError("the job failed")
    assert _methods() == beams and not any(hasattr(f, "__wrapped__") for f in ours)


def _events_csv(path, streams: int = 60, rows: int = 1500) -> None:
    rng = np.random.default_rng(3)
    lines = ["stream_id,timestamp,value_0,value_1"]
    lines += [f"s{s:03d},{t!r},{a!r},{b!r}" for s, t, a, b in
              zip(rng.integers(0, streams, rows).tolist(), (rng.random(rows) * 20).tolist(),
                  *rng.normal(0, 1, (2, rows)).tolist())]
    path.write_text("\n".join(lines) + "\n")


def _release_values(out) -> list:
    return [(r["stream"], r["step"], list(r["value"]), r["meta"]) for r in read_releases(str(out / "sum-*"))]


@checked
@pytest.mark.parametrize("groups", [0, 2])
def test_a_job_releases_the_same_with_and_without_it(tmp_path, monkeypatch, capsys, groups):
    """The same job and noise key on Beam's runner and inside the block (pieces of 4 KB: keys joined and
    keys read value by value), its shuffles on disk, read once and gone: the same releases, bit for bit."""
    _events_csv(tmp_path / "e.csv")
    flags = [f"--input={tmp_path / 'e.csv'}", "--start=0", "--period=1", "--end=20", "--noise=gaussian",
             "--delta=1e-6", f"--stream-groups={groups}"]
    assert continual_stats.main([*flags, f"--output={tmp_path / 'beams'}"]) == 0
    made = []
    of = local_runner.SpilledValues.of.__func__

    def recording(cls, buffer):
        spill = of(cls, buffer)
        made.append(spill)
        return spill

    monkeypatch.setattr(local_runner.SpilledValues, "of", classmethod(recording))
    monkeypatch.setattr(local_runner, "PIECE_BYTES", 4096)
    paths = {"joined": 0, "value by value": 0}
    take, take_values = local_runner.SpilledValues.take, local_runner.SpilledValues.take_values

    def joined(spill, keys):
        paths["joined"] += bool(keys)
        return take(spill, keys)

    def value_by_value(spill, key):
        paths["value by value"] += 1
        return take_values(spill, key)

    monkeypatch.setattr(local_runner.SpilledValues, "take", joined)
    monkeypatch.setattr(local_runner.SpilledValues, "take_values", value_by_value)
    with tuned_local_runner():
        assert continual_stats.main([*flags, f"--output={tmp_path / 'tuned'}"]) == 0
    spilled = [spill for spill in made if spill is not None]
    assert len(spilled) >= 2  # the release stage's and the sink's shuffles at least
    assert all(spill._file.closed and not spill.spans for spill in spilled)  # each read once (or empty), then gone
    assert not local_runner._HELD  # every piece made was taken by the worker
    assert paths["joined"] and paths["value by value"], paths  # both ways a piece is read
    beams, tuned = _release_values(tmp_path / "beams"), _release_values(tmp_path / "tuned")
    assert len(beams) == 60 * 20 and tuned == beams
    assert "releases" in capsys.readouterr().out


def test_only_a_jobs_own_command_line_runs_inside_the_block(monkeypatch, tmp_path):
    import beam_dp.cli

    entered = []

    @contextlib.contextmanager
    def recording():
        entered.append(1)
        yield True

    monkeypatch.setattr(local_runner, "tuned_local_runner", recording)
    monkeypatch.setattr(beam_dp.cli, "exit_now", lambda code: entered.append(("exit", code)))
    _events_csv(tmp_path / "e.csv", streams=3, rows=20)
    flags = [f"--input={tmp_path / 'e.csv'}", "--start=0", "--period=1", "--end=20"]
    assert continual_stats.main([*flags, f"--output={tmp_path / 'embedded'}"]) == 0  # main(argv) from Python
    assert entered == []
    monkeypatch.setattr("sys.argv", ["continual_stats", *flags, f"--output={tmp_path / 'command'}"])
    runner.run_cli(None, continual_stats.JOB)  # python -m pipelines.continual_stats
    assert entered == [1, ("exit", 0)]


class _Input:
    """What ``DataInputOperation.process_encoded`` uses of its operation: the coder, the split state, output."""

    def __init__(self, stop: float = float("inf")):
        self.windowed_coder = coders.WindowedValueCoder(_GROUPED)
        self.windowed_coder_impl = self.windowed_coder.get_impl()
        self.splitting_lock, self.index, self.stop, self.outputs = threading.Lock(), -1, stop, []
        self.name_context = type("Name", (), {"step_name": "read"})()

    def output(self, value) -> None:
        self.outputs.append(value)


def _same_elements(got: list, want: list) -> None:
    assert [v.value[0] for v in got] == [v.value[0] for v in want]
    for a, b in zip(got, want):
        values = list(a.value[1])
        assert len(values) == len(b.value[1]) and a.windows == b.windows
        for x, y in zip(values, b.value[1]):
            np.testing.assert_array_equal(x, y)  # the same bytes decoded


@checked
@pytest.mark.parametrize("stop", [float("inf"), 3])
@pytest.mark.parametrize("piece_bytes", [local_runner.PIECE_BYTES, 300])
def test_a_held_piece_is_processed_as_beam_processes_its_bytes(stop, piece_bytes, monkeypatch):
    """Pieces of several keys are joined and decoded whole; a key of ``PIECE_BYTES`` or more (here every key:
    3 values of ~150 bytes) is read and decoded value by value; either way Beam's elements."""
    monkeypatch.setattr(local_runner, "PIECE_BYTES", piece_bytes)
    ours, beams = _buffer(), _filled_buffer(40, 3, 16)
    _spill_all(ours, _encoded_rows(40, 3, 16))
    whole = _beams(execution.GroupingBuffer.partition)(beams, 1)[0][0]
    channel = data_plane.InMemoryDataChannel()
    local_runner._send_in_pieces(type("Sender", (), {"_worker_handler": _Worker(channel)})(), "bundle", "read", ours)
    got, want = _Input(stop), _Input(stop)
    messages = list(local_runner._releasing_inputs(channel.inverse(), "bundle", None))
    assert (len(messages) == 40) == (piece_bytes == 300)
    assert all(isinstance(held, tuple) == (piece_bytes == 300) for held in local_runner._HELD.values())
    for message in messages:
        local_runner._process_held(got, message.data)
    assert not local_runner._HELD  # taken by the worker
    _beams(bundle_processor.DataInputOperation.process_encoded)(want, whole)
    assert len(want.outputs) == min(40, stop)
    _same_elements(got.outputs, want.outputs)
    _same_elements(got.outputs, want.outputs)  # a large key's values read again: the same
    if piece_bytes == 300:  # a large key's values are read as they are iterated, and observed as read
        values = got.outputs[0].value[1]
        assert not isinstance(values, list)
        seen = []
        values.register_observer(lambda value, is_encoded=False: seen.append((len(value), is_encoded)))
        assert len(list(values)) == 3 and len(seen) == 3 and all(encoded for _, encoded in seen)
        del values
    got.outputs.clear()  # the elements dropped (a large key's values with them)
    assert ours._beam_dp_spill._file.closed or stop != float("inf")  # every key read: the file is gone
    other, beams_own = _Input(), _Input()
    local_runner._process_held(other, whole)  # a message carrying its own bytes: Beam's
    _beams(bundle_processor.DataInputOperation.process_encoded)(beams_own, whole)
    assert len(other.outputs) == 40
    _same_elements(other.outputs, beams_own.outputs)
