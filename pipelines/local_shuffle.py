"""Shuffles of a local run handed on in pieces: Beam's in-process runner holds a grouped input once.

The FnApiRunner groups a stage's input (a ``GroupByKey``, a combiner's shuffle) in memory, then
encodes *all* of it into one byte string, writes that into its in-memory data channel as one message
(copied into a protobuf), and the worker copies the message's bytes again before decoding them, while
the channel keeps every message, and the runner its byte string, until the bundle ends. At 10M events
(10,000 streams × 200 steps, 4 stream groups) the release stage's input is 166 MB encoded, so the job
held it three or four times at once (peak RSS ~1,050 MB; issue 26). :func:`stream_local_shuffles`
changes three things, for this process only, and only on the Beam versions it was checked on
(:data:`CHECKED_BEAM`):

* a grouping buffer encodes its keys in pieces of about :data:`PIECE_BYTES` (whole keys, in Beam's
  order: the pieces joined are exactly the bytes Beam made);
* the runner hands the worker each piece of a grouped input as it is: the channel makes a piece's
  message only when the worker reads it, and the runner lets go of the piece then. A grouped input
  is read once (the stage that reads a ``GroupByKey`` is the only one that does); a second read
  fails loudly instead of finding it empty. Other inputs are sent as before, flushed after each of
  their byte strings (whole elements);
* the channel lets go of each message once the worker has read it.

Elements, their order and their encoding are unchanged; nothing else about the runner is touched.
Peak RSS of the 10M-event job: 1,057 → 870 MB with the pieces alone (docs/benchmarks.md). Runners
other than the in-process one (Dataflow, Flink, Prism) never use these classes.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

__all__ = ["CHECKED_BEAM", "PIECE_BYTES", "stream_local_shuffles"]

log = logging.getLogger(__name__)

CHECKED_BEAM = ("2.77",)  # Beam major.minor versions whose runner internals these changes were checked on
PIECE_BYTES = 8 << 20  # bytes of encoded values per piece of a grouped input, about
_SAMPLED_KEYS = 32  # keys whose values are sized to estimate a key's share of a piece


def stream_local_shuffles() -> bool:
    """Apply the three changes above to this process's in-process Beam runner; ``False`` (and no
    change) on a Beam version not in :data:`CHECKED_BEAM`. Calling it again changes nothing more."""
    import apache_beam
    from apache_beam.runners.portability.fn_api_runner import execution, fn_runner
    from apache_beam.runners.worker import data_plane

    if ".".join(apache_beam.__version__.split(".")[:2]) not in CHECKED_BEAM:
        log.info("Beam %s: the in-process runner's shuffles are left as they are", apache_beam.__version__)
        return False
    buffer_type = execution.GroupingBuffer
    if getattr(buffer_type.partition, "_beam_dp_pieces", False):
        return True
    buffer_type.partition = _in_pieces(buffer_type.partition)
    _send_in_pieces.__wrapped__ = fn_runner.BundleManager._send_input_to_worker  # Beam's, for tests
    fn_runner.BundleManager._send_input_to_worker = _send_in_pieces
    _releasing_inputs.__wrapped__ = data_plane.InMemoryDataChannel.input_elements
    data_plane.InMemoryDataChannel.input_elements = _releasing_inputs
    return True


def _in_pieces(partition):
    """``GroupingBuffer.partition`` encoding the keys of a one-way partition in pieces (Beam's own
    ``partition`` encodes each piece: the keys of a piece become a table of their own)."""

    def partition_in_pieces(self, n: int):
        if getattr(self, "_beam_dp_handed_on", False):
            raise RuntimeError("beam_dp.local_shuffle: a grouped input was read twice after it was handed on")
        if self._grouped_output or n != 1 or not self._windowing.is_default() or len(self._table) < 2:
            return partition(self, n)
        table, pieces = self._table, []
        keys = list(table)
        per_piece = _keys_per_piece(table, keys)
        for start in range(0, len(keys), per_piece):
            self._table = collections.defaultdict(list, ((k, table.pop(k)) for k in keys[start:start + per_piece]))
            self._grouped_output = None
            pieces.extend(partition(self, 1)[0])  # clears the piece's table once it is encoded
        self._table = table
        self._grouped_output = [pieces]
        return self._grouped_output

    partition_in_pieces._beam_dp_pieces = True
    partition_in_pieces.__wrapped__ = partition
    return partition_in_pieces


def _keys_per_piece(table: dict, keys: list) -> int:
    from beam_dp.io.coders import estimated_bytes

    step = max(1, len(keys) // _SAMPLED_KEYS)
    sample = keys[::step]
    per_key = sum(estimated_bytes(table[k]) for k in sample) / len(sample)
    return max(1, int(PIECE_BYTES // max(per_key, 1.0)))


class _Piece:
    """A piece of a grouped input waiting in the channel: its message is made when the worker reads it."""

    __slots__ = ("instruction_id", "transform_id", "data")

    def __init__(self, instruction_id: str, transform_id: str, data: bytes):
        self.instruction_id, self.transform_id, self.data = instruction_id, transform_id, data

    def message(self):
        from apache_beam.portability.api import beam_fn_api_pb2

        data, self.data = self.data, None
        return beam_fn_api_pb2.Elements.Data(instruction_id=self.instruction_id, transform_id=self.transform_id,
                                             data=data)


def _send_in_pieces(self, process_bundle_id: str, read_transform_id: str, byte_streams: Any) -> None:
    """``BundleManager._send_input_to_worker``: a grouped input's pieces handed on one by one (see the
    module docstring); any other input written and flushed after each byte string (whole elements)."""
    from apache_beam.runners.portability.fn_api_runner.execution import GroupingBuffer
    from apache_beam.runners.worker.data_plane import InMemoryDataChannel

    channel = self._worker_handler.data_conn
    if isinstance(byte_streams, GroupingBuffer) and isinstance(channel, InMemoryDataChannel):
        pieces = byte_streams.partition(1)[0]
        byte_streams._beam_dp_handed_on = True
        channel.inverse()._inputs.extend(_Piece(process_bundle_id, read_transform_id, p) for p in pieces if p)
        pieces.clear()  # the channel holds them now, and lets each go once the worker has read it
        return
    data_out = channel.output_stream(process_bundle_id, read_transform_id)
    for chunk in byte_streams or []:
        data_out.write(chunk)
        data_out.maybe_flush()
    data_out.close()


def _releasing_inputs(self, instruction_id: str, unused_expected_inputs: Any, abort_callback=None):
    """``InMemoryDataChannel.input_elements`` that drops each message from the channel as it is read
    (same messages, same order, the other instructions' messages kept)."""
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
