"""Re-read a time window of a group's ORIGIN stream into a two-phase sink, idempotently.

``run_backfill`` lands exactly the origin messages whose stream timestamp lies in
``[start, end)`` and that the group covers, with the rows live consumption lands for them.
It reads through an ephemeral consumer on the origin stream (``deliver_policy:
by_start_time``, ``ack_policy: none``, filtered by the group's partitioning filters for an
elastic group, ``*.<filter>`` for a static one) and stops at the first message with a
timestamp ``>= end``, at the origin's last sequence when the run started, or when nothing
is left. Nothing is acknowledged and no member consumer is touched, so a backfill never
changes what live members consume.

Rows, compared with live consumption of the same message:

- ``origin_stream``, ``origin_seq`` (the dedupe key), ``subject``, ``partition``, ``key``,
  ``payload``, ``headers``: identical. An elastic work-queue subject is
  ``<partition>.<origin subject>``, so the origin subject *is* the live ``subject``; the
  partition is computed with :func:`partitioning.partition_of` from the matching
  partitioning filter exactly as the server's transform does. A static origin subject
  carries the partition as its first token.
- ``timestamp``: the ORIGIN stream's timestamp (what the window is defined on). Live rows of
  a static group carry the same value; live rows of an elastic group carry the work-queue
  stream's timestamp (when the message was sourced, normally milliseconds later). It is not
  part of the key: whichever row commits first stays.
- ``member``: the member owning the partition under the current assignment (``"backfill"``
  when no member owns it), so backfilled rows look like live ones. The sink batches are
  written under a separate member id, ``bf-<start ms>-<end ms>``, so a live member's
  recovery never finishes a backfill's prepared write, and concurrent backfills of other
  windows never finish each other's.
- ``delivery_count``: 1.

Per-key order beside live members. A backfill lands a message its group has yet to land (still
pending for a member) only where the member's partition does not lag behind the window: when
the partition's position (``GroupReset.positions``: its first pending message) is before the
window's first message, some earlier message of a key in that partition may still be pending,
and landing a later one first would put the key out of order; those messages are left to the
members (counted in ``left_to_members`` and ``skipped``), who land them in order. Everything the
group has passed (acknowledged) is landed: the sink drops what it holds, so only a hole (a
message skipped by a reset forward, or landed into another table) is filled.

Each batch goes through the same two-phase steps as a live batch (``two_phase.py``), without
an ack step: the acking marker is still written so recovery reads the same way (marked:
commit, unmarked: roll back), and either outcome is safe because the messages are read again. The
sink drops rows whose ``(origin_stream, origin_seq)`` it already has, so re-running a window
or overlapping live consumption adds nothing. Poison rows (a decoder error) are skipped and
counted: live consumption dead-letters them, a backfill cannot.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import secrets
import time
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.groups import partitioning
from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, GroupConfig, StaticGroupConfig
from airflow_provider_cg.core.groups.reset import GroupReset
from airflow_provider_cg.core.jetstream.api import DEFAULT_PREFIX, JsApi
from airflow_provider_cg.core.jetstream.client import PriorityClient
from airflow_provider_cg.core.jetstream.protocol import ConsumerGone, PullEnd
from airflow_provider_cg.core.landing.contract import RESULT_COMMITTED, RESULT_EMPTY, Summary, parse_time
from airflow_provider_cg.core.landing.modes import StopReason
from airflow_provider_cg.core.landing.pipeline.processing import ArrowPipeline, Pipeline, ProcessedBatch
from airflow_provider_cg.core.landing.protocol.origin_guard import OriginGuard
from airflow_provider_cg.core.landing.protocol.two_phase import TwoPhaseLander
from airflow_provider_cg.core.landing.rows import (
    BatchId,
    KeySelector,
    row_table,
    user_headers,
)
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import TwoPhaseSink
from airflow_provider_cg.core.landing.stream_life import OriginKeys

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

log = logging.getLogger("airflow_provider_cg.backfill")

BACKFILL_MEMBER = "backfill"
_GROUP = "PCG"  # the ephemeral consumer's priority group (overflow policy: plain pulls)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _ns(t: dt.datetime) -> int:
    return (t - _EPOCH) // dt.timedelta(microseconds=1) * 1000


def window_member(start: dt.datetime, end: dt.datetime) -> str:
    """The sink member id of one window's batches: ``bf-<start ms>-<end ms>``."""
    return f"bf-{_ns(start) // 1_000_000}-{_ns(end) // 1_000_000}"


