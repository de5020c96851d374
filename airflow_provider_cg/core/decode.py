"""Payload decoders for the member job: raw bytes, UTF-8 text, or JSON with a user schema.

A decoder takes a batch's Arrow table (column ``payload``) and returns the table with the
decoded column added plus ``{row_index: error}`` for rows that failed (poison messages).
JSON is parsed by Spark (``from_json`` with the user's DDL schema), so the heavy parsing runs
in the JVM; fields declared ``NOT NULL`` are enforced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

CORRUPT = "_cg_corrupt_record"


def text_decoder() -> Callable[[pa.Table], tuple[pa.Table, dict[int, str]]]:
    """Decode payloads as UTF-8 into ``payload_text``; invalid UTF-8 is poison."""

    def decode(table: pa.Table) -> tuple[pa.Table, dict[int, str]]:
        payload = table.column("payload")
        bad: dict[int, str] = {}
        try:
            text = payload.cast(pa.string())
        except pa.ArrowInvalid:
            values = []
            for i, b in enumerate(payload.to_pylist()):
                try:
                    values.append(b.decode("utf-8"))
                except UnicodeDecodeError as e:
                    bad[i] = f"payload: not valid UTF-8 ({e.reason} at byte {e.start})"
                    values.append(None)
            text = pa.chunked_array([pa.array(values, pa.string())])
        return _set_column(table, "payload_text", text), bad

    return decode


def json_decoder(spark, ddl: str) -> Callable[[pa.Table], tuple[pa.Table, dict[int, str]]]:
    """Parse payloads as JSON with the Spark DDL schema ``ddl`` into struct column ``value``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    try:
        schema = StructType.fromDDL(ddl)
    except Exception as e:  # the parser's message names the token
        raise ValueError(f"json_schema: not a valid Spark DDL schema: {e}") from None
    required = [f.name for f in schema.fields if not f.nullable]
    parse_schema = StructType([StructField(f.name, f.dataType, True) for f in schema.fields]
                              + [StructField(CORRUPT, StringType(), True)])
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}

    def decode(table: pa.Table) -> tuple[pa.Table, dict[int, str]]:
        n = table.num_rows
        if n == 0:
            return _set_column(table, "value", pa.nulls(0, _arrow_struct(spark, schema))), {}
        src = pa.table({"i": pa.array(range(n), pa.int64()), "payload": table.column("payload")})
        sdf = spark.createDataFrame(src)
        parsed = sdf.select("i", F.from_json(F.col("payload").cast("string"), parse_schema, options).alias("v"))
        out = parsed.toArrow().sort_by("i")
        values = out.column("v").combine_chunks()
        import pyarrow.compute as pc

        broken = pc.or_(values.is_null(), values.field(CORRUPT).is_valid())
        missing = None
        for name in required:
            m = values.field(name).is_null()
            missing = m if missing is None else pc.or_(missing, m)
        suspect = broken if missing is None else pc.or_(broken, missing)
        bad: dict[int, str] = {}
        for i in pc.indices_nonzero(suspect).to_pylist():  # only the few bad rows loop in Python
            if broken[i].as_py():
                bad[i] = "payload: not JSON matching the schema"
            else:
                name = next(r for r in required if not values.field(r)[i].is_valid)
                bad[i] = f"payload.{name}: is required (NOT NULL in the schema)"
        fields = [values.field(f.name) for f in schema.fields]
        value = pa.StructArray.from_arrays(fields, names=[f.name for f in schema.fields], mask=values.is_null())
        return _set_column(table, "value", value), bad

    return decode


def _arrow_struct(spark, schema) -> pa.DataType:
    empty = spark.createDataFrame([], schema).toArrow()
    return pa.struct(list(empty.schema))


def _set_column(table: pa.Table, name: str, values: Any) -> pa.Table:
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), name, values)
    return table.append_column(name, values)
