"""One group into several tables, exactly once: routes (``routes``, ``route_by``).

A route is a table with its own sink options (``SinkOptions``: its format, location,
partitioning, merge keys, file size), chosen per row by a column of the rows
(``route_by``: the route's name is the column's value) or per message by its subject
(each route's ``subjects``, NATS wildcards; a message whose subject matches several routes lands
in each). No table format commits two tables atomically, and none needs to here, as in Iceberg's
Kafka Connect sink: **each table is an exactly-once writer of its own**, recording the inputs it
landed with its own commit, and the batch is acknowledged only once every table has marked its
write (``RoutedSink.mark_acking``). So:

- every table's write of a batch is prepared, then marked acking, table by table, then the
  messages are acknowledged, then each table commits; a table that refuses (another writer
  committed some inputs there meanwhile, a fence) rolls the whole batch back before any ack, and
  it is computed again: each table leaves out only what it holds (``TableInputs``);
- a crash between two tables' steps leaves each table's write to that table's own recovery:
  marked acking, it is committed; not marked, rolled back, and since no ack was sent the
  messages come again, the tables that hold them drop them, the others land them. A recovery
  lands the missing part only, in every table, with per-key order in each (a partition is read
  again from its first unacknowledged message, before anything newer);
- a record no route takes (``route_by`` names no route, or its subject matches none) is refused
  like a record without its merge key: dead-lettered with the reason, or the run fails
  (``bad_records=fail``).

Each table records the batch's inputs it landed: with a transformation, every input of the batch
it did not hold (an input that gave it no row stands for no row there); rows landed as read, the
inputs of its rows. The summary and the asset events say per table what it landed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.rows import BatchId
from airflow_provider_cg.core.landing.sinks.options import Routes
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import (
    CommitResult,
    Fence,
    LastCommit,
    MessageRefs,
    PreparedWrite,
    TwoPhaseSink,
    WriteState,
    keys_by_stream,
)
from airflow_provider_cg.core.landing.stream_life import Life, LifeChoice, OriginKeys, OriginMark

if TYPE_CHECKING:
    from pyspark.sql import Column


@dataclass
class RoutePart:
    """A batch's share for one route: what ``prepare`` takes (rows as read, or what its Spark
    job staged), the inputs it records (``input_keys``, as ``ProcessedBatch``'s), and the inputs
    whose effect it lands (for the summary and the asset event)."""

    rows: Any
    input_keys: dict[str, np.ndarray] | None
    landed: dict[str, np.ndarray]


@dataclass
class RoutedRows:
    """A batch split over the routes: ``ProcessedBatch.rows`` of a routed landing."""

    parts: dict[str, RoutePart]

    @property
    def num_rows(self) -> int:
        return sum(getattr(p.rows, "num_rows", 0) for p in self.parts.values())


@dataclass(frozen=True, eq=False)
class RoutedWrite(PreparedWrite):
    """A routed batch's write: one write per table (``parts``, by route)."""

    parts: Mapping[str, PreparedWrite] = dataclasses.field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class RoutedCommit(CommitResult):
    """``CommitResult`` summed over the tables, and per route."""

    routes: Mapping[str, CommitResult] = dataclasses.field(default_factory=dict)


class RoutedSink(TwoPhaseSink):
    """The tables of a routed landing as one two-phase sink (see the module docstring). Every
    write it hands out is a ``RoutedWrite``; recovery's writes have one part each, the table's
    own, and are finished table by table."""

    def __init__(self, routes: Routes, sinks: Mapping[str, TwoPhaseSink]) -> None:
        self.routes, self.sinks = routes, dict(sinks)

    def __repr__(self) -> str:
        return f"RoutedSink({', '.join(f'{n}={s!r}' for n, s in self.sinks.items())})"

    # --- what the tables refuse ----------------------------------------------------------

    def refusals(self, table: pa.Table) -> dict[int, str]:
        """Rows no route takes, and rows a route takes but whose table refuses them."""
        if self.routes.route_by is not None and table.schema.get_field_index(self.routes.route_by) < 0:
            raise ConfigError("route_by", f"column {self.routes.route_by!r} is not in the batch "
                                          f"({', '.join(table.column_names)})")
        masks = self.routes.split(table)
        taken = np.zeros(table.num_rows, dtype=bool)
        out: dict[int, str] = {}
        for name, mask in masks.items():
            taken |= mask
            rows = np.flatnonzero(mask)
            if len(rows):
                for i, why in self.sinks[name].refusals(table.take(pa.array(rows))).items():
                    out.setdefault(int(rows[i]), why)
        values = table.column(self.routes.route_by) if self.routes.route_by else None
        for unrouted in np.flatnonzero(~taken):
            at = int(unrouted)
            out.setdefault(at, self.routes.unrouted_reason(values[at].as_py() if values is not None else None))
        return out

    def refusal_column(self, columns: list[str]) -> Column | None:
        """Routed by subject, a message no route takes is refused before the transformation
        (``input_refusal_column``); routed by a column, a row whose value names no route here.
        Each route's own refusals apply to its rows (``split_frames``)."""
        return self.routes.unrouted_column(columns) if self.routes.route_by is not None else None

    def input_refusal_column(self, columns: list[str]) -> Column | None:
        return self.routes.unrouted_column(columns) if self.routes.route_by is None else None

    # --- the batch, split ------------------------------------------------------------------

    def split_rows(self, table: pa.Table) -> RoutedRows:
        """Rows as read (minus poison and refused rows) over the routes: each table records
        the inputs of its rows."""
        parts = {}
        for name, mask in self.routes.split(table).items():
            rows = table.filter(pa.array(mask))
            parts[name] = RoutePart(rows, None, {s: np.sort(q) for s, q in keys_by_stream(rows).items()})
        return RoutedRows(parts)

    def route_location(self, route: str) -> str | None:
        return self.sinks[route].table_location

    def part_batch(self, batch_id: BatchId, name: str) -> BatchId:
        """The batch id of one table's write: the batch's, with a uid of its own (a PostgreSQL
        global transaction id is unique per server, and two routes may share one)."""
        return BatchId(batch_id.stream, batch_id.group, batch_id.member, batch_id.batch_seq,
                       uid=_route_uid(batch_id.uid, name))

    def discard(self, staged: object) -> None:
        if isinstance(staged, RoutedRows):
            for name, part in staged.parts.items():
                self.sinks[name].discard(part.rows)

    # --- the protocol, table by table ------------------------------------------------------

    def fence(self, stream: str, group: str, fence: Fence) -> None:
        for sink in self.sinks.values():
            sink.fence(stream, group, fence)

    def stream_life(self, stream: str, created: str, choice: LifeChoice | None = None,
                    like: Sequence[Life] = ()) -> OriginKeys:
        """The keys every table lands the origin under: the tables that hold lives of the
        stream decide them (they must agree), a table that holds none takes their lives."""
        holding = {n: s for n, s in self.sinks.items() if s.stream_lives(stream)}
        keys = {n: s.stream_life(stream, created, choice, like) for n, s in holding.items()}
        lives = next(iter(holding.values())).stream_lives(stream) if holding else list(like)
        for n, s in self.sinks.items():
            if n not in holding:
                keys[n] = s.stream_life(stream, created, choice, lives)
        return _one_key(stream, keys)

    def stream_lives(self, stream: str) -> list[Life]:
        lives: dict[tuple[str, str], Life] = {}
        for sink in self.sinks.values():
            for life in sink.stream_lives(stream):
                lives.setdefault((life.created, life.key), life)
        return list(lives.values())

    def origin_mark(self, key: str) -> OriginMark | None:
        """The highest of the tables' (each records every batch's mark with its own write)."""
        marks = [m for m in (s.origin_mark(key) for s in self.sinks.values()) if m is not None]
        return max(marks, key=lambda m: m.seq) if marks else None

    def prepare(self, batch_id: BatchId, table: Any, *, message_refs: MessageRefs, fence: Fence | None = None,
                input_keys: dict[str, np.ndarray] | None = None, origin_mark: OriginMark | None = None) -> RoutedWrite:
        if not isinstance(table, RoutedRows):
            raise TypeError("a routed landing prepares a batch split over its routes (RoutedRows)")
        parts: dict[str, PreparedWrite] = {}
        try:
            for name, part in table.parts.items():
                extra = {} if part.input_keys is None else {"input_keys": part.input_keys}
                parts[name] = self.sinks[name].prepare(self.part_batch(batch_id, name), part.rows,
                                                       message_refs=message_refs, fence=fence,
                                                       origin_mark=origin_mark, **extra)
        except BaseException:
            for name, w in parts.items():  # never acked: roll the tables prepared so far back
                self.sinks[name].abort(w)
            for name, part in table.parts.items():
                if name not in parts:
                    self.sinks[name].discard(part.rows)
            raise
        first = next(iter(parts.values()))
        return RoutedWrite(batch_id, sum(w.rows for w in parts.values()), first.refs, first.token,
                           fence=fence, parts=parts)

    def mark_acking(self, prepared: PreparedWrite) -> RoutedWrite:
        """Table by table; a refusal (``InputsTaken``, ``FencedOut``, ``PreparedWriteLost``)
        leaves the tables marked so far marked: the caller rolls the whole write back (no ack
        was sent), or recovery commits what is marked and rolls back the rest."""
        w = _routed(prepared)
        parts = dict(w.parts)
        for name, part in w.parts.items():
            parts[name] = self.sinks[name].mark_acking(part)
        return dataclasses.replace(w, acking=True, parts=parts)

    def commit(self, prepared: PreparedWrite) -> RoutedCommit:
        w = _routed(prepared)
        results = {name: self.sinks[name].commit(part) for name, part in w.parts.items()}
        return RoutedCommit(sum(r.rows_written for r in results.values()),
                            sum(r.duplicates_skipped for r in results.values()), results)

    def abort(self, prepared: PreparedWrite) -> WriteState:
        w = _routed(prepared)
        states = [self.sinks[name].abort(part) for name, part in w.parts.items()]
        return WriteState.COMMITTED if WriteState.COMMITTED in states else WriteState.ABORTED

    def abort_unless_acking(self, prepared: PreparedWrite) -> WriteState:
        """Recovery's writes have one part (one table); decided there."""
        w = _routed(prepared)
        states = [self.sinks[name].abort_unless_acking(part) for name, part in w.parts.items()]
        for s in (WriteState.PREPARED, WriteState.COMMITTED):
            if s in states:
                return s
        return WriteState.ABORTED

    def state(self, prepared: PreparedWrite) -> WriteState:
        w = _routed(prepared)
        states = [self.sinks[name].state(part) for name, part in w.parts.items()]
        for s in (WriteState.PREPARED, WriteState.COMMITTED):
            if s in states:
                return s
        return WriteState.ABORTED

    def recover(self, stream: str, group: str, member: str, partitions: Iterable[int] = (),
                partition_count: int | None = None) -> list[PreparedWrite]:
        """Each table's own, finished table by table (a write's parts are never recovered
        together: each table's decision is its own)."""
        out: list[PreparedWrite] = []
        for name, sink in self.sinks.items():
            for w in sink.recover(stream, group, member, partitions, partition_count):
                out.append(RoutedWrite(w.batch_id, w.rows, w.refs, w.token, w.acking, w.fence, parts={name: w}))
        return out

    def last_commits(self, stream: str, group: str) -> dict[str, LastCommit]:
        """Per member, its latest commit in any table."""
        out: dict[str, LastCommit] = {}
        for sink in self.sinks.values():
            for member, c in sink.last_commits(stream, group).items():
                if member not in out or c.committed_at > out[member].committed_at:
                    out[member] = c
        return out

    def committed_keys_exist(self, origin_stream: str, seqs: Iterable[int]) -> np.ndarray:
        """Committed in every table (an input no table needs any more)."""
        values = np.asarray(list(seqs) if not isinstance(seqs, np.ndarray) else seqs, dtype=np.int64)
        out = np.ones(len(values), dtype=bool)
        for sink in self.sinks.values():
            out &= sink.committed_keys_exist(origin_stream, values)
        return out

    def check(self) -> None:
        for sink in self.sinks.values():
            check = getattr(sink, "check", None)
            if check is not None:
                check()

    def set_table_commit_interval(self, seconds: float) -> None:
        for sink in self.sinks.values():
            sink.set_table_commit_interval(seconds)

    def flush(self) -> None:
        for sink in self.sinks.values():
            sink.flush()

    def publish_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for sink in self.sinks.values():
            for k, v in sink.publish_counts().items():
                out[k] = out.get(k, 0) + v
        return out

    def close(self) -> None:
        for sink in self.sinks.values():
            sink.close()


def _routed(prepared: PreparedWrite) -> RoutedWrite:
    if not isinstance(prepared, RoutedWrite):
        raise TypeError(f"a routed landing's write, not {type(prepared).__name__}")
    return prepared


def _route_uid(uid: str, name: str) -> str:
    """8 hex digits of a route's own, from the batch's uid and the route's name."""
    import hashlib

    return hashlib.sha256(f"{uid}/{name}".encode()).hexdigest()[:8]


def _one_key(stream: str, keys: Mapping[str, OriginKeys]) -> OriginKeys:
    if len({k.segments for k in keys.values()}) > 1:
        shown = ", ".join(f"{n}: {', '.join(k.keys)}" for n, k in keys.items())
        raise ConfigError("routes", f"the tables land origin stream {stream!r} under different keys ({shown}): "
                                    "a table landed an earlier life another did not; land them into tables that "
                                    "agree, or give the newer one a route of its own later")
    return next(iter(keys.values()))
