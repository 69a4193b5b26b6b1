"""Release rows as JSON text, the Flink job's record format (no PyFlink import: testable anywhere).

:func:`json_rows` gives, for a :class:`~beam_dp.steps.schema.ReleaseRow` or a group's
:class:`~beam_dp.steps.schema.ReleaseColumns`, exactly the strings of
``json.dumps(labels(row)._asdict(), sort_keys=True)`` per row. A group's rows share every column but
``stream`` and ``value``: those columns are encoded once per group step, and each row costs two
small encodings and a join instead of a labelled ``ReleaseRow`` and a sorted ``dict`` encoding.
Nothing private is added: the text is the release row's columns, as before.
"""

from __future__ import annotations

import json
from typing import Any

from beam_dp.steps.schema import ReleaseColumns, ReleaseLabels, ReleaseRow, release_to_row

__all__ = ["json_rows"]

_PER_ROW = ("stream", "value")  # the columns that differ between the rows of one group step, in sorted order


def _pair(name: str, value: Any) -> str:
    return f"{json.dumps(name)}: {json.dumps(value, sort_keys=True)}"


def json_rows(value: ReleaseRow | ReleaseColumns, labels: ReleaseLabels) -> list[str]:
    """The labelled JSON text of each release row of ``value`` (one row, or a group's rows in group order)."""
    if not isinstance(value, ReleaseColumns):
        return [json.dumps(labels(value)._asdict(), sort_keys=True)]
    batch = value.batch
    if not len(batch):
        return []
    first = labels(release_to_row(batch.rows()[0], value.guarantee, value.step_start, value.step_end))._asdict()
    # one %-template per group step: the shared pairs as text, a slot for each per-row column (sorted order)
    template = "{" + ", ".join(f"{json.dumps(name)}: %s" if name in _PER_ROW
                               else _pair(name, first[name]).replace("%", "%%") for name in sorted(first)) + "}"
    values = batch.values.tolist()  # a named value (value_name) is flattened as one vector too
    return [template % (json.dumps(stream), json.dumps(vector)) for stream, vector in zip(batch.streams, values)]