class OriginRows:
    """Origin messages -> ``ROW_SCHEMA`` rows as live consumption lands them."""

    def __init__(self, config: GroupConfig, group: str) -> None:
        self.group = group
        self.elastic = isinstance(config, ElasticGroupConfig)
        self.partitions = config.max_members
        rules = partitioning.key_rules(config)
        self.keys = KeySelector(rules)
        self.owner = {p: m for m, ps in partitioning.assign_partitions(config).items() for p in ps}
        self.filters = [(f, f.split("."), wildcards) for f, wildcards in rules]
        self.consumer_filters = ([f"*.{f}" for f in config.filters] if isinstance(config, StaticGroupConfig)
                                 else [f for f, _ in rules])
        self._cache: dict[str, tuple[int, str] | None] = {}

    def locate(self, stored: str) -> tuple[int, str] | None:
        """(partition, user subject) of a stored origin subject, or None if the group skips it."""
        if stored in self._cache:
            return self._cache[stored]
        out: tuple[int, str] | None = None
        if not self.elastic:
            head, _, rest = stored.partition(".")
            if head.isascii() and head.isdigit() and rest and int(head) < self.partitions:
                out = int(head), rest
        elif not self.filters:
            out = partitioning.partition_of(stored, self.partitions), stored
        else:
            tokens = stored.split(".")
            for f, ftokens, wildcards in self.filters:
                if partitioning.subject_matches(tokens, ftokens):
                    out = partitioning.partition_of(stored, self.partitions, wildcards, f), stored
                    break
        if len(self._cache) < 100_000:
            self._cache[stored] = out
        return out

    def build(self, msgs: list) -> tuple[pa.Table, list, int]:
        """The rows, the messages they came from, and how many messages were skipped."""
        kept, parts, subjects = [], [], []
        for m in msgs:
            loc = self.locate(m.subject)
            if loc is None:
                continue
            kept.append(m)
            parts.append(loc[0])
            subjects.append(loc[1])
        table = row_table(
            len(kept), origin_stream=[m.stream for m in kept], origin_seq=[m.stream_seq for m in kept],
            subject=subjects, partition=parts, key=[self.keys.key(s) for s in subjects],
            payload=[m.data for m in kept], headers=[user_headers(m._hdr) if m._hdr else None for m in kept],
            timestamp=[m.timestamp_ns for m in kept], delivery_count=[1] * len(kept), group=self.group,
            member=[self.owner.get(p, BACKFILL_MEMBER) for p in parts])
        return table, kept, len(msgs) - len(kept)


def _leave_pending(table: pa.Table, kept: list, lagging: dict[int, int]) -> tuple[pa.Table, list, int]:
    """Without the messages still pending in a partition whose position lags behind the window."""
    parts = table.column("partition").to_numpy()
    seqs = table.column("origin_seq").to_numpy()
    pos = np.array([lagging.get(int(p), np.iinfo(np.int64).max) for p in parts], dtype=np.int64)
    keep = seqs < pos
    if keep.all():
        return table, kept, 0
    return table.filter(pa.array(keep)), [m for m, k in zip(kept, keep, strict=True) if k], int((~keep).sum())


#: seconds an idle window reader is kept by the server (a batch that takes longer finds it gone
#: and makes it again where it was: ``WindowReader``)
READER_IDLE_S = 600


