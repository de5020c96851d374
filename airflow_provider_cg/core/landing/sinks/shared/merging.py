"""Upserts: a table of current state per key, from a change stream (``merge_keys``, ``delete_when``).

Each batch's rows are reduced to the latest record per key, by origin order (``origin_seq``
within the batch's origin stream), and merged into the table: a key the table lacks is
inserted, a key it holds is replaced only by a newer record (a different origin stream name is
a later life of the stream: ``stream_life.py``), and a record the tombstone rule matches
deletes its key (again only over an older row). So a batch computed again, or landed by
another writer after a newer one, never writes an older version over a newer one.

Exactly once stays the protocol's: a batch's inputs are committed once (Delta and Iceberg:
the table's recorded position, one merge commit per group of batches; PostgreSQL: ``cg_committed_inputs``
in the prepared transaction). Rows must keep ``origin_stream`` and ``origin_seq`` (a
transformation must select them), and a key's records must come in per-key order, which the
group's partitioning gives when the key is (or determines) the partition key.

A record without its key (a merge key null, or absent from the message) is the message's
problem, not the table's: NULL matches no row in a MERGE, so such records would pile up as rows
of no key (Delta) or replace one another (Iceberg). ``refusals`` names them, the pipeline takes
their messages out of the batch before anything is prepared (to the dead-letter stream, or the
run fails with ``bad_records=fail``), and ``prepare`` refuses any that still reaches a sink.

A deleted key leaves no row behind: a record older than the delete that was never landed (a
hole a backfill later fills) would insert the key again. Keep a soft-delete column instead
(no ``delete_when``: the tombstone is then an ordinary newer version) where that matters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import SinkError
from airflow_provider_cg.core.landing.stream_life import life_number

if TYPE_CHECKING:
    from pyspark.sql import Column

#: the column a merge source carries: whether the row is a tombstone
DELETE_FLAG = "_cg_delete"
ORDER_COLUMNS = ("origin_stream", "origin_seq")
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_RULE = re.compile(rf"^\s*(?P<col>{_NAME})\s*=\s*(?:'(?P<text>[^']*)'|(?P<num>-?\d+)|(?P<bool>true|false))\s*$",
                   re.IGNORECASE)


@dataclass(frozen=True)
class MergeSpec:
    """The key columns, and the tombstone rule (``column = value``) if any."""

    keys: tuple[str, ...]
    delete_column: str | None = None
    delete_value: Any = None

    @classmethod
    def parse(cls, merge_keys: str, delete_when: str | None = None) -> MergeSpec:
        keys = tuple(k.strip() for k in merge_keys.split(","))
        if not keys or any(not re.fullmatch(_NAME, k) for k in keys):
            raise ConfigError("merge_keys", f"must be comma-separated column names (got {merge_keys!r})")
        if len(set(keys)) != len(keys):
            raise ConfigError("merge_keys", f"names a column twice ({merge_keys!r})")
        if any(k in ORDER_COLUMNS for k in keys):
            raise ConfigError("merge_keys", "origin_stream and origin_seq order the records of a key; they cannot "
                                            "be its key")
        if delete_when is None:
            return cls(keys)
        m = _RULE.match(delete_when)
        if not m:
            raise ConfigError("delete_when", "must be column = 'text', column = <integer> or column = true|false "
                                             f"(got {delete_when!r})")
        if m["col"] in keys:
            raise ConfigError("delete_when", f"{m['col']!r} is a merge key; a tombstone rule reads another column")
        value: Any = m["text"] if m["text"] is not None else (
            int(m["num"]) if m["num"] is not None else m["bool"].lower() == "true")
        return cls(keys, m["col"], value)

    def check_schema(self, schema: pa.Schema) -> None:
        """The batch has the key, order and tombstone columns (``SchemaMismatch`` naming one)."""
        from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import SchemaMismatch

        for col in (*self.keys, *ORDER_COLUMNS, *([self.delete_column] if self.delete_column else [])):
            if schema.get_field_index(col) < 0:
                what = "a merge key" if col in self.keys else (
                    "ordering the records of a key" if col in ORDER_COLUMNS else "the tombstone rule's column")
                raise SchemaMismatch(col, f"is {what} but not in this batch")

    def refusals(self, table: pa.Table) -> dict[int, str]:
        """Rows without their key (a merge key null): row index -> why."""
        out: dict[int, str] = {}
        for k in self.keys:
            if table.schema.get_field_index(k) < 0 or not table.column(k).null_count:
                continue
            missing = pc.is_null(table.column(k)).to_numpy(zero_copy_only=False)
            for i in np.flatnonzero(missing):
                out.setdefault(int(i), self.missing_key(k))
        return out

    def refusal_column(self, columns: list[str]) -> Column | None:
        """``refusals`` as a Spark column over a DataFrame with ``columns`` (None when it lacks a
        key column: the sink's schema check names it)."""
        from pyspark.sql import functions as F

        if any(k not in columns for k in self.keys):
            return None
        why = F.when(F.col(self.keys[0]).isNull(), F.lit(self.missing_key(self.keys[0])))
        for k in self.keys[1:]:
            why = why.when(F.col(k).isNull(), F.lit(self.missing_key(k)))
        return why

    @staticmethod
    def missing_key(column: str) -> str:
        return f"column {column!r}: a merge key, is null or missing"

    def tombstones(self, table: pa.Table) -> np.ndarray:
        """Per row: whether the tombstone rule matches it."""
        if self.delete_column is None or table.num_rows == 0:
            return np.zeros(table.num_rows, dtype=bool)
        col = table.column(self.delete_column)
        hit = pc.equal(col, pa.scalar(self.delete_value, col.type) if not isinstance(self.delete_value, str)
                       else pc.cast(pa.scalar(self.delete_value), col.type))
        return pc.fill_null(hit, False).to_numpy(zero_copy_only=False)

    def latest(self, table: pa.Table) -> pa.Table:
        """The latest record of each key (by origin order), with ``DELETE_FLAG`` set on tombstones."""
        if table.num_rows == 0:
            return table.append_column(DELETE_FLAG, pa.array([], pa.bool_()))
        if self.refusals(table):  # refused before prepare (the pipeline, the sinks): never merged
            raise SinkError("rows without their merge key reached a merge (they are refused before prepare)")
        order = np.lexsort((table.column("origin_seq").to_numpy(), _life_numbers(table.column("origin_stream"))))
        ranked = table.take(pa.array(order[::-1]))  # newest first
        index = pa.table({**{f"k{i}": ranked.column(k) for i, k in enumerate(self.keys)},
                          "row": pa.array(np.arange(ranked.num_rows))})
        first = index.group_by([f"k{i}" for i in range(len(self.keys))], use_threads=False) \
            .aggregate([("row", "min")]).column("row_min").to_numpy()
        out = ranked.take(pa.array(np.sort(first)))
        return out.append_column(DELETE_FLAG, pa.array(self.tombstones(out)))


def _life_numbers(streams: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """The life of each row's origin stream key (``stream_life.life_number``)."""
    return np.fromiter((life_number(s) for s in streams.to_pylist()), np.int64, len(streams))


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
