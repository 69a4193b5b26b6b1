"""Tuning of Beam's in-process runner for a job's own local run: shuffles kept on disk and handed on in pieces,
so the runner's memory stays flat.

Beam's in-process runner (the FnApiRunner) groups a stage's input (a ``GroupByKey``, a combiner's
shuffle) in memory: its ``GroupingBuffer`` decodes every value and keeps it until the reading stage
starts, then encodes *all* of it into one byte string and writes that into its in-memory data channel
as one message (a protobuf copy), which the worker copies again before decoding it; the channel keeps
every message until the bundle ends. At 10M events (10,000 streams × 1,000 steps, 4 stream groups) the
release stage's input is ~600 MB encoded, so the job held it three or four times at once.

:func:`tuned_local_runner` changes this while its block is open, by replacing eight methods of four private
classes of Beam's runner (``GroupingBuffer``, ``BundleManager``, ``InMemoryDataChannel``,
``DataInputOperation``), and puts Beam's own back when the block ends. Those classes are internals, so it
applies only on the Beam release they were checked on (:data:`CHECKED_BEAM`, exactly); on any other it
logs a WARNING and changes nothing (the job runs on Beam's runner as it is, with its memory). The
replacements are process-wide while applied: ``pipelines.runner`` opens the block only around a job run
from its own command line (``python -m pipelines.<job>``, a process that runs that one job), never for
``main(argv)`` called from Python, and nothing in ``beam_dp`` applies it. What it changes:

* **spilled values.** A grouping buffer of a key-value input in the global window (every batch shuffle
  here) writes each value's encoding to an unnamed temporary file as it arrives (``tempfile``: under
  ``TMPDIR``, readable by this user only, no name on disk, gone when the buffer is read or dropped or
  the process ends) and keeps in memory only where each key's values lie. The file holds what the
  runner held in memory: shuffled elements, which may be un-noised (clipped sums), so it is treated like
  the job's private dead-letter folder. Other buffers (windowed inputs, other coders) stay Beam's;
* **pieces.** The runner hands the worker a spilled input in pieces of about :data:`PIECE_BYTES` (whole
  keys, in Beam's order); a piece's bytes are read from the file, and its message made, only when the
  worker reads it. The bytes are exactly Beam's (each key's header, the count of its values, then the
  values' encodings). A grouped input is read once (the stage that reads a ``GroupByKey`` is the only
  one that does); a second read fails loudly instead of finding it empty. Other inputs are sent as
  before, flushed after each of their byte strings (whole elements);
* **outputs delivered.** What the worker writes to a spilled buffer is handed to it as each message is
  flushed (about 10 MB), not queued in the channel until the bundle ends (a stage's whole output); its
  values are written to the file :data:`_WRITE_BYTES` at a time;
* **read messages dropped.** The channel lets go of each message once the worker has read it;
* **pieces held, not copied.** A piece's message carries only a name; its bytes wait in this process
  until the worker's input operation takes them, decodes the piece's elements, lets the bytes go and
  then processes the elements. (A protobuf message copies a bytes field in, and out again on each read:
  the release stage's input of one stream group, a single key of up to hundreds of MB, was held three
  times while it was processed; now once, decoded.) A key of :data:`PIECE_BYTES` or more is a piece of
  its own and is never joined, nor held decoded: the worker gets the key with an iterable of its values
  (``_KeyValues``) that reads them from the file one at a time as the DoFn iterates, each decoded by the
  worker's own coder as a one-value element of the key (re-iterable while held; Beam's size sampling
  observes the encodings as they are read), so the release stage of a stream group holds one value at a
  time, not all of them.

Elements, their order and their encoding are unchanged; nothing else about the runner is touched.
Runners other than the in-process one (Dataflow, Flink, Prism) never use these classes.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import struct
import tempfile
import threading
from array import array
from typing import Any, Iterator

from apache_beam.coders.observable import ObservableMixin

__all__ = ["CHECKED_BEAM", "PIECE_BYTES", "tuned_local_runner"]

log = logging.getLogger("beam_dp.local_runner")  # a name quiet mode lets through (pipelines.runner)

CHECKED_BEAM = "2.77.0"  # the Beam release whose runner internals these changes were checked on
PIECE_BYTES = 8 << 20  # bytes of encoded values per piece of a grouped input, about
_WRITE_BYTES = 256 << 10  # encoded values written to a spill file at a time, from one reused buffer
_UNDECIDED = object()
_HELD: dict[bytes, bytes] = {}  # pieces made, by the name their message carries, until the worker reads them
_HELD_PREFIX = b"\0beam_dp-held-piece-%s-" % os.urandom(8).hex().encode()  # no real message starts so
_held_names = itertools.count()
_lock = threading.Lock()
_applied = 0  # blocks of tuned_local_runner open: Beam's methods are replaced while it is positive


@contextlib.contextmanager
def tuned_local_runner() -> Iterator[bool]:
    """Within the block, this process's in-process Beam runner has the changes above (yields ``True``); on a
    Beam release other than :data:`CHECKED_BEAM` nothing changes and a WARNING says so (yields ``False``).
    Beam's own methods are back once the last open block has ended (blocks may nest)."""
    import apache_beam

    if apache_beam.__version__ != CHECKED_BEAM:
        log.warning("Beam %s: the in-process runner's shuffles are left as they are (checked on Beam %s only): "
                    "a large local job holds its shuffled data in memory", apache_beam.__version__, CHECKED_BEAM)
        yield False
        return
    global _applied
    with _lock:
        if not _applied:
            _replace()
        _applied += 1
    try:
        yield True
    finally:
        with _lock:
            _applied -= 1
            if not _applied:
                _restore()


