"""A batch's inputs that its table (each table of a routed sink) holds already: a redelivery of
a landed message, a backfill of a landed window, a routed batch after a crash between two
tables' commits. They are dropped before the batch is computed, so exactly-once holds per
input message whatever the transformation makes of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cg.core.landing.sinks.routing import RoutedRows, RoutedSink, RoutePart
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import TwoPhaseSink, keys_by_stream
from airflow_provider_cg.core.landing.stream_life import OriginKeys

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def committed_inputs(sink: TwoPhaseSink, table: pa.Table) -> np.ndarray:
    """Mask of the rows whose input message is committed already (a redelivery of a landed
    message, a backfill of a landed window)."""
    drop = np.zeros(table.num_rows, dtype=bool)
    if table.num_rows == 0:
        return drop
    streams = table.column("origin_stream")
    seqs = table.column("origin_seq").to_numpy()
    for stream in pc.unique(streams).to_pylist():
        rows = pc.equal(streams, stream).to_numpy(zero_copy_only=False)
        drop[rows] = sink.committed_keys_exist(stream, seqs[rows])
    return drop


def excluding(frame: DataFrame, keys: dict[str, np.ndarray]) -> DataFrame:
    """``frame`` without the inputs ``keys`` names ({origin_stream: origin_seqs}), as ranges of
    consecutive sequences (a few, as a table's committed inputs are), else by a join."""
    from pyspark.sql import functions as F

    from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import seq_ranges

    for stream, seqs in keys.items():
        seqs = np.unique(np.asarray(seqs, dtype=np.int64))
        if not len(seqs):
            continue
        runs = list(seq_ranges(seqs))
        if len(runs) <= 64:
            hit = None
            for first, last in runs:
                one = F.col("origin_seq").between(first, last)
                hit = one if hit is None else hit | one
            if hit is None:
                continue
            frame = frame.where(~((F.col("origin_stream") == F.lit(stream)) & hit))
        else:
            spark = frame.sparkSession
            held = spark.createDataFrame(pa.table({"_cg_stream": pa.array([stream] * len(seqs)),
                                                   "_cg_seq": pa.array(seqs)}))
            frame = frame.join(held, (frame["origin_stream"] == held["_cg_stream"])
                               & (frame["origin_seq"] == held["_cg_seq"]), "left_anti")
    return frame


def nothing_staged(sink: TwoPhaseSink, empty: pa.Table) -> RoutedRows | pa.Table:
    """What a batch whose every input is landed already stages: nothing, per route too."""
    if isinstance(sink, RoutedSink):
        return RoutedRows({n: RoutePart(empty, None, {}) for n in sink.routes.names})
    return empty


@dataclass
class TableInputs:
    """Which of a batch's inputs each table holds already: one mask per table (a single sink:
    one), over the batch's rows. After a crash between two tables' commits of a routed batch,
    the tables differ; each computes its share without what it holds."""

    each: dict[str | None, np.ndarray]

    @classmethod
    def of(cls, sink: TwoPhaseSink, table: pa.Table) -> TableInputs:
        if isinstance(sink, RoutedSink):
            return cls({n: committed_inputs(s, table) for n, s in sink.sinks.items()})
        return cls({None: committed_inputs(sink, table)})

    @classmethod
    def of_seqs(cls, sink: TwoPhaseSink, origin: OriginKeys, seqs: np.ndarray) -> TableInputs:
        """Of inputs given by origin sequence, under the keys ``origin`` gives them."""
        if not len(seqs):
            return cls({None: np.zeros(0, dtype=bool)})
        if isinstance(sink, RoutedSink):
            return cls({n: origin.mask(seqs, s.committed_keys_exist) for n, s in sink.sinks.items()})
        return cls({None: origin.mask(seqs, sink.committed_keys_exist)})

    @property
    def everywhere(self) -> np.ndarray:
        masks = list(self.each.values())
        out = masks[0].copy()
        for m in masks[1:]:
            out &= m
        return out

    def extra_keys(self, table: pa.Table) -> dict[str, dict[str, np.ndarray]]:
        """Per route, the inputs its table holds that not every table does."""
        every, out = self.everywhere, {}
        for name, mask in self.each.items():
            only = mask & ~every
            if name is not None and only.any():
                out[name] = {st: np.sort(q) for st, q in keys_by_stream(table.filter(pa.array(only))).items()}
        return out

    def extra_keys_of(self, origin: OriginKeys, seqs: np.ndarray,
                      known: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, np.ndarray]]:
        """``extra_keys`` of inputs given by sequence, minus those already ``known``."""
        every, out = self.everywhere, {}
        for name, mask in self.each.items():
            only = np.sort(seqs[mask & ~every])
            if name is None or not len(only):
                continue
            new = {}
            for key, part in origin.split(only).items():
                seen = (known.get(name) or {}).get(key)
                part = part if seen is None else np.setdiff1d(part, seen)
                if len(part):
                    new[key] = part
            if new:
                out[name] = new
        return out


