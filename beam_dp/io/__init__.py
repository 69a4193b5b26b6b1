"""Release schema, sinks and a reader.

Exports are loaded on first use (``beam_dp.lazy``): importing the package imports none of its modules
(``beam_dp.io.tables`` alone does not import Beam).
"""

from beam_dp.lazy import lazy_exports

_EXPORTS = {
    "DICTIONARY_COLUMNS": "beam_dp.io.sinks",
    "GatherReleaseTables": "beam_dp.io.sinks",
    "LinearPredictor": "beam_dp.io.models",
    "RELEASE_SCHEMA": "beam_dp.steps.schema",
    "ReleaseColumns": "beam_dp.steps.schema",
    "ReleaseRow": "beam_dp.steps.schema",
    "WriteReleasesToJsonLines": "beam_dp.io.sinks",
    "WriteReleasesToParquet": "beam_dp.io.sinks",
    "WriteReleasesToPubSub": "beam_dp.io.sinks",
    "load_model": "beam_dp.io.models",
    "iter_release_tables": "beam_dp.io.readers",
    "read_release_table": "beam_dp.io.readers",
    "read_releases": "beam_dp.io.readers",
    "release_dicts": "beam_dp.io.sinks",
    "release_parquet_writer": "beam_dp.io.sinks",
    "release_table": "beam_dp.steps.schema",
    "release_to_row": "beam_dp.steps.schema",
    "row_to_release": "beam_dp.io.readers",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
