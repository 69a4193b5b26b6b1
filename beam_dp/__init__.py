"""beam_dp: continual differentially private releases from unbounded streams, on Apache Beam.

Layers (see README): ``beam_dp.core`` (release record, guarantees and ledger, keyed noise,
clipping, step clock; no Beam), ``beam_dp.mechanisms`` (pure state machines), ``beam_dp.beam``
(the Beam adapter and public transforms) and ``beam_dp.io`` (release schema and sinks).
"""

__version__ = "0.1.0"

from beam_dp.loading import install_while_loading  # noqa: E402  (signal, os, sys only)

install_while_loading("beam_dp")  # `python -m beam_dp.verify` etc.: Ctrl-C while loading is one line, exit 130
del install_while_loading


def _quiet_third_party_import_noise() -> None:
    """Drop the one warning Beam logs on the root logger when imported without its gcp extra
    ("apitools not found ..."): it concerns BigQuery, which beam_dp never uses. Nothing else is hidden."""
    import logging

    class _DropApitools(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not str(record.msg).startswith("apitools not found")

    root = logging.getLogger()
    if not any(type(f).__name__ == "_DropApitools" for f in root.filters):  # once, also after a reload
        root.addFilter(_DropApitools())


_quiet_third_party_import_noise()
