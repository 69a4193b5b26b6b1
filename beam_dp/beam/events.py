"""Moved to :mod:`beam_dp.steps.events` (Beam-free); this path stays for existing imports."""

from beam_dp.steps.events import (  # noqa: F401
    DEAD_LETTER,
    DeadLetter,
    EventBatch,
    OutOfRange,
    Reason,
    checked_stream,
    coerce_value,
    encodable,
    named_fields,
    parse_event,
    timestamp_letter,
    to_micros,
)

__all__ = ["DeadLetter", "EventBatch", "OutOfRange", "Reason", "checked_stream", "coerce_value", "encodable",
           "named_fields", "parse_event", "timestamp_letter", "to_micros"]