def _replacements() -> tuple[tuple[type, str, Any], ...]:
    """``(owner, method name, ours)`` for each method of Beam's runner that :func:`tuned_local_runner` replaces."""
    from apache_beam.runners.portability.fn_api_runner import execution, fn_runner
    from apache_beam.runners.worker import bundle_processor, data_plane

    buffer = execution.GroupingBuffer
    return ((buffer, "append", _append), (buffer, "extend", _extend), (buffer, "partition", _partition),
            (fn_runner.BundleManager, "_send_input_to_worker", _send_in_pieces),
            (fn_runner.BundleManager, "process_bundle", _process_bundle),
            (data_plane.InMemoryDataChannel, "input_elements", _releasing_inputs),
            (data_plane.InMemoryDataChannel, "output_stream", _delivering_output_stream),
            (bundle_processor.DataInputOperation, "process_encoded", _process_held))


def _replace() -> None:
    for owner, name, ours in _replacements():
        ours.__wrapped__ = owner.__dict__[name]  # Beam's: for the other buffers and channels
        setattr(owner, name, ours)


def _restore() -> None:
    for owner, name, ours in _replacements():
        setattr(owner, name, ours.__wrapped__)
        del ours.__wrapped__


class SpilledValues:
    """The values of one grouping buffer on disk: each key (its nested encoding, the dict's order is the
    order keys first arrived) → ``array('q')`` of (offset, length) pairs of its values' nested encodings
    in an unnamed temporary file. :meth:`take` makes the grouped bytes of some keys and forgets them."""

    def __init__(self, pre_grouped: Any, post_grouped: Any, key: Any, value: Any) -> None:
        self._pre, self._post, self._key, self._value = pre_grouped, post_grouped, key, value
        self.spans: dict[bytes, array] = {}
        self._file = tempfile.TemporaryFile(prefix="beam_dp-shuffle-")
        self._size = 0
        self._reading = 0  # keys handed on to be read value by value, not read yet
        self._read = False  # reading has begun: no more writes
        self._header: bytes | None = None

    @classmethod
    def of(cls, buffer: Any) -> "SpilledValues | None":
        """For a buffer of ``KV[K, V]`` in the global window grouped to ``KV[K, Iterable[V]]``, else None."""
        from apache_beam.coders import IterableCoder, TupleCoder

        kv = getattr(buffer._pre_grouped_coder, "wrapped_value_coder", None)
        grouped = getattr(buffer._post_grouped_coder, "wrapped_value_coder", None)
        if not (buffer._windowing.is_default() and isinstance(kv, TupleCoder) and isinstance(grouped, TupleCoder)):
            return None
        (key, value), post = kv.coders(), grouped.coders()
        if len(kv.coders()) != 2 or list(post) != [key, IterableCoder(value)]:
            return None
        return cls(buffer._pre_grouped_coder.get_impl(), buffer._post_grouped_coder.get_impl(), key.get_impl(),
                   value.get_impl())

    def add_encoded(self, elements: bytes) -> None:
        """Decode windowed key-value ``elements`` (Beam's data-channel bytes); write each value to the file,
        :data:`_WRITE_BYTES` at a time from one reused buffer (a whole batch joined, ~10 MB, would be fresh
        pages twice over: its growing buffer and its copy)."""
        from apache_beam.coders.coder_impl import create_InputStream, create_OutputStream

        stream, out = create_InputStream(elements), create_OutputStream()
        decode, key_bytes, encode = self._pre.decode_from_stream, self._key.encode_nested, self._value.encode_to_stream
        spans, base = self.spans, self._size
        while stream.size() > 0:
            key, value = decode(stream, True).value
            start = out.size()
            encode(value, out, True)
            nested = key_bytes(key)
            where = spans.get(nested)
            if where is None:
                where = spans[nested] = array("q")
            where.append(base + start)
            where.append(out.size() - start)
            if out.size() >= _WRITE_BYTES:
                self._write(out.get())
                out._clear()
                base = self._size
        self._write(out.get())

    def add_spilled(self, other: "SpilledValues") -> None:
        """Append ``other``'s values, key by key (Beam's ``extend``)."""
        for key in list(other.spans):
            where = self.spans.setdefault(key, array("q"))
            for value in other.values_at(other.spans.pop(key)):
                where.extend((self._size, len(value)))
                self._write(value)
        other.close()

    def pieces(self, limit: int) -> list[list[bytes]]:
        """The keys in order, cut into runs of about ``limit`` bytes of values (at least one key each); a
        key of ``limit`` bytes or more is a piece of its own."""
        pieces, keys, size = [], [], 0
        for key, where in self.spans.items():
            bytes_of_key = sum(where[1::2])
            if bytes_of_key >= limit and keys:
                pieces.append(keys)
                keys, size = [], 0
            keys.append(key)
            size += bytes_of_key
            if size >= limit:
                pieces.append(keys)
                keys, size = [], 0
        return pieces + [keys] if keys else pieces

    def take_values(self, key: bytes) -> tuple[bytes, "SpilledValues", array]:
        """``(prefix, self, where)``: the bytes before the values of a one-value grouped element of ``key``
        (its header, the key, a count of 1) and where its values lie (:meth:`values_at`: read from the file
        one at a time, no mapping, no joined copy). The key is forgotten; the file stays open until
        :meth:`done_reading` (then closed once every key is taken)."""
        where = self.spans.pop(key)
        self._reading += 1
        return self._header_of(key) + key + struct.pack(">i", 1), self, where

    def done_reading(self) -> None:
        """A key handed on by :meth:`take_values` will not be read again."""
        self._reading -= 1
        self._close_if_done()

    def take(self, keys: list[bytes]) -> bytes:
        """Beam's grouped encoding of ``keys`` (each: the global-window header, the key, the count of its
        values, the values), read from the file; the keys are forgotten, the file closed after the last."""
        if not keys:
            return b""
        parts = []
        for key in keys:
            where = self.spans.pop(key)
            parts += (self._header_of(key), key, struct.pack(">i", len(where) // 2), *self.values_at(where))
        data = b"".join(parts)
        self._close_if_done()
        return data

    def close(self) -> None:
        self._file.close()
        self.spans.clear()

    def _close_if_done(self) -> None:
        if not self.spans and not self._reading:
            self.close()

    def _write(self, data: bytes) -> None:
        if self._read:
            raise RuntimeError("pipelines.local_runner: a grouping buffer was written after it was read")
        self._file.write(data)
        self._size += len(data)

    def values_at(self, where: array) -> Iterator[bytes]:
        """The values at ``where`` (offset, length pairs), read from the file one at a time (``os.pread``:
        nothing mapped, so no page of the file stays in this process)."""
        if not self._read:
            self._file.flush()
            self._read = True
        for offset, length in zip(where[::2], where[1::2]):
            yield os.pread(self._file.fileno(), length, offset)

    def _header_of(self, key: bytes) -> bytes:
        """The bytes before a key in Beam's grouped encoding: its global-window timestamp, window and pane
        (what ``GroupingBuffer.partition`` writes for default windowing), the same for every key."""
        if self._header is None:
            from apache_beam.coders.coder_impl import create_OutputStream
            from apache_beam.transforms.window import GlobalWindow, GlobalWindows
            from apache_beam.utils import windowed_value

            pane = windowed_value.PaneInfo(is_first=True, is_last=True, timing=windowed_value.PaneInfoTiming.ON_TIME,
                                           index=0, nonspeculative_index=0)
            probe = GlobalWindows.windowed_value((self._key.decode_nested(key), []),
                                                 timestamp=GlobalWindow().max_timestamp(), pane_info=pane)
            out = create_OutputStream()
            self._post.encode_to_stream(probe, out, True)
            encoded, tail = out.get(), key + b"\0\0\0\0"  # ... the key, then an empty iterable's count
            if not encoded.endswith(tail):
                raise RuntimeError("pipelines.local_runner: Beam's grouped encoding is not header, key, values")
            self._header = encoded[:-len(tail)]
        return self._header


def _beams(ours: Any, owner: type, name: str) -> Any:
    """Beam's method ``owner.name`` that ``ours`` replaces (the class's own where nothing was applied)."""
    return getattr(ours, "__wrapped__", None) or getattr(owner, name)


def spilled(buffer: Any) -> SpilledValues | None:
    """The buffer's :class:`SpilledValues` (decided on first use), or None where it stays Beam's."""
    spill = buffer.__dict__.get("_beam_dp_spill", _UNDECIDED)
    if spill is _UNDECIDED:
        spill = buffer._beam_dp_spill = SpilledValues.of(buffer)
    return spill


def _append(self, elements_data: bytes) -> None:
    """``GroupingBuffer.append``: spilled values, or Beam's."""
    spill = spilled(self)
    if spill is None:
        return _beams(_append, type(self), "append")(self, elements_data)
    if self._grouped_output or getattr(self, "_beam_dp_handed_on", False):
        raise RuntimeError("Grouping table append after read.")
    spill.add_encoded(elements_data)


def _extend(self, input_buffer: Any) -> None:
    """``GroupingBuffer.extend``: another spilled buffer's values appended, or Beam's."""
    spill = spilled(self)
    if spill is None:
        return _beams(_extend, type(self), "extend")(self, input_buffer)
    from apache_beam.runners.portability.fn_api_runner.execution import ListBuffer

    if isinstance(input_buffer, ListBuffer):  # Beam's own workaround: nothing to add
        return
    other = spilled(input_buffer)
    if other is None:
        raise RuntimeError("pipelines.local_runner: a spilled grouping buffer cannot take an in-memory one")
    spill.add_spilled(other)


def _partition(self, n: int) -> list[list[bytes]]:
    """``GroupingBuffer.partition``: key ``i`` to worker ``i % n``, Beam's bytes (one string each)."""
    if getattr(self, "_beam_dp_handed_on", False):
        raise RuntimeError("pipelines.local_runner: a grouped input was read twice after it was handed on")
    spill = spilled(self)
    if spill is None:
        return _beams(_partition, type(self), "partition")(self, n)
    if not self._grouped_output:
        keys = list(spill.spans)
        self._grouped_output = [[spill.take(keys[i::n])] for i in range(n)]
        spill.close()
    return self._grouped_output


class _Piece:
    """A piece of a spilled grouped input waiting in the channel: read and made a message when the worker
    reads it."""

    __slots__ = ("instruction_id", "transform_id", "spill", "keys")

    def __init__(self, instruction_id: str, transform_id: str, spill: SpilledValues, keys: list[bytes]):
        self.instruction_id, self.transform_id, self.spill, self.keys = instruction_id, transform_id, spill, keys

    def message(self):
        """The piece's message: its bytes held here (:data:`_HELD`) and the message naming them (a protobuf
        copies a bytes field in and again on each read: a piece of one large key would be held three
        times while it is decoded)."""
        from apache_beam.portability.api import beam_fn_api_pb2

        spill, keys = self.spill, self.keys
        self.spill = self.keys = None
        if len(keys) == 1 and sum(spill.spans[keys[0]][1::2]) >= PIECE_BYTES:  # a large key: read when decoded
            data = spill.take_values(keys[0])
        else:
            data = spill.take(keys)
        if data:
            name = b"%s%d" % (_HELD_PREFIX, next(_held_names))
            _HELD[name] = data
            data = name
        return beam_fn_api_pb2.Elements.Data(instruction_id=self.instruction_id, transform_id=self.transform_id,
                                             data=data)


def _process_held(self, encoded: bytes) -> None:
    """``DataInputOperation.process_encoded``: a held piece (:meth:`_Piece.message`) decoded whole, its bytes
    let go, then its elements processed in order (a large key's bytes and its decoded values are not held
    together while it is processed); any other message is Beam's."""
    from apache_beam.coders.coder_impl import create_InputStream
    from apache_beam.runners.worker.bundle_processor import DataInputOperation

    data = _HELD.pop(encoded, None) if encoded.startswith(_HELD_PREFIX) else None
    if data is None:
        return _beams(_process_held, DataInputOperation, "process_encoded")(self, encoded)
    decode, elements = self.windowed_coder_impl.decode_from_stream, []
    try:
        if isinstance(data, tuple):  # one large key: decoded value by value (module docstring)
            elements.append(_one_key(decode, *data))
        else:
            stream = create_InputStream(data)
            del data
            while stream.size() > 0:
                elements.append(decode(stream, True))
            del stream
    except Exception as exn:
        raise ValueError(f"Error decoding input stream with coder {self.windowed_coder} in step "
                         f"{self.name_context.step_name}") from exn
    elements.reverse()
    while elements:  # Beam's loop: an element past a split's stop is not processed
        with self.splitting_lock:
            if self.index == self.stop - 1:
                return
            self.index += 1
        self.output(elements.pop())


def _one_key(decode: Any, prefix: bytes, spill: "SpilledValues", where: array) -> Any:
    """The grouped element of one key whose values lie at ``where`` in ``spill``: its first value decoded as
    a one-value element (``prefix`` + the value) by the worker's own coder gives the element, whose values
    become a :class:`_KeyValues` (read and decoded as they are iterated)."""
    from apache_beam.coders.coder_impl import create_InputStream

    values = _KeyValues(decode, prefix, spill, where)
    first = decode(create_InputStream(prefix + next(spill.values_at(where[:2]))), True)
    if type(first.value[1]) is not list:
        raise RuntimeError("pipelines.local_runner: Beam's grouped values are not a list")
    return first.with_value((first.value[0], values))


class _KeyValues(ObservableMixin):
    """The values of one large key, read from the spill file and decoded one at a time each time it is
    iterated (a grouped value is re-iterable); Beam's size sampling observes their encodings as they are
    read. The file is released (closed once every key is taken) when this is dropped."""

    def __init__(self, decode: Any, prefix: bytes, spill: "SpilledValues", where: array) -> None:
        super().__init__()
        self._decode, self._prefix, self._spill, self._where = decode, prefix, spill, where

    def __iter__(self) -> Iterator[Any]:
        from apache_beam.coders.coder_impl import create_InputStream

        decode, prefix = self._decode, self._prefix
        for encoded in self._spill.values_at(self._where):
            self.notify_observers(encoded, is_encoded=True)
            yield decode(create_InputStream(prefix + encoded), True).value[1][0]

    def __repr__(self) -> str:
        return f"_KeyValues({len(self._where) // 2} values)"

    def __del__(self) -> None:
        self._spill.done_reading()


def _send_in_pieces(self, process_bundle_id: str, read_transform_id: str, byte_streams: Any) -> None:
    """``BundleManager._send_input_to_worker``: a spilled grouped input handed on in pieces (module
    docstring); any other input written and flushed after each byte string (whole elements)."""
    from apache_beam.runners.portability.fn_api_runner.execution import GroupingBuffer
    from apache_beam.runners.worker.data_plane import InMemoryDataChannel

    channel = self._worker_handler.data_conn
    spill = spilled(byte_streams) if isinstance(byte_streams, GroupingBuffer) else None
    if spill is not None and isinstance(channel, InMemoryDataChannel) and not byte_streams._grouped_output:
        if getattr(byte_streams, "_beam_dp_handed_on", False):
            raise RuntimeError("pipelines.local_runner: a grouped input was read twice after it was handed on")
        byte_streams._beam_dp_handed_on = True
        pieces = spill.pieces(PIECE_BYTES)
        if not pieces:  # an empty input: nothing to read back
            spill.close()
        channel.inverse()._inputs.extend(_Piece(process_bundle_id, read_transform_id, spill, keys) for keys in pieces)
        return
    data_out = channel.output_stream(process_bundle_id, read_transform_id)
    for chunk in byte_streams or []:
        data_out.write(chunk)
        data_out.maybe_flush()
    data_out.close()


def _process_bundle(self, inputs: Any, expected_outputs: Any, fired_timers: Any, expected_output_timers: Any,
                    dry_run: bool = False) -> Any:
    """``BundleManager.process_bundle`` with the bundle's spilled output buffers registered on the runner's
    in-memory channels, so that the worker's writes to them are delivered as they are flushed."""
    from apache_beam.runners.portability.fn_api_runner.execution import split_buffer_id
    from apache_beam.runners.worker.data_plane import InMemoryDataChannel

    deliver = {}
    for transform_id, buffer_id in ({} if dry_run else expected_outputs).items():
        if split_buffer_id(buffer_id)[0] == "group":
            buffer = self.bundle_context_manager.get_buffer(buffer_id, transform_id)
            if spilled(buffer) is not None:
                deliver[transform_id] = buffer
    channels = [handler.data_conn for handler in self.bundle_context_manager.worker_handlers
                if isinstance(handler.data_conn, InMemoryDataChannel)]
    for channel in channels:
        channel._beam_dp_deliver = deliver
    try:
        return _beams(_process_bundle, type(self), "process_bundle")(self, inputs, expected_outputs, fired_timers,
                                                                     expected_output_timers, dry_run)
    finally:
        for channel in channels:
            channel._beam_dp_deliver = {}


def _delivering_output_stream(self, instruction_id: str, transform_id: str) -> Any:
    """``InMemoryDataChannel.output_stream`` (the worker's side): a registered spilled buffer takes each
    flushed message's bytes at once (under the runner's lock, as Beam appends them); others are Beam's."""
    buffer = getattr(self._inverse, "_beam_dp_deliver", {}).get(transform_id)
    if buffer is None:
        return _beams(_delivering_output_stream, type(self), "output_stream")(self, instruction_id, transform_id)
    from apache_beam.runners.portability.fn_api_runner.fn_runner import BundleManager
    from apache_beam.runners.worker.data_plane import ClosableOutputStream

    def deliver(data: bytes) -> None:
        if data:
            with BundleManager._lock:
                _append(buffer, data)

    return ClosableOutputStream.create(deliver, deliver, self._data_buffer_time_limit_ms)


def _releasing_inputs(self, instruction_id: str, unused_expected_inputs: Any, abort_callback=None):
    """``InMemoryDataChannel.input_elements`` that drops each message from the channel as it is read
    (same messages, same order, the other instructions' messages kept)."""
    import collections

    from apache_beam.portability.api import beam_fn_api_pb2

    others = []
    inputs = collections.deque(self._inputs)
    self._inputs = []
    while inputs:
        element = inputs.popleft()
        if isinstance(element, _Piece) and element.instruction_id == instruction_id:
            element = element.message()
        if element.instruction_id != instruction_id:
            others.append(element)
        elif isinstance(element, beam_fn_api_pb2.Elements.Timers):
            if not element.is_last:
                yield element
        elif isinstance(element, beam_fn_api_pb2.Elements.Data) and (element.data or element.is_last):
            yield element
        if not inputs and self._inputs:  # written while we read: read those too, as Beam's loop would
            inputs.extend(self._inputs)
            self._inputs = []
    self._inputs = others + self._inputs
