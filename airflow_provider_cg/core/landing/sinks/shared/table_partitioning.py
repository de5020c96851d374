"""Partitioned tables: the ``partition_by`` option, and splitting a batch's rows per partition.

A Delta table is partitioned by column values (``region, order_date``); an Iceberg table by
partition transforms of columns (``day(ts), bucket(16, id), truncate(4, name), region``). The
columns may be ones the user's transformation derives: they are checked against each batch's
schema before any message is acknowledged (``SchemaMismatch``, exit 1).

Every data file holds the rows of one partition (Delta's ``partitionValues`` and Iceberg's
partition record are per file), so a writer splits its rows by partition key, keeping their
order within each file; readers order by ``origin_seq`` across files as before. The
partition columns stay in the files (Iceberg requires it; Delta readers take the values from
the log and ignore them), and a file's partition is read back from its first row at publish.
Iceberg's transforms are pyiceberg's own (its ``pyiceberg-core`` extension computes them over
Arrow arrays), so a row lands in the partition Iceberg's readers look for it in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from airflow_provider_cg.core.errors import ConfigError

if TYPE_CHECKING:
    from pyiceberg.transforms import Transform
    from pyiceberg.types import IcebergType

TRANSFORMS = ("identity", "year", "month", "day", "hour", "bucket", "truncate")
_WITH_WIDTH = ("bucket", "truncate")
_FIELD = re.compile(r"^\s*(?:(?P<fn>[a-z]+)\s*\(\s*(?:(?P<width>\d+)\s*,\s*)?(?P<arg>[A-Za-z_][A-Za-z0-9_]*)\s*\)"
                    r"|(?P<col>[A-Za-z_][A-Za-z0-9_]*))\s*$")


def _column_type_ok(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)
            or pa.types.is_date32(t) or pa.types.is_boolean(t))


def _temporal(t: pa.DataType) -> bool:
    return pa.types.is_date32(t) or pa.types.is_timestamp(t)


def _iceberg_type_ok(transform: str, t: pa.DataType) -> bool:
    text = pa.types.is_string(t) or pa.types.is_large_string(t)
    if transform in ("year", "month", "day"):
        return _temporal(t)
    if transform == "hour":
        return pa.types.is_timestamp(t)
    if transform == "truncate":
        return text or pa.types.is_integer(t)
    return text or pa.types.is_integer(t) or pa.types.is_date32(t) or pa.types.is_timestamp(t) or (
        transform == "identity" and pa.types.is_boolean(t))


@dataclass(frozen=True)
class PartitionField:
    """One partition field: a column, a transform and its width (bucket count, truncate width)."""

    column: str
    transform: str = "identity"
    width: int | None = None

    def __str__(self) -> str:
        if self.transform == "identity":
            return self.column
        inner = f"{self.width}, {self.column}" if self.width is not None else self.column
        return f"{self.transform}({inner})"

    @property
    def name(self) -> str:
        """The Iceberg partition field's name: the column, or ``<column>_<transform>``."""
        return self.column if self.transform == "identity" else f"{self.column}_{self.transform}"

    def iceberg_transform(self) -> Transform:
        from pyiceberg.transforms import (
            BucketTransform,
            DayTransform,
            HourTransform,
            IdentityTransform,
            MonthTransform,
            TruncateTransform,
            YearTransform,
        )

        simple = {"identity": IdentityTransform, "year": YearTransform, "month": MonthTransform,
                  "day": DayTransform, "hour": HourTransform}
        if self.transform in simple:
            return simple[self.transform]()
        if self.width is None:  # (parse gives bucket and truncate their width)
            raise ConfigError("partition_by", f"{self.transform} needs a width: {self.transform}(<n>, <column>)")
        return (BucketTransform if self.transform == "bucket" else TruncateTransform)(self.width)


