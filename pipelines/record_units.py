"""The privacy unit of a per-record family's job (``--privacy-unit-column``, ``--max-unit-records``).

A per-record job (``model_release``, ``growing_db_queries``, ``online_learning``, ``lifelong``) with
``--privacy-unit-column COL --max-unit-records K`` protects one unit (the rows sharing ``COL``) of at most
``K`` records by group privacy, calibrated at the record-level budget (``docs/privacy_units.md``). The
column is read from the ``--input`` files' rows, so those are read one row at a time (the columnar block
path has no unit column), or (``--streaming``, ``--source pubsub`` / ``kafka``) from each JSON message's
field of that name: a message without it is a ``bad_unit_id`` dead letter. The flags without each other,
the column missing from the header, the demo dataset or no noise key are one-line usage errors.
"""

from __future__ import annotations

import os
from typing import Any

from pipelines.rows import require_columns
from pipelines.runner import UsageError, params_or_usage_error

__all__ = ["record_unit", "unit_id", "with_unit"]


def record_unit(opts, demo: bool, pattern: str | None) -> Any:
    """The job's :class:`~beam_dp.core.group_privacy.RecordUnit` from its flags (None: record level); with
    ``--source files`` the column must be in the header of ``pattern``."""
    from beam_dp.core.group_privacy import RecordUnit
    from beam_dp.core.noise import KEY_ENV_VAR

    column, k = getattr(opts, "privacy_unit_column", None), getattr(opts, "max_unit_records", None)
    if column is None:
        if k is not None:
            raise UsageError("--max-unit-records bounds privacy units: give --privacy-unit-column (the column of the "
                             "unit ids), or leave it out for record-level privacy")
        return None
    if k is None:
        raise UsageError("--privacy-unit-column needs --max-unit-records (the most records a unit contributes)")
    if opts.source == "files" and (demo or pattern is None):
        raise UsageError("--privacy-unit-column needs --input: the embedded demo dataset has no unit ids")
    if not (opts.noise_key_file or opts.noise_key_secret or os.environ.get(opts.noise_key_env or KEY_ENV_VAR)):
        raise UsageError("--privacy-unit-column needs the noise key (--noise-key-file, --noise-key-secret or the key "
                         "env var): unit ids are hashed with it on every worker, never with a random key")
    unit = params_or_usage_error(lambda: RecordUnit(column, k), "privacy unit")
    if pattern is not None:  # --input files (a stream's messages carry the field, or a bad_unit_id letter)
        from pipelines.records import column_names

        require_columns(column_names(pattern, "--input"), (column,), "--input")
    return unit


def with_unit(params: Any, unit: Any, what: str) -> Any:
    """``params`` protecting ``unit`` (``with_record_unit``), or unchanged when ``unit`` is None."""
    if unit is None:
        return params
    from beam_dp.beam.shell.unit_records import with_record_unit

    return params_or_usage_error(lambda: with_record_unit(params, unit), what)


def unit_id(cell: Any) -> Any:
    """A unit id cell as text: an integer read from CSV as a number becomes its digits; anything else
    stays as it is (a non-text id is then a ``bad_unit_id`` dead letter)."""
    if isinstance(cell, int) and not isinstance(cell, bool):
        return str(cell)
    return cell
