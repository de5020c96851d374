"""A batch's per-partition ranges (what the summary and the asset events report), counted with
numpy, against Arrow's own grouping of the same rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from airflow_provider_cg.core.landing.pipeline.processing import partition_ranges


def _by_arrow(table: pa.Table) -> list[tuple[int, int, int, int]]:
    grouped = table.group_by("partition").aggregate(
        [("origin_seq", "min"), ("origin_seq", "max"), ("origin_seq", "count")])
    return sorted((r["partition"], r["origin_seq_min"], r["origin_seq_max"], r["origin_seq_count"])
                  for r in grouped.to_pylist())


@pytest.mark.parametrize("seed", range(8))
def test_ranges_match_arrows_grouping(seed):
    rng = np.random.default_rng(seed)
    for n in (1, 2, 7, 300, 5000):
        width = int(rng.choice([1, 6, 64, 1 << 20]))  # one partition, a group's, many, far apart (Arrow's path)
        table = pa.table({"partition": pa.array(rng.integers(0, width, n) + int(rng.integers(0, 3)), pa.int32()),
                          "origin_seq": pa.array(rng.integers(1, 1 << 40, n), pa.int64())})
        cut = int(rng.integers(0, n + 1))
        table = pa.concat_tables([table.slice(0, cut), table.slice(cut)])  # chunked, as batches are
        assert partition_ranges(table) == _by_arrow(table), (seed, n, width)


def test_empty_and_one_partition():
    assert partition_ranges(pa.table({"partition": pa.array([], pa.int32()),
                                      "origin_seq": pa.array([], pa.int64())})) == []
    table = pa.table({"partition": pa.array([4, 4, 4], pa.int32()), "origin_seq": pa.array([9, 3, 7], pa.int64())})
    assert partition_ranges(table) == [(4, 3, 9, 3)]
