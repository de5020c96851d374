"""The statements that put one batch into the PostgreSQL target, inside the transaction that
``PostgresSink.prepare`` then prepares: the rows COPYed into an unlogged staging table, then
inserted (rows as read: ``ON CONFLICT`` on the message's origin skips redeliveries), appended
with their inputs claimed (a transformation's output: exactly once per input message), or
merged (upserts: the latest record per key, over older rows only)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cg.core.landing.sinks.postgres.columns import CsvStream, ident, staging_columns
from airflow_provider_cg.core.landing.sinks.postgres.pg_connection import Cursor
from airflow_provider_cg.core.landing.sinks.shared.identifiers import INPUTS_TABLE
from airflow_provider_cg.core.landing.sinks.shared.merging import DELETE_FLAG, MergeSpec
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import InputsTaken

#: ``(origin stream, its sequences)`` of a batch's inputs
Inputs = list[tuple[str, list[int]]]


@dataclass(frozen=True)
class TargetWrites:
    """One target's writes: ``schema.table``, its merge rule (``None``: no upserts) and the
    rows per COPY chunk."""

    schema: str
    table: str
    merge: MergeSpec | None
    copy_chunk_rows: int

    @property
    def name(self) -> str:
        """The target as the side tables record it."""
        return f"{self.schema}.{self.table}"

    @property
    def target(self) -> str:
        return f"{ident(self.schema)}.{ident(self.table)}"

    def side(self, name: str) -> str:
        return f"{ident(self.schema)}.{ident(name)}"

    def write(self, cur: Cursor, gid: str, table: pa.Table, inputs: Inputs,
              transformed: bool) -> tuple[int, int]:
        """The batch's rows into the target, in the caller's open transaction; returns (rows
        written, duplicates skipped). ``inputs``: (stream, seqs) of the batch's messages."""
        stg_cols, select, encoders = staging_columns(table.schema)
        staging = self.side(f"_cg_stg_{secrets.token_hex(8)}")
        if self.merge is not None:
            written, dups = self._upsert(cur, gid, table, inputs, transformed, staging, stg_cols, select, encoders)
        else:
            columns = ", ".join(ident(n) for n in table.schema.names)
            cur.execute(f"CREATE UNLOGGED TABLE {staging} ({', '.join(stg_cols)})")
            if table.num_rows:
                cur.copy_expert(f"COPY {staging} ({columns}) FROM STDIN WITH (FORMAT csv)",
                                CsvStream(table, encoders, self.copy_chunk_rows), size=1 << 20)
            if transformed:
                # a transformation's rows, as they are; exactly-once is per input message
                cur.execute(f"INSERT INTO {self.target} ({columns}) SELECT {', '.join(select)} FROM {staging}")
                written = cur.rowcount
                taken = self.claim_inputs(cur, gid, inputs)
                if taken:
                    raise inputs_taken(gid, taken)
            else:
                cur.execute(f"INSERT INTO {self.target} ({columns}) SELECT {', '.join(select)} FROM {staging} "
                            'ON CONFLICT ("origin_stream", "origin_seq") DO NOTHING')
                written = cur.rowcount
            dups = table.num_rows - written
        cur.execute(f"DROP TABLE {staging}")
        return written, dups

    def claim_inputs(self, cur: Cursor, gid: str, inputs: Inputs) -> dict[str, np.ndarray]:
        """Record the batch's inputs as this write's in ``cg_committed_inputs``; returns those
        another write committed already. The inputs' keys are unique per target: a write of the
        same inputs prepared by another writer holds them until it commits or rolls back, so
        writers of the same inputs are serialized here."""
        taken: dict[str, np.ndarray] = {}
        for stream, seqs in inputs:
            cur.execute(
                f"INSERT INTO {self.side(INPUTS_TABLE)} (target, origin_stream, origin_seq, gid) "
                "SELECT %s, %s, unnest(%s::bigint[]), %s ON CONFLICT DO NOTHING RETURNING origin_seq",
                (self.name, stream, seqs, gid),
            )
            if cur.rowcount != len(seqs):
                mine = np.fromiter((r[0] for r in cur.fetchall()), np.int64)
                taken[stream] = np.setdiff1d(np.asarray(seqs, np.int64), mine)
        return taken

    def _upsert(self, cur: Cursor, gid: str, table: pa.Table, inputs: Inputs, transformed: bool,
                staging: str, stg_cols: list,
                select: list, encoders: dict) -> tuple[int, int]:
        """An upsert batch: its inputs claimed (rows of inputs committed already are dropped; a
        transformation's batch with such inputs is refused, as always), then the latest record
        per key deleted or upserted over older rows only, from the staging table. Returns
        (rows written, duplicates)."""
        assert self.merge is not None
        taken = self.claim_inputs(cur, gid, inputs)
        if taken and transformed:
            raise inputs_taken(gid, taken)
        rows_in = table.num_rows
        for stream, seqs in taken.items():  # redeliveries: their rows are in already
            drop = pc.and_(pc.equal(table.column("origin_stream"), stream),
                           pc.is_in(table.column("origin_seq"), pa.array(seqs, pa.int64())))
            table = table.filter(pc.invert(drop))
        latest = self.merge.latest(table)
        cur.execute(f"CREATE UNLOGGED TABLE {staging} ({', '.join([*stg_cols, f'{ident(DELETE_FLAG)} boolean'])})")
        if latest.num_rows:
            names = ", ".join(ident(n) for n in latest.schema.names)
            cur.copy_expert(f"COPY {staging} ({names}) FROM STDIN WITH (FORMAT csv)",
                            CsvStream(latest, encoders, self.copy_chunk_rows), size=1 << 20)
        on = " AND ".join(f"t.{ident(k)} = s.{ident(k)}" for k in self.merge.keys)
        older = 't."origin_stream" <> s."origin_stream" OR t."origin_seq" < s."origin_seq"'
        cur.execute(f"DELETE FROM {self.target} t USING {staging} s WHERE s.{ident(DELETE_FLAG)} AND {on} "
                    f"AND ({older})")
        written = cur.rowcount
        keys = ", ".join(ident(k) for k in self.merge.keys)
        updates = ", ".join(f"{ident(c)} = EXCLUDED.{ident(c)}" for c in table.schema.names
                            if c not in self.merge.keys)
        newer = (f'{self.target}."origin_stream" <> EXCLUDED."origin_stream" '
                 f'OR {self.target}."origin_seq" < EXCLUDED."origin_seq"')
        columns = ", ".join(ident(c) for c in table.schema.names)
        cur.execute(f"INSERT INTO {self.target} ({columns}) SELECT {', '.join(select)} FROM {staging} "
                    f"WHERE NOT {ident(DELETE_FLAG)} ON CONFLICT ({keys}) DO UPDATE SET {updates} WHERE {newer}")
        written += cur.rowcount
        return written, rows_in - table.num_rows


def inputs_taken(gid: str, taken: dict[str, np.ndarray]) -> InputsTaken:
    """A transformation's batch whose inputs another write committed: nothing is prepared,
    its writer computes the batch again without them."""
    n = sum(len(t) for t in taken.values())
    return InputsTaken(f"prepare of {gid}: {n} of its inputs were committed by another writer "
                       "since it was computed", taken)
