"""``SizedParquetFiles``: the one writer of data files keeps every file at or under the target
(incompressible, compressible and mixed rows; rows arriving at once or as a task's stream),
in row order, and reads back to exactly the rows given."""

from __future__ import annotations

import io
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_cg.core.landing.sinks.lake.parquet_files import SizedParquetFiles, data_file_options

MIB = 1 << 20


def _rows(n: int, make) -> pa.Table:
    return pa.table({"origin_seq": pa.array(range(1, n + 1), pa.int64()), "blob": pa.array([make(i) for i in range(n)])})


CASES = {
    "random bytes": lambda i: os.urandom(2000),
    "compressible text": lambda i: f"order {i} paid by customer {i % 97} ".encode() * 40,
    "mixed sizes": lambda i: os.urandom(random.Random(i).choice((10, 200, 5000))),
}


@pytest.mark.parametrize("kind", list(CASES))
@pytest.mark.parametrize("streamed", [False, True], ids=["at once", "as a task's batches"])
def test_every_file_stays_under_the_target_in_row_order(kind, streamed):
    table = _rows(6000, CASES[kind])
    w = SizedParquetFiles(table.schema, MIB, **data_file_options(table.schema, "snappy", True))
    if streamed:  # Spark hands a task Arrow batches of up to 10,000 rows
        files = [f for b in table.to_batches(max_chunksize=777) for f in w.add(b)] + list(w.finish())
    else:
        files = w.files(table)
    sizes = [len(data) for data, _ in files]
    assert max(sizes) <= 1.05 * MIB, (kind, sizes)
    total = table.nbytes
    if kind == "random bytes":  # ~12 MB that cannot compress: files are full, not small
        assert len(files) <= -(-total // MIB) + 1 and min(sizes[:-1]) >= 0.8 * MIB, sizes
    back = [pq.read_table(io.BytesIO(data)) for data, _ in files]
    assert [t.num_rows for t in back] == [rows for _, rows in files]
    seqs = pa.concat_tables(back).column("origin_seq").to_pylist()
    assert seqs == list(range(1, 6001))


def test_without_a_target_one_file_holds_everything():
    table = _rows(3000, CASES["random bytes"])
    files = SizedParquetFiles(table.schema, None).files(table)
    assert len(files) == 1 and files[0][1] == 3000


def test_a_row_larger_than_the_target_is_a_file_of_its_own():
    table = pa.table({"origin_seq": [1, 2, 3], "blob": [os.urandom(10), os.urandom(MIB + 5000), os.urandom(10)]})
    files = SizedParquetFiles(table.schema, MIB).files(table)
    assert [rows for _, rows in files] == [1, 1, 1] or [rows for _, rows in files] == [2, 1], files
    assert sum(rows for _, rows in files) == 3
