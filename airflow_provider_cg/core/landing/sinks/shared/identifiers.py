"""Names of the sinks' tables and their rules, shared by a sink's declaration (``declaration.py``)
and its writer: an Iceberg table's ``namespace.table``, a PostgreSQL identifier, and the
PostgreSQL sink's own bookkeeping tables."""

from __future__ import annotations

import re
from typing import Any

from airflow_provider_cg.core.errors import ConfigError


def parse_identifier(table: str) -> tuple[str, str]:
    """``namespace.table`` of an Iceberg table, as its two names."""
    parts = table.split(".") if table else []
    if len(parts) != 2 or not all(p and p.replace("_", "").isalnum() for p in parts):
        raise ConfigError("iceberg_table", f"must be namespace.table of letters, digits and '_' (got {table!r})")
    return parts[0], parts[1]


PG_MAX_IDENTIFIER = 63  # bytes; PostgreSQL silently truncates longer names
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

REFS_TABLE = "cg_prepared_writes"
MARKERS_TABLE = "cg_committed_writes"
FENCES_TABLE = "cg_partition_fences"
INPUTS_TABLE = "cg_committed_inputs"  # per target: input messages of transformed batches
LIVES_TABLE = "cg_stream_lives"  # per target and origin stream: the lives landed (stream_life.py)
MARKS_TABLE = "cg_origin_marks"  # per target and origin key: each committed batch's origin mark (stream_life.py)
OWN_TABLES = (REFS_TABLE, MARKERS_TABLE, FENCES_TABLE, INPUTS_TABLE, LIVES_TABLE, MARKS_TABLE)  # never a target


def validate_identifier(field: str, name: Any) -> str:
    """A table or schema name: a plain SQL identifier of at most 63 bytes (PostgreSQL would
    cut a longer one, and two names could then mean one table)."""
    if not isinstance(name, str) or not name:
        raise ConfigError(field, "must be a non-empty name")
    if len(name.encode()) > PG_MAX_IDENTIFIER:
        raise ConfigError(field, f"must be at most {PG_MAX_IDENTIFIER} bytes (PostgreSQL truncates longer names)")
    if not _IDENTIFIER.fullmatch(name):
        raise ConfigError(field, "must be a plain identifier: a letter or _, then letters, digits or _")
    return name