async def _window_reader(nc: NATS, api: JsApi, stream: str, rows: OriginRows, start: dt.datetime | int,
                         js_prefix: str) -> tuple[str, PriorityClient]:
    """An ephemeral consumer on the origin stream from ``start`` (a time, or an origin sequence)
    over the group's subjects (no acks, in memory, gone after ``READER_IDLE_S`` idle), and a
    client pulling from it."""
    name = f"cg-backfill-{secrets.token_hex(6)}"
    config: dict[str, object] = {
        "name": name,
        "ack_policy": "none",
        "inactive_threshold": READER_IDLE_S * 10**9,
        "mem_storage": True,
        "num_replicas": 1,
        "priority_groups": [_GROUP],
        "priority_policy": "overflow",
    }
    if isinstance(start, int):
        config.update(deliver_policy="by_start_sequence", opt_start_seq=start)
    else:
        config.update(deliver_policy="by_start_time", opt_start_time=start.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
    filters = rows.consumer_filters
    if len(filters) == 1:
        config["filter_subject"] = filters[0]
    elif filters:
        config["filter_subjects"] = filters
    await api.create_consumer(stream, config)
    return name, PriorityClient(nc, stream, name, _GROUP, js_prefix=js_prefix)


class WindowReader:
    """The window's messages in origin order, through an ephemeral consumer that is made again
    at the next sequence when it is gone: a batch slower than its inactivity threshold, a server
    restart that lost it (it is in memory). A backfill never dies of a slow batch."""

    def __init__(self, nc: NATS, api: JsApi, stream: str, rows: OriginRows, start: dt.datetime,
                 js_prefix: str) -> None:
        self.nc, self.api, self.stream, self.rows, self.start, self.js_prefix = nc, api, stream, rows, start, js_prefix
        self.name: str | None = None
        self.client: PriorityClient | None = None
        self.next_seq: int | None = None  # after the last message read (None: from ``start``)
        self.remade = 0

    async def pull(self, batch_size: int, expires: float, max_bytes: int | None = None) -> list:
        """The window's next messages: up to ``batch_size``, within ``max_bytes`` (the server's
        pull budget; a single message over it is read alone)."""
        for attempt in range(3):
            if self.client is None:
                start = self.start if self.next_seq is None else self.next_seq
                self.name, self.client = await _window_reader(self.nc, self.api, self.stream, self.rows, start,
                                                              self.js_prefix)
            try:
                msgs = await self.client.pull(batch_size, expires=expires, no_wait=True, max_bytes=max_bytes)
                if not msgs and max_bytes and self.client.last_end is PullEnd.MAX_BYTES:
                    msgs = await self.client.pull(1, expires=expires, no_wait=True)
            except ConsumerGone as e:
                if attempt == 2:
                    raise
                log.info("cg backfill reader %s is gone (%s); making it again at origin sequence %s", self.name,
                         e.description, self.next_seq or self.start)
                await self._drop()
                self.remade += 1
                continue
            if msgs:
                self.next_seq = msgs[-1].stream_seq + 1
            return msgs
        return []

    async def _drop(self) -> None:
        client, name, self.client, self.name = self.client, self.name, None, None
        if client is not None:
            await client.close()
        if name is not None:
            try:
                await self.api.delete_consumer(self.stream, name)
            except Exception as e:  # the inactive threshold removes it anyway
                log.warning("could not delete backfill consumer %s: %s", name, e)

    async def close(self) -> None:
        await self._drop()


async def window_has_messages(nc: NATS, stream: str, group: str, start: dt.datetime | str, end: dt.datetime | str,
                              *, js_prefix: str = DEFAULT_PREFIX) -> bool:
    """Whether the origin stream holds a message of ``[start, end)`` on the group's subjects:
    the first one at or after ``start`` is read and its timestamp compared with ``end``, so an
    empty window is known without starting Spark (one consumer create and one pull)."""
    start, end = parse_time("backfill_start", start), parse_time("backfill_end", end)
    if end <= start:
        raise ConfigError("backfill_end", "must be after backfill_start")
    api = JsApi(nc, prefix=js_prefix)
    info = await ConsumerGroups(nc, js_prefix=js_prefix).get(stream, group)
    if not int((await api.stream_info(stream)).get("state", {}).get("messages", 0)):
        return False
    name, client = await _window_reader(nc, api, stream, OriginRows(info.config, group), start, js_prefix)
    try:
        msgs = await client.pull(1, expires=2.0, no_wait=True)
    finally:
        await client.close()
        with contextlib.suppress(Exception):  # the inactive threshold removes it anyway
            await api.delete_consumer(stream, name)
    return bool(msgs) and _ns(start) <= msgs[0].timestamp_ns < _ns(end)


class _Window:
    """One backfill run's batches: each cut at the window's ends, without what live members
    still hold pending, processed and landed as one batch of the window's own member."""

    def __init__(self, sink: TwoPhaseSink, pipeline: Pipeline, lander: TwoPhaseLander, rows: OriginRows, summary: Summary,
                 member: str, start_ns: int, end_ns: int, last_seq: int, positions: dict[int, int],
                 origin: OriginKeys) -> None:
        self.sink, self.pipeline, self.lander, self.rows, self.s = sink, pipeline, lander, rows, summary
        self.origin = origin
        self.member, self.start_ns, self.end_ns, self.last_seq = member, start_ns, end_ns, last_seq
        self.positions = positions
        self.lagging: dict[int, int] | None = None  # partition -> position, of those behind the window
        self.batch_seq = int(time.time() * 1000)

    def cut(self, msgs: list) -> list:
        """The pulled messages inside the window; the summary's stop reason set at its end."""
        s, cut = self.s, len(msgs)
        for i, m in enumerate(msgs):
            if m.timestamp_ns >= self.end_ns:
                cut, s.stop_reason = i, StopReason.WINDOW_END
                break
            if m.stream_seq > self.last_seq:
                cut, s.stop_reason = i, StopReason.LAST_SEQUENCE_AT_START
                break
        if not s.stop_reason and msgs[-1].num_pending == 0:
            s.stop_reason = StopReason.NO_MORE_MESSAGES
        return [m for m in msgs[:cut] if m.timestamp_ns >= self.start_ns]

    def _next_id(self) -> BatchId:
        self.batch_seq += 1
        return BatchId(self.s.stream, self.s.group, self.member, self.batch_seq)

    async def land(self, msgs: list) -> None:
        if not msgs:
            return
        s, stream = self.s, self.s.stream
        s.messages_read += len(msgs)  # counted as read here: the lander counts no messages of a backfill
        s.bytes += sum(len(m.data) for m in msgs)
        if self.lagging is None:
            self.lagging = {p: pos for p, pos in self.positions.items() if pos < msgs[0].stream_seq}
        table, kept, skipped = self.rows.build(msgs)
        table = self.origin.apply(table)
        s.skipped += skipped
        if self.lagging and kept:
            table, kept, left = _leave_pending(table, kept, self.lagging)
            s.left_to_members += left
            s.skipped += left
        if not kept:
            return
        batch_id = self._next_id()
        processed = await asyncio.to_thread(self.pipeline.process, self.sink, table, batch_id)
        if processed.bad:
            s.poison_deliveries += len(processed.bad)
            s.skipped += len(processed.bad)
            kept = [m for i, m in enumerate(kept) if i not in processed.bad]
            table = table.filter(pa.array([i not in processed.bad for i in range(table.num_rows)]))
            if not kept:
                await self.lander.discard(processed)
                return
        refs = {stream: np.fromiter((m.stream_seq for m in kept), np.int64, len(kept))}

        def recompute(table: pa.Table = table) -> tuple[BatchId, ProcessedBatch]:
            new_id = self._next_id()
            return new_id, self.pipeline.process(self.sink, table, new_id)

        await self.lander.land(batch_id, processed, table, refs, None, 0, 0, recompute=recompute)
        log.info("cg backfill %s.%s [%s, %s): batch of %d, committed %d so far",
                 stream, s.group, s.window_start, s.window_end, len(kept), s.rows_written)


async def run_backfill(
    nc: NATS,
    sink: TwoPhaseSink,
    stream: str,
    group: str,
    start: dt.datetime | str,
    end: dt.datetime | str,
    *,
    batch_size: int = 100_000,
    batch_bytes: int | None = None,
    pipeline: Pipeline | None = None,
    pull_timeout: float = 5.0,
    js_prefix: str = DEFAULT_PREFIX,
    stream_life: str | None = None,
) -> Summary:
    """Land the origin messages of ``[start, end)`` that ``group`` covers into ``sink``
    (through ``pipeline``, ``core/landing/pipeline/processing.py``: with a Spark pipeline exactly-once is
    kept per input, so messages live consumption or an earlier backfill already landed are not
    transformed again). Poison messages are skipped (live consumption dead-letters them).
    ``stream_life``: as the member job's option (``stream_life.py``)."""
    pipeline = pipeline or ArrowPipeline()
    start, end = parse_time("backfill_start", start), parse_time("backfill_end", end)
    if end <= start:
        raise ConfigError("backfill_end", "must be after backfill_start")
    if batch_size < 1:
        raise ConfigError("batch_size", "must be >= 1")
    if batch_bytes is not None and batch_bytes < 1:
        raise ConfigError("batch_bytes", "must be >= 1")
    started = time.monotonic()
    member = window_member(start, end)
    s = Summary(stream, group, BACKFILL_MEMBER, window_start=start.isoformat(), window_end=end.isoformat())
    lander = TwoPhaseLander(sink, s, stream, group, member)
    api = JsApi(nc, prefix=js_prefix)
    info = await ConsumerGroups(nc, js_prefix=js_prefix).get(stream, group)
    rows = OriginRows(info.config, group)
    guard = await OriginGuard.open(api, sink, stream, stream_life, reads_origin=True)
    s.origin_key, lander.origin = guard.keys.current, guard
    await lander.recover()  # what an earlier run of this window left prepared
    last_seq = int((await api.stream_info(stream)).get("state", {}).get("last_seq", 0))
    start_ns, end_ns = _ns(start), _ns(end)
    if last_seq == 0:
        await lander.finish()
        s.stop_reason = StopReason.ORIGIN_EMPTY
        s.duration_s = round(time.monotonic() - started, 3)
        return s
    window = _Window(sink, pipeline, lander, rows, s, member, start_ns, end_ns, last_seq,
                     await GroupReset(nc, js_prefix=js_prefix).positions(stream, group), guard.keys)
    reader = WindowReader(nc, api, stream, rows, start, js_prefix)
    try:
        while not s.stop_reason:
            msgs = await reader.pull(batch_size, pull_timeout, batch_bytes)
            if not msgs:
                s.stop_reason = StopReason.NO_MORE_MESSAGES
                break
            await window.land(window.cut(msgs))
    finally:
        await reader.close()
    await lander.finish()  # what it committed is readable when the run ends
    s.duration_s = round(time.monotonic() - started, 3)
    s.target = s.messages_read
    s.result = RESULT_COMMITTED if s.messages_read else RESULT_EMPTY
    return s
