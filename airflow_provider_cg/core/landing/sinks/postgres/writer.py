"""PostgreSQL sink on real two-phase commit (``PREPARE TRANSACTION``).

``prepare`` first stores the message refs in ``cg_prepared_writes`` (own, immediately
committed transaction), then in one transaction: COPY the rows into an unlogged staging table,
``INSERT INTO target ... ON CONFLICT (origin_stream, origin_seq) DO NOTHING``, drop the
staging table, insert the commit marker into ``cg_committed_writes`` and
``PREPARE TRANSACTION '<gid>'``. ``COMMIT PREPARED`` makes rows and marker visible at once;
after ``ROLLBACK PREPARED`` there is no marker, so a gid missing from ``pg_prepared_xacts``
is committed iff its marker exists. ``mark_acking`` sets ``acking`` on the refs row (an
UPDATE, outside the prepared transaction); commit/abort delete the refs row afterwards.
Recovery's ``abort_unless_acking`` first deletes the refs row ``WHERE NOT acking`` and rolls
back only if it did, so of it and ``mark_acking`` exactly one wins. ``fence`` upserts the
owner of each partition into ``cg_partition_fences``; ``mark_acking`` of a fenced write reads
those rows ``FOR SHARE`` in the transaction that sets ``acking``, so it either finishes before
a newer fence (whose owner's recovery then sees ``acking``) or sees that fence and refuses.
``recover`` lists ``pg_prepared_xacts`` by the group's gid prefix, keeps the member's own
writes and those whose fence shares a fenced partition, joins the refs rows
(a prepared write without one is reported ``acking=True``: commit is the safe choice) and
deletes refs rows whose write is no longer prepared. Markers are kept (one small row per
batch); delete old ones with ``prune_markers``. The prepared transaction also inserts the batch's
origin mark into ``cg_origin_marks`` (``stream_life.py``), visible once committed.

Blocking: a prepared transaction keeps the row locks of the keys it inserted. Another write
inserting one of those keys waits until it is committed or rolled back -- so a job must run
``recover`` before consuming, and every statement runs under ``lock_timeout`` (default 30 s)
and fails with ``SinkLockTimeout`` instead of hanging. Adding a column for a new extra
column needs an exclusive table lock, so it also waits for pending prepared writes.

The server needs ``max_prepared_transactions > 0``; COMMIT/ROLLBACK PREPARED must run as the
user who prepared (or a superuser). ``timestamp`` is stored with microsecond precision;
``headers`` as ``jsonb``; nested extra columns (e.g. the struct ``value``) as ``jsonb``;
``payload_text`` values containing NUL (not storable in ``text``) become NULL (``payload``
keeps the bytes). psycopg2 is imported lazily; error messages never contain the password.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.rows import ROW_SCHEMA, BatchId
from airflow_provider_cg.core.landing.sinks.postgres.pg_connection import (
    Cursor,
    PgConnection,
    Result,
    rollback_quietly,
)
from airflow_provider_cg.core.landing.sinks.postgres.schema import create_tables
from airflow_provider_cg.core.landing.sinks.postgres.target_writes import Inputs, TargetWrites
from airflow_provider_cg.core.landing.sinks.shared.identifiers import (
    FENCES_TABLE,
    INPUTS_TABLE,
    LIVES_TABLE,
    MARKERS_TABLE,
    MARKS_TABLE,
    OWN_TABLES,
    REFS_TABLE,
    validate_identifier,
)
from airflow_provider_cg.core.landing.sinks.shared.merging import MergeSpec
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import (
    CommitResult,
    Fence,
    FencedOut,
    LastCommit,
    MessageRefs,
    PreparedWrite,
    PreparedWriteLost,
    SinkError,
    TwoPhaseSink,
    WriteState,
    conform_table,
    decode_refs,
    encode_refs,
    keys_by_stream,
    normalize_refs,
    origin_ranges,
    recovered_by,
)
from airflow_provider_cg.core.landing.stream_life import (
    Life,
    LifeChoice,
    OriginKeys,
    OriginMark,
    origin_keys,
    to_record,
)

if TYPE_CHECKING:
    from collections.abc import Callable


class PostgresSink(TwoPhaseSink):
    """Two-phase sink into ``schema.table``; see the module docstring.

    ``dsn_or_conn_params``: a libpq DSN/URI string or psycopg2 ``connect()`` keyword dict.
    One connection per instance, serialised by a lock; use one instance per thread for
    parallel writes.
    """

    def __init__(
        self,
        dsn_or_conn_params: str | Mapping[str, Any],
        table: str = "cg_events",
        schema: str = "public",
        *,
        lock_timeout_s: float = 30.0,
        copy_chunk_rows: int = 50_000,
        transformed: bool = False,
        merge: MergeSpec | None = None,
    ) -> None:
        self.db = PgConnection(dsn_or_conn_params, lock_timeout_s=lock_timeout_s)
        self.table = validate_identifier("pg_table", table)
        self.schema = validate_identifier("pg_schema", schema)
        if table in OWN_TABLES or table.startswith("_cg_stg_"):
            raise ConfigError("pg_table", f"{table!r} is one of the sink's own tables")
        #: the target holds a transformation's output: created from the first batch's columns
        self.transformed = transformed
        #: upserts (``merging.py``): the target's key is ``merge.keys``, its rows the latest per key
        self.merge = merge
        #: the statements that put a batch into the target (``target_writes.py``)
        self.writes = TargetWrites(self.schema, self.table, merge, copy_chunk_rows)
        self._columns: set[str] | None = None
        self._side_ready = False

    # -- connection and errors -------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"PostgresSink({self.db.describe()}, table={self.schema}.{self.table})"

    def _run(self, action: str, fn: Callable[[Cursor], Result]) -> Result:
        """Run ``fn(cursor)`` on the sink's autocommit connection (``pg_connection.py``)."""
        return self.db.run(action, fn)

    def _error(self, exc: BaseException, action: str) -> SinkError:
        return self.db.error(exc, action)

    def close(self) -> None:
        self.db.close()

    @property
    def _target(self) -> str:
        return self.writes.target

    def _side(self, name: str) -> str:
        return self.writes.side(name)

    def check(self) -> None:
        """Connect and run a trivial query: ``SinkError`` (no secret in it) if that fails."""
        self._run("connect", lambda cur: cur.execute("SELECT 1"))

    # -- schema ----------------------------------------------------------------------------------

    def ensure_tables(self, arrow_schema: pa.Schema | None = None, *, transformed: bool | None = None) -> None:
        """Create the target (with PRIMARY KEY (origin_stream, origin_seq); for a
        transformation's output: its own columns, no key, made from the first batch) and side
        tables if absent, and add columns for extra fields the target lacks."""
        transformed = self.transformed if transformed is None else transformed
        side_only = transformed and arrow_schema is None  # no output schema known yet
        arrow_schema = arrow_schema if arrow_schema is not None else ROW_SCHEMA
        if side_only and (self._columns is not None or self._side_ready):
            return
        if not side_only and self._columns is not None and set(arrow_schema.names) <= self._columns:
            return

        def ddl(cur: Cursor) -> set[str] | None:
            return create_tables(cur, self.schema, self.table, None if side_only else arrow_schema,
                                 merge=self.merge, transformed=transformed)

        try:
            self._columns = self._run("create tables", ddl)
            self._side_ready = True
        except SinkError as exc:
            raise self.db.lock_error(exc, "altering the target table") from None

    # -- prepare ---------------------------------------------------------------------------------

    def fence(self, stream: str, group: str, fence: Fence) -> None:
        self.ensure_tables()
        if not fence.partitions:
            return
        target = f"{self.schema}.{self.table}"
        values = ", ".join(["(%s, %s, %s, %s, %s)"] * len(fence.partitions))
        params = [v for p in fence.partitions for v in (target, stream, group, p, fence.owner)]
        try:
            self._run(f"fence {stream}/{group}", lambda cur: cur.execute(
                f"INSERT INTO {self._side(FENCES_TABLE)} (target, stream, grp, partition, owner) VALUES {values} "
                "ON CONFLICT (target, stream, grp, partition) DO UPDATE SET owner = EXCLUDED.owner, fenced_at = now()",
                params))
        except SinkError as exc:
            raise self.db.lock_error(exc, f"fence of {stream}/{group}") from None

    def stream_life(self, stream: str, created: str, choice: LifeChoice | None = None,
                    like: Sequence[Life] = ()) -> OriginKeys:
        """From ``cg_stream_lives``; read and recorded under a transaction-level advisory lock
        per target and stream, so writers meeting a new life at once record it once."""
        self.ensure_tables()
        target = f"{self.schema}.{self.table}"

        def fn(cur: Cursor) -> OriginKeys:
            cur.execute("BEGIN")
            try:
                cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"cg-life:{target}:{stream}",))
                lives = self._lives(cur, stream)
                while new := to_record(stream, created, lives, choice, like):
                    life = new[0]
                    cur.execute(f"INSERT INTO {self._side(LIVES_TABLE)} (target, stream, created, key, from_seq, "
                                "anchor) VALUES (%s, %s, %s, %s, %s, %s)",
                                (target, stream, life.created, life.key, life.from_seq,
                                 json.dumps(life.anchor.to_list()) if life.anchor else None))
                    lives.append(life)
                cur.execute("COMMIT")
            except BaseException:
                rollback_quietly(cur)
                raise
            return origin_keys(stream, created, lives)

        return self._run(f"stream life of {stream}", fn)

    def _lives(self, cur: Cursor, stream: str) -> list[Life]:
        cur.execute(f"SELECT created, key, from_seq, anchor FROM {self._side(LIVES_TABLE)} WHERE target = %s "
                    "AND stream = %s ORDER BY n", (f"{self.schema}.{self.table}", stream))
        return [Life.from_list(row) for row in cur.fetchall()]

    def stream_lives(self, stream: str) -> list[Life]:
        self.ensure_tables()
        return self._run(f"stream lives of {stream}", lambda cur: self._lives(cur, stream))

    def origin_mark(self, key: str) -> OriginMark | None:
        """The highest of ``cg_origin_marks`` (committed writes' only: a prepared write's row is
        not visible before its ``COMMIT PREPARED``)."""
        self.ensure_tables()

        def fn(cur: Cursor) -> OriginMark | None:
            cur.execute(f"SELECT seq, ts FROM {self._side(MARKS_TABLE)} WHERE target = %s AND origin_stream = %s "
                        "ORDER BY seq DESC LIMIT 1", (f"{self.schema}.{self.table}", key))
            row = cur.fetchone()
            return OriginMark(key, int(row[0]), int(row[1])) if row else None

        return self._run(f"origin mark of {key}", fn)

    def prepare(self, batch_id: BatchId, table: pa.Table, *, message_refs: MessageRefs,
                fence: Fence | None = None, input_keys: dict[str, np.ndarray] | None = None,
                origin_mark: OriginMark | None = None) -> PreparedWrite:
        transformed = input_keys is not None
        refs = normalize_refs(message_refs)
        if transformed:
            if not isinstance(table, pa.Table):
                raise SinkError(f"expected a pyarrow.Table, got {type(table).__name__}")
        else:
            table = conform_table(table)
        if self.merge is not None:
            from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import SchemaMismatch

            self.merge.check_schema(table.schema)
            if not transformed:  # the rows are the inputs: recorded as such, each once
                input_keys = {st: np.asarray(q, dtype=np.int64) for st, q in keys_by_stream(table).items()}
            for k in self.merge.keys:
                if table.num_rows and table.column(k).null_count:
                    raise SchemaMismatch(k, "is a merge key, and this batch has rows without it")
        for i, f in enumerate(table.schema):
            if pa.types.is_dictionary(f.type):
                table = table.set_column(i, f.name, table.column(i).cast(f.type.value_type))
        self.ensure_tables(table.schema, transformed=transformed)
        inputs = [(s, [int(v) for v in np.unique(np.asarray(q, dtype=np.int64))])
                  for s, q in (input_keys or {}).items() if len(q)]
        gid = batch_id.gid
        rows_in = table.num_rows
        # what the batch read, for cg lag's last committed batch
        origin = origin_ranges({st: np.asarray(q, dtype=np.int64) for st, q in inputs} if transformed
                               else keys_by_stream(table))

        self._run("store message refs", lambda cur: self._store_refs(cur, batch_id, rows_in, refs, fence))
        try:
            self._run(f"prepare {gid}", lambda cur: self._prepare_transaction(cur, gid, table, inputs, transformed,
                                                                              origin, origin_mark))
        except BaseException as exc:
            try:
                self._run(
                    "drop message refs",
                    lambda cur: cur.execute(f"DELETE FROM {self._side(REFS_TABLE)} WHERE gid = %s", (gid,)),
                )
            except SinkError:
                pass  # recover() removes refs rows that were never prepared
            if isinstance(exc, SinkError):
                raise self.db.lock_error(exc, f"prepare of {gid}") from None
            raise
        return PreparedWrite(batch_id=batch_id, rows=rows_in, refs=refs, token=gid, fence=fence)

    def _store_refs(self, cur: Cursor, batch_id: BatchId, rows: int, refs: dict, fence: Fence | None) -> None:
        """The write's message refs, in their own committed transaction (what recovery finds)."""
        cur.execute(
            f"INSERT INTO {self._side(REFS_TABLE)} (gid, target, stream, grp, member, batch_seq, rows, refs, "
            "fence) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (batch_id.gid, f"{self.schema}.{self.table}", batch_id.stream, batch_id.group, batch_id.member,
             batch_id.batch_seq, rows, json.dumps(encode_refs(refs)), json.dumps(fence.to_dict()) if fence else None),
        )

    def _prepare_transaction(self, cur: Cursor, gid: str, table: pa.Table, inputs: Inputs,
                             transformed: bool, origin: dict, mark: OriginMark | None) -> int:
        """One transaction: the rows COPYed into an unlogged staging table, inserted (or merged)
        into the target, the commit marker (and the origin mark) written, then ``PREPARE
        TRANSACTION``; the rows written."""
        cur.execute("BEGIN")
        try:
            written, dups = self.writes.write(cur, gid, table, inputs, transformed)
            cur.execute(f"INSERT INTO {self._side(MARKERS_TABLE)} (gid, target, rows_written, duplicates_skipped, "
                        "origin) VALUES (%s, %s, %s, %s, %s)",
                        (gid, f"{self.schema}.{self.table}", written, dups, json.dumps(origin)))
            if mark is not None:
                cur.execute(f"INSERT INTO {self._side(MARKS_TABLE)} (target, origin_stream, seq, ts, gid) "
                            "VALUES (%s, %s, %s, %s, %s)", (f"{self.schema}.{self.table}", mark.key, mark.seq,
                                                           mark.ts, gid))
            cur.execute("PREPARE TRANSACTION %s", (gid,))
        except BaseException:
            rollback_quietly(cur)
            raise
        return written

    # -- commit / abort / state ------------------------------------------------------------------

    def _marker(self, cur: Cursor, gid: str) -> tuple[int, int] | None:
        cur.execute(
            f"SELECT rows_written, duplicates_skipped FROM {self._side(MARKERS_TABLE)} WHERE gid = %s", (gid,)
        )
        row = cur.fetchone()
        return (int(row[0]), int(row[1])) if row else None

    def _finish(self, verb: str, gid: str) -> tuple[bool, tuple[int, int] | None]:
        """``verb`` PREPARED gid; returns (was_prepared, marker). Retries while another session
        is finishing the same gid."""
        import psycopg2.errors as pgerr

        def fn(cur: Cursor) -> tuple[bool, tuple[int, int] | None]:
            for attempt in range(100):
                try:
                    cur.execute(f"{verb} PREPARED %s", (gid,))
                    prepared = True
                    break
                except pgerr.UndefinedObject:
                    prepared = False
                    break
                except pgerr.ObjectInUse:
                    time.sleep(min(0.01 * (attempt + 1), 0.2))
            else:
                raise SinkError(f"prepared write {gid} stayed busy in another session")
            return prepared, self._marker(cur, gid)

        return self._run(f"{verb.lower()} prepared {gid}", fn)

    def _drop_refs(self, gid: str) -> None:
        self._run(
            "drop message refs",
            lambda cur: cur.execute(f"DELETE FROM {self._side(REFS_TABLE)} WHERE gid = %s", (gid,)),
        )

    def mark_acking(self, prepared: PreparedWrite) -> PreparedWrite:
        """Set ``acking`` on the refs row, in one transaction with a ``FOR SHARE`` read of the
        write's fence rows (fenced by someone else: refuse). ``abort_unless_acking`` deletes the
        refs row only ``WHERE NOT acking`` before rolling back, so the row lock orders the two:
        no row to update means an abort claimed the write (or it finished)."""
        self.ensure_tables()
        fence, b = prepared.fence, prepared.batch_id

        def fn(cur: Cursor) -> list[int] | bool:
            cur.execute("BEGIN")
            try:
                if fence is not None and fence.partitions:
                    cur.execute(
                        f"SELECT partition, owner FROM {self._side(FENCES_TABLE)} WHERE target = %s AND stream = %s "
                        "AND grp = %s AND partition = ANY(%s) ORDER BY partition FOR SHARE",
                        (f"{self.schema}.{self.table}", b.stream, b.group, list(fence.partitions)),
                    )
                    owners = dict(cur.fetchall())
                    lost = [p for p in fence.partitions if owners.get(p) != fence.owner]
                    if lost:
                        cur.execute("ROLLBACK")
                        return lost
                cur.execute(
                    f"UPDATE {self._side(REFS_TABLE)} SET acking = true WHERE gid = %s RETURNING 1",
                    (prepared.gid,),
                )
                marked = cur.fetchone() is not None
                cur.execute("COMMIT")
            except BaseException:
                rollback_quietly(cur)
                raise
            if marked:
                cur.execute(
                    "SELECT 1 FROM pg_prepared_xacts WHERE gid = %s AND database = current_database()",
                    (prepared.gid,),
                )
                if cur.fetchone() is not None:
                    return True
            return self._marker(cur, prepared.gid) is not None  # committed already: acking is moot

        with self.db.lock:
            try:
                outcome = self._run(f"mark acking {prepared.gid}", fn)
            except SinkError as exc:
                raise self.db.lock_error(exc, f"mark acking of {prepared.gid}") from None
        if isinstance(outcome, list):
            raise FencedOut(f"prepared write {prepared.gid}: partitions {outcome} were fenced by another instance")
        if not outcome:
            raise PreparedWriteLost(f"prepared write {prepared.gid} was rolled back")
        return dataclasses.replace(prepared, acking=True)

    def abort_unless_acking(self, prepared: PreparedWrite) -> WriteState:
        """Claim the write for abort by deleting its refs row ``WHERE NOT acking`` (autocommitted,
        atomic against ``mark_acking``'s UPDATE), then roll it back. If the row is marked acking,
        leave the write prepared and return ``PREPARED``: the caller commits it."""
        with self.db.lock:
            self.ensure_tables()

            def claim(cur: Cursor) -> bool:
                cur.execute(
                    f"DELETE FROM {self._side(REFS_TABLE)} WHERE gid = %s AND NOT acking RETURNING 1",
                    (prepared.gid,),
                )
                if cur.fetchone() is not None:
                    return False
                cur.execute(f"SELECT acking FROM {self._side(REFS_TABLE)} WHERE gid = %s", (prepared.gid,))
                row = cur.fetchone()
                return bool(row and row[0])

            if self._run(f"claim abort {prepared.gid}", claim):
                return WriteState.PREPARED
            # no refs row is left, so no mark_acking can succeed from now on
            _, marker = self._finish("ROLLBACK", prepared.gid)
            return WriteState.COMMITTED if marker is not None else WriteState.ABORTED

    def commit(self, prepared: PreparedWrite) -> CommitResult:
        with self.db.lock:
            self.ensure_tables()
            _, marker = self._finish("COMMIT", prepared.gid)
            self._drop_refs(prepared.gid)
            if marker is None:
                raise PreparedWriteLost(f"prepared write {prepared.gid} was rolled back (no commit marker)")
            return CommitResult(*marker)

    def abort(self, prepared: PreparedWrite) -> WriteState:
        with self.db.lock:
            self.ensure_tables()
            _, marker = self._finish("ROLLBACK", prepared.gid)
            self._drop_refs(prepared.gid)
            return WriteState.COMMITTED if marker is not None else WriteState.ABORTED

    def state(self, prepared: PreparedWrite) -> WriteState:
        self.ensure_tables()

        def fn(cur: Cursor) -> WriteState:
            cur.execute(
                "SELECT 1 FROM pg_prepared_xacts WHERE gid = %s AND database = current_database()",
                (prepared.gid,),
            )
            if cur.fetchone():
                return WriteState.PREPARED
            return WriteState.COMMITTED if self._marker(cur, prepared.gid) else WriteState.ABORTED

        return self._run("read state", fn)

    # -- recovery --------------------------------------------------------------------------------

    def recover(self, stream: str, group: str, member: str, partitions: Iterable[int] = (),
                partition_count: int | None = None) -> list[PreparedWrite]:
        """Prepared writes this caller must finish (see ``recovered_by``; from
        ``pg_prepared_xacts``, oldest first) with their refs; also deletes such writes' refs
        rows whose write is not prepared (never was, or finished)."""
        self.ensure_tables()
        prefix = BatchId.group_prefix(stream, group)
        target = f"{self.schema}.{self.table}"
        fenced = frozenset(int(p) for p in partitions)

        def fn(cur: Cursor) -> list[PreparedWrite]:
            cur.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
                "AND left(gid, length(%s)) = %s ORDER BY prepared, gid",
                (prefix, prefix),
            )
            gids = [r[0] for r in cur.fetchall() if BatchId.is_gid(r[0])]
            cur.execute(
                f"SELECT gid, target, rows, refs, acking, fence FROM {self._side(REFS_TABLE)} "
                "WHERE left(gid, length(%s)) = %s",
                (prefix, prefix),
            )
            refs = {r[0]: r[1:] for r in cur.fetchall() if BatchId.is_gid(r[0])}

            def mine(gid: str) -> bool:
                info = refs.get(gid)
                return recovered_by(BatchId.parse(gid), Fence.from_dict(info[4]) if info else None,
                                    stream, group, member, fenced, partition_count)

            prepared = set(gids)
            orphans = [g for g in refs if g not in prepared and mine(g)]
            if orphans:
                cur.execute(f"DELETE FROM {self._side(REFS_TABLE)} WHERE gid = ANY(%s)", (orphans,))
            out = []
            for gid in gids:
                info = refs.get(gid)
                if info is not None and info[0] != target:
                    continue  # a write of the same group into another table
                if not mine(gid):
                    continue
                # no refs row: acking unknown, so report it as acking (commit is always safe)
                rows, encoded, acking = (int(info[1]), info[2], bool(info[3])) if info else (0, {}, True)
                out.append(PreparedWrite(BatchId.parse(gid), rows, decode_refs(encoded), token=gid, acking=acking,
                                         fence=Fence.from_dict(info[4]) if info else None))
            return out

        return self._run("recover", fn)

    def last_commits(self, stream: str, group: str) -> dict[str, LastCommit]:
        """From the commit markers of this target (the newest per member)."""
        self.ensure_tables()
        prefix = BatchId.group_prefix(stream, group)

        def fn(cur: Cursor) -> list[tuple]:
            cur.execute(
                f"SELECT DISTINCT ON (r.member) r.member, m.gid, m.committed_at, m.rows_written, m.origin "
                f"FROM {self._side(MARKERS_TABLE)} m JOIN LATERAL (SELECT split_part(m.gid, ':', 4) AS member) r "
                "ON true WHERE m.target = %s AND left(m.gid, length(%s)) = %s "
                "ORDER BY r.member, m.committed_at DESC, m.gid DESC",
                (f"{self.schema}.{self.table}", prefix, prefix))
            return cur.fetchall()

        out = {}
        for member, gid, at, rows, origin in self._run("last commits", fn):
            if not BatchId.is_gid(gid):
                continue
            member = BatchId.parse(gid).member
            out[member] = LastCommit(member, gid, at.isoformat(), int(rows), origin or {})
        return out

    def prune_markers(self, older_than_s: float) -> int:
        """Delete commit markers older than ``older_than_s`` seconds (after that, a commit of
        such an old write is reported lost instead of idempotent), and every origin mark below
        the highest of its key (only the highest is checked). Returns the markers deleted."""
        self.ensure_tables()
        target = f"{self.schema}.{self.table}"

        def fn(cur: Cursor) -> int:
            cur.execute(
                f"DELETE FROM {self._side(MARKERS_TABLE)} WHERE target = %s AND "
                "committed_at < now() - make_interval(secs => %s)",
                (target, older_than_s),
            )
            deleted = cur.rowcount
            cur.execute(f"DELETE FROM {self._side(MARKS_TABLE)} m WHERE m.target = %s AND m.seq < (SELECT max(seq) "
                        f"FROM {self._side(MARKS_TABLE)} h WHERE h.target = m.target AND h.origin_stream = "
                        "m.origin_stream)", (target,))
            return deleted

        return self._run("prune markers", fn)

    def committed_keys_exist(self, origin_stream: str, seqs: Iterable[int]) -> np.ndarray:
        values = np.asarray(list(seqs) if not isinstance(seqs, np.ndarray) else seqs, dtype=np.int64)
        self.ensure_tables()
        found: set[int] = set()

        target = f"{self.schema}.{self.table}"

        def fn(cur: Cursor) -> None:
            cur.execute("SELECT count(*) FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
                        "AND column_name IN ('origin_stream', 'origin_seq')", (self.schema, self.table))
            row_keys = cur.fetchone()[0] == 2
            for i in range(0, len(values), 100_000):
                chunk = [int(v) for v in values[i : i + 100_000]]
                if row_keys:
                    cur.execute(
                        f"SELECT origin_seq FROM {self._target} WHERE origin_stream = %s AND origin_seq = ANY(%s)",
                        (origin_stream, chunk),
                    )
                    found.update(r[0] for r in cur.fetchall())
                cur.execute(  # the input messages of transformed batches
                    f"SELECT origin_seq FROM {self._side(INPUTS_TABLE)} WHERE target = %s AND origin_stream = %s "
                    "AND origin_seq = ANY(%s)", (target, origin_stream, chunk))
                found.update(r[0] for r in cur.fetchall())

        self._run("look up keys", fn)
        if not found:
            return np.zeros(len(values), dtype=bool)
        return np.isin(values, np.fromiter(found, dtype=np.int64))
