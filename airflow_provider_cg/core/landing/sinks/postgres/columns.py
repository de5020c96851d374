"""How a batch's rows travel into PostgreSQL: each column's PostgreSQL type, and the COPY of
an Arrow table as CSV into an unlogged staging table (bytes as hex, nested values and headers
as JSON, timestamps in microseconds, NUL dropped from free text)."""

from __future__ import annotations

import binascii
import io
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

JSON_COLUMNS = {"headers"}
NUL_SAFE_COLUMNS = {"origin_stream", "subject", "key", "headers", "group", "member"}


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def pg_type(name: str, typ: pa.DataType) -> str:
    if name in JSON_COLUMNS:
        return "jsonb"
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return "text"
    if pa.types.is_boolean(typ):
        return "boolean"
    if pa.types.is_int8(typ) or pa.types.is_int16(typ) or pa.types.is_uint8(typ):
        return "smallint"
    if pa.types.is_int32(typ) or pa.types.is_uint16(typ):
        return "integer"
    if pa.types.is_int64(typ) or pa.types.is_uint32(typ):
        return "bigint"
    if pa.types.is_uint64(typ) or pa.types.is_decimal(typ):
        return "numeric"
    if pa.types.is_float32(typ) or pa.types.is_float16(typ):
        return "real"
    if pa.types.is_float64(typ):
        return "double precision"
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or pa.types.is_fixed_size_binary(typ):
        return "bytea"
    if pa.types.is_timestamp(typ):
        return "timestamptz" if typ.tz else "timestamp"
    if pa.types.is_date(typ):
        return "date"
    if pa.types.is_time(typ):
        return "time"
    return "jsonb"


def hex_text(arr: pa.Array) -> pa.Array:
    """Binary -> lowercase hex text (vectorised; ``decode(x, 'hex')`` reverses it)."""
    if pa.types.is_fixed_size_binary(arr.type):
        arr = arr.cast(pa.binary())
    wide = pa.types.is_large_binary(arr.type)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64 if wide else np.int32)[
        arr.offset : arr.offset + len(arr) + 1
    ]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.empty(0, np.uint8)
    start, end = int(offsets[0]), int(offsets[-1])
    hexed = binascii.hexlify(data[start:end].data)
    new_offsets = (offsets.astype(np.int64) - start) * 2
    out = pa.LargeStringArray.from_buffers(len(arr), pa.py_buffer(new_offsets), pa.py_buffer(hexed))
    if arr.null_count:
        out = pc.if_else(arr.is_null(), pa.scalar(None, pa.large_string()), out)
    return out


def json_text(arr: pa.Array) -> pa.Array:
    def default(value: Any) -> Any:
        if isinstance(value, bytes):
            return value.hex()
        return str(value)

    return pa.array(
        [None if v is None else json.dumps(v, default=default) for v in arr.to_pylist()], pa.large_string()
    )


class CsvStream:
    """File-like object producing CSV of a table batch by batch, for ``copy_expert``."""

    def __init__(self, table: pa.Table, encoders: dict[str, Any], chunk_rows: int) -> None:
        self._batches = iter(table.to_batches(max_chunksize=chunk_rows))
        self._encoders = encoders
        self._buf = memoryview(b"")
        self._options = pcsv.WriteOptions(include_header=False)

    def _next_chunk(self) -> bool:
        for batch in self._batches:
            if not batch.num_rows:
                continue
            cols = [
                self._encoders.get(name, identity)(batch.column(i))
                for i, name in enumerate(batch.schema.names)
            ]
            sink = io.BytesIO()
            pcsv.write_csv(pa.RecordBatch.from_arrays(cols, names=batch.schema.names), sink, self._options)
            self._buf = memoryview(sink.getvalue())
            return True
        return False

    def read(self, size: int = -1) -> bytes:
        if not self._buf and not self._next_chunk():
            return b""
        if size < 0 or size >= len(self._buf):
            out, self._buf = bytes(self._buf), memoryview(b"")
        else:
            out, self._buf = bytes(self._buf[:size]), self._buf[size:]
        return out

    readline = read


def identity(arr: pa.Array) -> pa.Array:
    return arr


def strip_nul(arr: pa.Array) -> pa.Array:
    has_nul = pc.match_substring(arr, "\x00")
    if not pc.any(has_nul).as_py():
        return arr
    return pc.if_else(has_nul, pa.scalar(None, arr.type), arr)


def to_us(arr: pa.Array) -> pa.Array:
    if arr.type.unit == "ns":
        return pc.cast(arr, pa.timestamp("us", tz=arr.type.tz), safe=False)
    return arr


def staging_columns(schema: pa.Schema) -> tuple[list[str], list[str], dict[str, Any]]:
    """For a batch of ``schema``: the staging table's column definitions, the SELECT list that
    turns them into the target's values, and the CSV encoder of each column that needs one."""
    stg_cols: list[str] = []
    select: list[str] = []
    encoders: dict[str, Any] = {}
    for f in schema:
        name = ident(f.name)
        typ = pg_type(f.name, f.type)
        if typ == "bytea":
            stg_cols.append(f"{name} text")
            select.append(f"decode({name}, 'hex')")
            encoders[f.name] = hex_text
        else:
            stg_cols.append(f"{name} {typ}")
            select.append(name)
            if typ == "jsonb" and f.name not in JSON_COLUMNS:
                encoders[f.name] = json_text
            elif pa.types.is_timestamp(f.type):
                encoders[f.name] = to_us
            elif typ == "text" and f.name not in NUL_SAFE_COLUMNS:
                encoders[f.name] = strip_nul
    return stg_cols, select, encoders
