"""The PostgreSQL sink's tables: the target (keyed by the message's origin, by the merge keys,
or a transformation's own columns) and the side tables of the two-phase protocol (stream
lives, claimed inputs, message refs, partition fences, commit markers, origin marks), created
if absent and widened by the columns a batch brings, in one transaction under one advisory lock
so concurrent writers never race on DDL."""

from __future__ import annotations

import pyarrow as pa

from airflow_provider_cg.core.landing.rows import ROW_SCHEMA
from airflow_provider_cg.core.landing.sinks.postgres.columns import ident, pg_type
from airflow_provider_cg.core.landing.sinks.postgres.pg_connection import Cursor, rollback_quietly
from airflow_provider_cg.core.landing.sinks.shared.identifiers import (
    FENCES_TABLE,
    INPUTS_TABLE,
    LIVES_TABLE,
    MARKERS_TABLE,
    MARKS_TABLE,
    REFS_TABLE,
)
from airflow_provider_cg.core.landing.sinks.shared.merging import DELETE_FLAG, MergeSpec

#: the side tables' columns: one row per stream life, claimed input, prepared write, fenced
#: partition and committed write (``writer.py`` says how the protocol uses each)
SIDE_TABLES = {
    LIVES_TABLE: "n bigserial, target text NOT NULL, stream text NOT NULL, created text NOT NULL, "
                 "key text NOT NULL, from_seq bigint NOT NULL DEFAULT 1, anchor jsonb, "
                 "recorded_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (target, stream, created, key)",
    INPUTS_TABLE: "target text NOT NULL, origin_stream text NOT NULL, origin_seq bigint NOT NULL, "
                  "gid text NOT NULL, PRIMARY KEY (target, origin_stream, origin_seq)",
    REFS_TABLE: "gid text PRIMARY KEY, target text NOT NULL, stream text NOT NULL, grp text NOT NULL, "
                "member text NOT NULL, batch_seq bigint NOT NULL, rows bigint NOT NULL, refs jsonb NOT NULL, "
                "acking boolean NOT NULL DEFAULT false, prepared_at timestamptz NOT NULL DEFAULT now()",
    FENCES_TABLE: "target text NOT NULL, stream text NOT NULL, grp text NOT NULL, partition integer NOT NULL, "
                  "owner text NOT NULL, fenced_at timestamptz NOT NULL DEFAULT now(), "
                  "PRIMARY KEY (target, stream, grp, partition)",
    MARKERS_TABLE: "gid text PRIMARY KEY, target text NOT NULL, rows_written bigint NOT NULL, "
                   "duplicates_skipped bigint NOT NULL, committed_at timestamptz NOT NULL DEFAULT now()",
    # inserted by the prepared transaction, so a mark counts once its write is committed; only
    # ever inserted (no row lock that two members' prepared writes could wait on)
    MARKS_TABLE: "target text NOT NULL, origin_stream text NOT NULL, seq bigint NOT NULL, ts bigint NOT NULL, "
                 "gid text NOT NULL, PRIMARY KEY (target, origin_stream, seq, gid)",
}


def target_columns(arrow_schema: pa.Schema, *, merge: MergeSpec | None, transformed: bool) -> str:
    """The target's column list with its key: the merge keys for upserts, the message's origin
    for rows as read, none for a transformation's output (``arrow_schema``: its first batch)."""
    if merge is not None:
        cols = ", ".join(f"{ident(f.name)} {pg_type(f.name, f.type)}" for f in arrow_schema if f.name != DELETE_FLAG)
        return f"{cols}, PRIMARY KEY ({', '.join(ident(k) for k in merge.keys)})"
    if transformed:
        return ", ".join(f"{ident(f.name)} {pg_type(f.name, f.type)}" for f in arrow_schema)
    cols = ", ".join(f"{ident(f.name)} {pg_type(f.name, f.type)}" for f in ROW_SCHEMA)
    return f'{cols}, PRIMARY KEY ("origin_stream", "origin_seq")'


def _lives_by_first_seq(cur: Cursor, schema: str, lives: str) -> None:
    """A lives table of an older version: its lives get their first sequence (1), and a stream
    created once may have several (after its store went back). No prepared write touches it."""
    cur.execute("SELECT 1 FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
                "AND column_name = 'from_seq'", (schema, LIVES_TABLE))
    if cur.fetchone() is not None:
        return
    cur.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'", (lives,))
    pkey = cur.fetchone()
    cur.execute(f"ALTER TABLE {lives} ADD COLUMN IF NOT EXISTS from_seq bigint NOT NULL DEFAULT 1, "
                "ADD COLUMN IF NOT EXISTS anchor jsonb")
    if pkey is not None:
        cur.execute(f"ALTER TABLE {lives} DROP CONSTRAINT {ident(pkey[0])}")
    cur.execute(f"ALTER TABLE {lives} ADD PRIMARY KEY (target, stream, created, key)")


def create_tables(cur: Cursor, schema: str, table: str, arrow_schema: pa.Schema | None, *,
                  merge: MergeSpec | None, transformed: bool) -> set[str] | None:
    """Create what is missing and add the columns ``arrow_schema`` has and the target lacks;
    ``arrow_schema=None``: the side tables only (a transformation's output not seen yet).
    Returns the target's columns (``None`` without a target)."""
    def side(name: str) -> str:
        return f"{ident(schema)}.{ident(name)}"

    target = side(table)
    cur.execute("BEGIN")
    try:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext('airflow-provider-cg ddl'))")
        if arrow_schema is not None:
            columns = target_columns(arrow_schema, merge=merge, transformed=transformed)
            cur.execute(f"CREATE TABLE IF NOT EXISTS {target} ({columns})")
        for name, columns in SIDE_TABLES.items():
            cur.execute(f"CREATE TABLE IF NOT EXISTS {side(name)} ({columns})")
        # added in later versions; ALTER only when missing: even IF NOT EXISTS takes an
        # exclusive lock, which waits behind every prepared write holding a marker row
        cur.execute(f"ALTER TABLE {side(REFS_TABLE)} ADD COLUMN IF NOT EXISTS fence jsonb")
        cur.execute("SELECT 1 FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
                    "AND column_name = 'origin'", (schema, MARKERS_TABLE))
        if cur.fetchone() is None:
            cur.execute(f"ALTER TABLE {side(MARKERS_TABLE)} ADD COLUMN IF NOT EXISTS origin jsonb")
        _lives_by_first_seq(cur, schema, side(LIVES_TABLE))
        if arrow_schema is None:
            cur.execute("COMMIT")
            return None
        cur.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
                    "AND table_name = %s", (schema, table))
        existing = {r[0] for r in cur.fetchall()}
        for f in arrow_schema:
            if f.name not in existing and f.name != DELETE_FLAG:
                cur.execute(f"ALTER TABLE {target} ADD COLUMN IF NOT EXISTS {ident(f.name)} {pg_type(f.name, f.type)}")
                existing.add(f.name)
        cur.execute("COMMIT")
    except BaseException:
        rollback_quietly(cur)
        raise
    return existing
