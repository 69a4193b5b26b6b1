"""Release schema, sinks and a reader."""

from beam_dp.io.models import LinearPredictor, load_model
from beam_dp.io.readers import iter_release_tables, read_release_table, read_releases, row_to_release
from beam_dp.steps.schema import RELEASE_SCHEMA, ReleaseColumns, ReleaseRow, release_table, release_to_row
from beam_dp.io.sinks import (GatherReleaseTables, WriteReleasesToJsonLines, WriteReleasesToParquet,
                             WriteReleasesToPubSub, release_dicts)

__all__ = [
    "GatherReleaseTables",
    "LinearPredictor",
    "RELEASE_SCHEMA",
    "ReleaseColumns",
    "ReleaseRow",
    "WriteReleasesToJsonLines",
    "WriteReleasesToParquet",
    "WriteReleasesToPubSub",
    "load_model",
    "iter_release_tables",
    "read_release_table",
    "read_releases",
    "release_dicts",
    "release_table",
    "release_to_row",
    "row_to_release",
]
