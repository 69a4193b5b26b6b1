"""Reading Parquet and CSV files starts no Arrow thread pool (whose teardown at exit can abort the process)."""

import io
import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_dp.io.tables import read_csv_rows, read_parquet_batches

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts native threads via /proc")

SCRIPT = textwrap.dedent("""
    import io, os, sys, threading, time
    import pyarrow as pa, pyarrow.csv as pacsv, pyarrow.parquet as pq
    from beam_dp.io.tables import iter_parquet_batches, read_csv_rows, read_parquet_batches
    def threads():  # live native threads, less jemalloc's background thread (a plain pthread)
        names = []
        for task in os.listdir("/proc/self/task"):
            try:
                names.append(open(f"/proc/self/task/{task}/comm").read().strip())
            except OSError:  # ended since the listing
                pass
        return sum(name != "jemalloc_bg_thd" for name in names)
    parquet = io.BytesIO()
    pq.write_table(pa.table({"a": list(range(5000)), "s": ["x"] * 5000}), parquet)
    path = sys.argv[2]
    pq.write_table(pa.table({"a": list(range(5000)), "s": ["x"] * 5000}), path, row_group_size=1000)
    text = b"a,b\\n" + b"".join(b"%d,%d\\n" % (i, i) for i in range(5000))
    def read():
        if sys.argv[1] == "ours":
            read_parquet_batches(io.BytesIO(parquet.getvalue()))
            with open(path, "rb") as fh:  # a file read row group by row group (what the job's readers do)
                assert sum(batch.num_rows for batch in iter_parquet_batches(fh, batch_size=500)) == 5000
            read_csv_rows(io.BytesIO(text))
        else:  # Arrow's streaming readers, which start its pools
            list(pq.ParquetFile(io.BytesIO(parquet.getvalue())).iter_batches())
            list(pacsv.open_csv(io.BytesIO(text)))
    # off the main thread, as a DoFn reads (on the main thread pyarrow's CSV reader starts its
    # Ctrl-C listener, a thread it joins at exit)
    before = threads()
    worker = threading.Thread(target=read)
    worker.start()
    worker.join()
    deadline = time.monotonic() + 5  # the worker's own thread can linger a moment after join()
    while threads() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    print(threads() - before)
""")


def _new_threads(mode: str, tmp_path) -> int:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode, str(tmp_path / "rows.parquet")], capture_output=True,
                         text=True, check=True)
    return int(out.stdout.strip())


def test_reading_starts_no_native_threads(tmp_path):
    assert _new_threads("ours", tmp_path) == 0


def test_the_thread_count_detects_arrow_pools(tmp_path):
    assert _new_threads("arrow-streaming", tmp_path) > 0


def test_batches_hold_every_row_and_bad_rows_go_to_the_handler():
    parquet = io.BytesIO()
    pq.write_table(pa.table({"a": list(range(10))}), parquet)
    batches = read_parquet_batches(io.BytesIO(parquet.getvalue()), batch_size=4)
    assert [b.num_rows for b in batches] == [4, 4, 2]
    read = read_csv_rows(io.BytesIO(b"a,b\n1,2\n3\n4,5\n"))
    assert sum(b.num_rows for b in read.batches) == 2 and [text for *_, text in read.rejected] == ["3"]