@dataclass(frozen=True)
class Partitioning:
    """A table's partition fields, in order (``parse`` reads the ``partition_by`` option)."""

    fields: tuple[PartitionField, ...]
    sink: str = "delta"  # the table's sink, as its messages name it
    transforms: bool = False  # Iceberg's transforms (``day(ts)``), not only columns (Delta)

    @classmethod
    def parse(cls, text: str, sink: str, *, transforms: bool) -> Partitioning:
        """``ConfigError("partition_by", ...)`` naming the rule a field breaks; ``transforms``:
        the sink takes Iceberg's partition transforms (``SinkKind.partition_transforms``)."""
        items = _split(text)
        if not items or any(not s.strip() for s in items):
            raise ConfigError("partition_by", f"must be comma-separated partition fields (got {text!r})")
        fields = []
        for item in items:
            m = _FIELD.match(item)
            if not m:
                raise ConfigError("partition_by", f"{item.strip()!r} is not a column or transform(column)")
            if m["col"]:
                field = PartitionField(m["col"])
            else:
                fn, width = m["fn"], m["width"]
                if fn not in TRANSFORMS:
                    raise ConfigError("partition_by", f"unknown transform {fn!r} (one of {', '.join(TRANSFORMS)})")
                if (fn in _WITH_WIDTH) != (width is not None):
                    form = f"{fn}(N, column)" if fn in _WITH_WIDTH else f"{fn}(column)"
                    raise ConfigError("partition_by", f"{item.strip()!r}: write it as {form}")
                if width is not None and int(width) < 1:
                    raise ConfigError("partition_by", f"{item.strip()!r}: the width must be >= 1")
                field = PartitionField(m["arg"], fn, int(width) if width is not None else None)
            if not transforms and field.transform != "identity":
                raise ConfigError("partition_by", f"{field} is an Iceberg transform; a {sink.capitalize()} table is partitioned "
                                                  "by columns (derive one in your transformation, e.g. "
                                                  "to_date(ts) AS order_date)")
            fields.append(field)
        names = [f.name for f in fields]
        if len(set(names)) != len(names) or (not transforms and len({f.column for f in fields}) != len(fields)):
            raise ConfigError("partition_by", f"names a partition field twice ({text!r})")
        return cls(tuple(fields), sink, transforms)

    def __str__(self) -> str:
        return ", ".join(str(f) for f in self.fields)

    @property
    def columns(self) -> list[str]:
        """The source columns, in order, each once."""
        return list(dict.fromkeys(f.column for f in self.fields))

    def check_schema(self, schema: pa.Schema) -> None:
        """Refuse a batch whose partition columns are missing or of a type the field cannot take."""
        from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import SchemaMismatch

        for f in self.fields:
            idx = schema.get_field_index(f.column)
            if idx < 0:
                raise SchemaMismatch(f.column, f"is a partition column (partition_by {self}) but not in this batch")
            t = schema.field(idx).type
            ok = _iceberg_type_ok(f.transform, t) if self.transforms else _column_type_ok(t)
            if not ok:
                raise SchemaMismatch(f.column, f"has type {t}, which {f} cannot partition a {self.sink} table by")

    def keys(self, data: pa.Table | pa.RecordBatch) -> list[pa.Array]:
        """Per field, each row's partition value (Iceberg: after the field's transform)."""
        out = []
        for f in self.fields:
            col = data.column(f.column)
            if isinstance(col, pa.ChunkedArray):
                col = col.combine_chunks()
            if f.transform != "identity":
                col = f.iceberg_transform().pyarrow_transform(_iceberg_type(col.type))(col)
            out.append(col)
        return out

    def split(self, data: pa.Table | pa.RecordBatch) -> list[pa.Table | pa.RecordBatch]:
        """The rows of each partition (order kept within each), partitions in order of first row."""
        if data.num_rows == 0:
            return []
        keys = self.keys(data)
        names = [f"k{i}" for i in range(len(keys))]
        index = pa.table({**dict(zip(names, keys, strict=True)), "row": pa.array(range(data.num_rows), pa.int64())})
        groups = index.group_by(names, use_threads=False).aggregate([("row", "list")])
        if groups.num_rows == 1:
            return [data]
        # without threads, groups come in order of their first row, and each list in row order
        return [data.take(pa.array(rows, pa.int64())) for rows in groups.column("row_list").to_pylist()]

    def first_values(self, data: pa.Table) -> list:
        """Each field's partition value of a one-partition file's first row (Python values)."""
        return [k[0].as_py() for k in self.keys(data.slice(0, 1))]

    def delta_values(self, values: list) -> dict[str, str | None]:
        """Delta's ``partitionValues`` for a file's partition values: each column's as text."""
        out = {}
        for f, value in zip(self.fields, values, strict=True):
            out[f.column] = None if value is None else (str(value).lower() if isinstance(value, bool)
                                                        else str(value))
        return out


def _split(text: str) -> list[str]:
    """Split on the commas between fields, not those inside ``bucket(16, id)``."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return out


def _iceberg_type(t: pa.DataType) -> IcebergType:
    from pyiceberg import types as it

    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return it.StringType()
    if pa.types.is_int64(t):
        return it.LongType()
    if pa.types.is_integer(t):
        return it.IntegerType()
    if pa.types.is_date32(t):
        return it.DateType()
    if pa.types.is_timestamp(t):
        return it.TimestamptzType() if t.tz else it.TimestampType()
    if pa.types.is_boolean(t):
        return it.BooleanType()
    raise ConfigError("partition_by", f"cannot partition by a column of type {t}")
