"""Reading an elastic group's work-queue stream partition by partition, and acking by range.

Why not through the member consumer: a pull consumer with several filter subjects (a member
holding several partitions) is served 20-70x slower by nats-server than one with a single
filter, and a double ack per message costs a round trip each. The pinned member job therefore
keeps the consumer only as its exclusivity token (it holds the pin with pulls that take no
message) and reads each of its partitions ``<p>.>`` in stream order with batched direct gets
(``$JS.API.DIRECT.GET.<wq>``, ``next_by_subj``; work-queue streams of groups have
``allow_direct``). A partition is read contiguously from its first message, so a landed batch
is acknowledged with one filtered purge per partition (``$JS.API.STREAM.PURGE.<wq>`` with
``filter`` and ``seq``: every message of the partition below ``seq`` goes, which on a
work-queue stream is exactly an ack of that range, and the member consumer's counts follow).
Reading from the partition's first message also gives a new pin holder an earlier holder's
unacknowledged messages before any newer one: per-key order needs no wait for ack timeouts.

A member that holds every partition of its group owns the whole work-queue stream: it reads it
unfiltered (``ALL``) and purges by sequence alone. That matters: the server's cost of a filtered
next-by-subject read grows with the number of subjects (keys) matching the filter in each block
(measured here: about 20 µs a message for ``0.>`` over 2,000 keys, against 5 µs unfiltered).

Static groups read their origin stream the same way, but nothing is ever purged from an
origin stream: the member's filter subjects are read from one position up to a common cut
(``read_through``), and the landed batch is acknowledged by moving the member's durable past
the cut (``$JS.API.CONSUMER.RESET``, see ``landing/reads/direct.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_provider_cg.core.errors import ConsumerGroupError, JetStreamApiError
from airflow_provider_cg.core.jetstream.api import DEFAULT_PREFIX, ERR_STREAM_NOT_FOUND, JsApi
from airflow_provider_cg.core.jetstream.fastpath import RawSubscription, subscribe_raw

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from nats.aio.client import Client as NATS

log = logging.getLogger(__name__)

_STATUS_AT = 8  # b"NATS/1.0 204 EOB": a status block has a space where a header block has CRLF
REQUEST_BYTES = 4 << 20  # per direct-get request: bounds what the server queues for us at once
ALL = -1  # "partition" of a reader that owns every partition: the whole stream, unfiltered
READ_TIMEOUT = 10.0


class DirectReadError(ConsumerGroupError):
    """A direct get failed or timed out (``retryable``: a restart or leader change)."""

    def __init__(self, message: str, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass
class PartitionBatch:
    """Messages of one partition (or of ``ALL``) in stream order, as the server sent them."""

    partition: int
    hdrs: list[bytes] = field(default_factory=list)
    data: list[bytes] = field(default_factory=list)
    last_seq: int = 0  # stream sequence of the last message (0: none)
    pending: int = 0  # messages of the partition after ``last_seq`` when the read ended
    subject: str | None = None  # the filter read (default: the partition's, ``subject_filter``)

    def __len__(self) -> int:
        return len(self.hdrs)


@dataclass(frozen=True)
class ReadRange:
    """The messages of one filter ``subject`` with sequences in ``[first_seq, last_seq]`` (of
    ``stream``, when given): a
    part of a planned batch that Spark tasks read (``landing/reads/executors.py``).
    ``partition``: the member partition it belongs to (``ALL``, or an index for a static
    member's subjects); ``messages``: how many it held when planned (an upper bound)."""

    partition: int
    subject: str
    first_seq: int
    last_seq: int
    messages: int
    stream: str | None = None  # the stream it is in, when not the reader's (a partition stream)

    def __len__(self) -> int:
        return self.messages

    def split(self, parts: int) -> list[ReadRange]:
        """Up to ``parts`` consecutive sequence ranges covering this one, messages shared by span."""
        span = self.last_seq - self.first_seq + 1
        parts = max(1, min(parts, span, self.messages or 1))
        bounds = [self.first_seq + span * i // parts for i in range(parts + 1)]
        return [ReadRange(self.partition, self.subject, a, b - 1, -(-self.messages * (b - a) // span), self.stream)
                for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


class _Request:
    __slots__ = ("batch", "fut", "status")

    def __init__(self, batch: PartitionBatch, fut: asyncio.Future) -> None:
        self.batch, self.fut = batch, fut
        self.status: str | None = None


def subject_filter(partition: int) -> str:
    return ">" if partition == ALL else f"{partition}.>"


def _header_int(hdr: bytes, name: bytes) -> int:
    i = hdr.find(name)
    if i < 0:
        return 0
    i += len(name)
    return int(hdr[i : hdr.find(b"\r\n", i)].strip() or 0)


class PartitionReader:
    """Batched direct gets and filtered purges on one work-queue stream."""

    def __init__(self, nc: NATS, stream: str, *, js_prefix: str = DEFAULT_PREFIX,
                 fast_path: bool | None = None) -> None:
        self.nc, self.stream = nc, stream
        self.api = JsApi(nc, prefix=js_prefix)
        self._get_subject = f"{js_prefix}.DIRECT.GET.{stream}"
        self._fast = fast_path
        self._sub: RawSubscription | None = None
        self._prefix = b""
        self._reqs: dict[bytes, _Request] = {}
        self._token = 0

    async def start(self) -> None:
        if self._sub is None:
            inbox = self.nc.new_inbox()
            self._prefix = f"{inbox}.".encode()
            self._sub = await subscribe_raw(self.nc, f"{inbox}.*", self._on_raw, fast=self._fast)

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        for r in self._reqs.values():
            if not r.fut.done():
                r.fut.set_exception(DirectReadError("reader closed"))
        self._reqs.clear()

    def _on_raw(self, subject: bytes, reply: bytes, data: bytes, hdr: bytes | None) -> None:
        req = self._reqs.get(subject[len(self._prefix) :])
        if req is None:
            return
        if hdr is not None and hdr[_STATUS_AT : _STATUS_AT + 1] == b" " and not data:
            code = int(hdr[9:12])
            if code == 204:  # end of batch
                req.batch.pending = _header_int(hdr, b"Nats-Num-Pending:")
                req.batch.last_seq = _header_int(hdr, b"Nats-Last-Sequence:") or req.batch.last_seq
            elif code != 404:  # 404: nothing (more) in the partition
                req.status = hdr.split(b"\r\n", 1)[0][9:].decode("utf-8", "replace")
            if not req.fut.done():
                req.fut.set_result(None)
            return
        req.batch.hdrs.append(hdr or b"")  # a direct get always has headers
        req.batch.data.append(data)

    async def _get(self, batch: PartitionBatch, from_seq: int, count: int, timeout: float) -> None:
        """One batched direct get of up to ``count`` messages of ``batch.partition`` from
        ``from_seq``, appended to ``batch`` (its ``last_seq`` / ``pending`` updated)."""
        await self.start()
        self._token += 1
        token = b"%d" % self._token
        req = _Request(batch, asyncio.get_running_loop().create_future())
        self._reqs[token] = req
        before = len(batch)
        body = {"seq": max(from_seq, 1), "next_by_subj": batch.subject or subject_filter(batch.partition), "batch": count,
                "max_bytes": REQUEST_BYTES}
        try:
            await self.nc.publish(self._get_subject, json.dumps(body).encode(), reply=(self._prefix + token).decode())
            async with asyncio.timeout(timeout):
                await req.fut
        except TimeoutError:
            del batch.hdrs[before:], batch.data[before:]  # a partial answer is read again
            raise DirectReadError(f"direct get on {self.stream} partition {batch.partition}: no answer "
                                  f"in {timeout:g}s") from None
        except ConsumerGroupError:
            raise
        except Exception as e:  # not sent (reconnecting, closed)
            del batch.hdrs[before:], batch.data[before:]
            raise DirectReadError(f"direct get on {self.stream} not sent: {type(e).__name__}") from None
        finally:
            self._reqs.pop(token, None)
        if req.status is not None:
            del batch.hdrs[before:], batch.data[before:]
            raise DirectReadError(f"direct get on {self.stream} partition {batch.partition}: {req.status}",
                                  retryable=not req.status.startswith("400"))
        if len(batch) > before and batch.last_seq < from_seq:  # an answer without its end-of-batch
            batch.last_seq = _header_int(batch.hdrs[-1], b"Nats-Sequence:")

    async def read(self, partition: int, from_seq: int, count: int, timeout: float = READ_TIMEOUT,
                   subject: str | None = None) -> PartitionBatch:
        """Up to ``count`` messages of ``partition`` (or of ``subject``) with sequence >=
        ``from_seq``, in order."""
        batch = PartitionBatch(partition, subject=subject)
        seq = from_seq
        while len(batch) < count:
            before = len(batch)
            await self._get(batch, seq, count - len(batch), timeout)
            if len(batch) == before or batch.pending == 0:
                break
            seq = batch.last_seq + 1  # the request's byte budget ended it: go on
        return batch

    async def read_partitions(self, starts: dict[int, int], count: int, timeout: float = READ_TIMEOUT,
                              subjects: dict[int, str] | None = None) -> list[PartitionBatch]:
        """Up to ``count`` messages in all from the partitions in ``starts`` (partition ->
        first sequence to read), shared evenly and read concurrently; then whatever share a
        drained partition left is taken from the others. ``subjects``: the filter to read a
        partition by, when not ``<p>.>`` (a literal subject after the partition token is served
        faster: measured here 90-115k against 74-90k msg/s for two partitions of six)."""
        return await read_shares(lambda _p: self, starts, count, timeout, subjects or {})

    async def count_from(self, subject: str, from_seq: int, timeout: float = 5.0) -> tuple[int, int]:
        """``(messages, first sequence)`` of ``subject`` from ``from_seq`` on (``(0, 0)``: none),
        by one direct get of one message: the server counts the rest in its ``Nats-Num-Pending``."""
        batch = PartitionBatch(0, subject=subject)
        await self._get(batch, from_seq, 1, timeout)
        if not len(batch):
            return 0, 0
        return batch.pending + 1, _header_int(batch.hdrs[0], b"Nats-Sequence:")

    async def read_range(self, subject: str, first_seq: int, last_seq: int, expected: int,
                         timeout: float = READ_TIMEOUT) -> PartitionBatch:
        """Every message of ``subject`` with a sequence in ``[first_seq, last_seq]``, in order."""
        out = PartitionBatch(0, subject=subject)
        async for chunk in self.range_chunks(subject, first_seq, last_seq, expected, timeout):
            out.hdrs += chunk.hdrs
            out.data += chunk.data
            out.last_seq = chunk.last_seq
        return out

    async def range_chunks(self, subject: str, first_seq: int, last_seq: int, expected: int,
                           timeout: float = READ_TIMEOUT) -> AsyncIterator[PartitionBatch]:
        """``read_range`` one request's answer at a time (so a consumer works on one while the
        next is read). ``expected``: about how many messages the range holds (each request asks
        for what is left of it, so a filtered read rarely fetches past ``last_seq``; what it
        does fetch there is dropped)."""
        seq, got = first_seq, 0
        while seq <= last_seq:
            batch = PartitionBatch(0, subject=subject)
            want = max(64, min(last_seq - seq + 1, int((expected - got) * 1.1) + 64))
            await self._get(batch, seq, want, timeout)
            if not len(batch):
                return
            done = batch.last_seq >= last_seq or batch.pending == 0
            keep = len(batch)
            while keep and _header_int(batch.hdrs[keep - 1], b"Nats-Sequence:") > last_seq:
                keep -= 1
            del batch.hdrs[keep:], batch.data[keep:]
            seq = batch.last_seq + 1
            batch.last_seq = min(batch.last_seq, last_seq)
            if keep:
                got += keep
                yield batch
            if done:
                return

    async def last_seq(self) -> int:
        """The stream's last sequence now (a failure to learn it is a read error)."""
        try:
            return int((await self.api.stream_info(self.stream))["state"]["last_seq"])
        except ConsumerGroupError as e:  # a restart or leader change; a deleted stream is final
            raise DirectReadError(f"stream info of {self.stream}: {e}",
                                  retryable=not isinstance(e, JetStreamApiError)) from None

    async def read_through(self, subjects: list[str], from_seq: int, count: int,
                           timeout: float = READ_TIMEOUT) -> tuple[list[PartitionBatch], int]:
        """Every message of ``subjects`` from ``from_seq`` up to a cut, about ``count`` in all:
        ``(batches, cut)``, one batch per subject that had any. Each subject is read
        concurrently up to its share; the cut is the highest sequence through which every
        subject was read entirely (a subject stopped by its share bounds it; the stream's last
        sequence before the reads bounds drained ones, as a message stored meanwhile may sort
        below what another subject returned). Messages above the cut are left for the next
        read, so one position (``cut + 1``) describes where the reader is in all subjects."""
        if not subjects:
            return [], from_seq - 1
        before = await self.last_seq()
        share = max(1, -(-count // len(subjects)))
        batches = list(await asyncio.gather(*(self.read(0, from_seq, share, timeout, subject=s) for s in subjects)))
        cut = min([before, *(b.last_seq for b in batches if b.pending)])
        for b in batches:
            if b.last_seq > cut:
                keep = len(b)
                while keep and _header_int(b.hdrs[keep - 1], b"Nats-Sequence:") > cut:
                    keep -= 1
                del b.hdrs[keep:], b.data[keep:]
                b.last_seq = _header_int(b.hdrs[-1], b"Nats-Sequence:") if keep else 0
        return [b for b in batches if len(b)], max(cut, from_seq - 1)

    async def purge_through(self, partition: int, last_seq: int, timeout: float = 10.0) -> int:
        """Remove every message of ``partition`` up to and including ``last_seq`` (the range
        this reader read, contiguously, from the partition's first message): their ack."""
        body = {"seq": last_seq + 1} if partition == ALL else {"filter": subject_filter(partition), "seq": last_seq + 1}
        resp = await self.api.request(f"STREAM.PURGE.{self.stream}", body, timeout=timeout)
        return int(resp.get("purged", 0))

    async def first_seq(self, partition: int, timeout: float = 5.0) -> int | None:
        """Sequence of the partition's first message still in the stream (None: empty)."""
        batch = PartitionBatch(partition)
        await self._get(batch, 0, 1, timeout)
        return _header_int(batch.hdrs[0], b"Nats-Sequence:") if len(batch) else None

    async def acked_through(self, partition: int, last_seq: int, deadline: float) -> bool:
        """Make sure the range up to ``last_seq`` is gone (``repurge_until_gone``)."""
        return await repurge_until_gone(lambda: self.first_seq(partition),
                                        lambda t: self.purge_through(partition, last_seq, timeout=t),
                                        partition, last_seq, deadline)


async def repurge_until_gone(first_left: Callable[[], Awaitable[int | None]],
                             purge: Callable[[float], Awaitable[object]], partition: int, last_seq: int, deadline: float) -> bool:
    """Re-purge (idempotent: ``purge(timeout)``) until ``first_left()``, the partition's first
    message left (None: none), is past ``last_seq``, or ``deadline`` (loop time). False:
    unknown."""
    loop = asyncio.get_running_loop()
    while loop.time() < deadline:
        try:
            first = await first_left()
            if first is None or first > last_seq:
                return True
            await purge(max(1.0, min(5.0, deadline - loop.time())))
        except Exception as e:  # server away (restart, leader change): wait for the reconnect
            log.warning("purge check of partition %d failed (%s); retrying", partition, e)
            await asyncio.sleep(0.5)
    return False


async def read_shares(reader_of: Callable[[int], PartitionReader], starts: dict[int, int], count: int,
                      timeout: float,
                      subjects: dict[int, str]) -> list[PartitionBatch]:
    """``PartitionReader.read_partitions``, each partition read by ``reader_of(partition)``."""
    if not starts:
        return []
    share = max(1, -(-count // len(starts)))
    batches = list(await asyncio.gather(*(reader_of(p).read(p, s, share, timeout, subject=subjects.get(p))
                                          for p, s in starts.items())))
    left = count - sum(len(b) for b in batches)
    for b in batches:
        if left <= 0:
            break
        if b.pending and len(b) == share:  # more there: top it up from where it stopped
            more = await reader_of(b.partition).read(b.partition, b.last_seq + 1, left, timeout, subject=b.subject)
            b.hdrs += more.hdrs
            b.data += more.data
            b.last_seq, b.pending = (more.last_seq or b.last_seq), more.pending
            left -= len(more)
    return [b for b in batches if len(b)]


class PartitionStreamLost(DirectReadError):
    """A partition stream lacks a message its log holds and the reader had not read (its
    server's store was lost, a replacement node came up empty): nothing of the partition may be
    landed until the stream is made again from the log."""

    def __init__(self, partition: int, stream: str, log: str, seq: int) -> None:
        super().__init__(f"partition {partition}'s stream {stream} lost messages: {log} holds sequence {seq}, "
                         "not landed, and the stream does not", retryable=False)
        self.partition, self.seq = partition, seq


class PartitionStreamReaders:
    """One :class:`PartitionReader` per partition stream of a group in the ``partition-streams``
    layout (``groups/layouts/``), behind the reads and acks a :class:`PartitionReader` offers
    per partition: each stream holds one partition, read unfiltered (``ALL``'s subject); the
    sequences are its log's, so one cut spans them all. The log (``log``) is the copy of
    record: a landed range is purged from it first, then from the stream, and every read checks
    that the stream holds the log's first message of the partition from where it reads
    (``PartitionStreamLost`` otherwise). ``mirrors``: each partition's mirror consumer on the
    log (an empty stream lost what its mirror says it delivered)."""

    def __init__(self, nc: NATS, streams: dict[int, str], *, log: str, mirrors: dict[int, str],
                 js_prefix: str = DEFAULT_PREFIX, fast_path: bool | None = None) -> None:
        self.streams = dict(streams)
        self.readers = {p: PartitionReader(nc, s, js_prefix=js_prefix, fast_path=fast_path) for p, s in streams.items()}
        self.log, self.mirrors = log, dict(mirrors)
        self.log_reader = PartitionReader(nc, log, js_prefix=js_prefix, fast_path=fast_path)
        self.api = JsApi(nc, prefix=js_prefix)
        #: a group moved to partition streams by an earlier version (they mirror its work queue,
        #: and there is no log): its streams are drained as they are, with nothing to check against
        self.without_log = False

    def __getitem__(self, partition: int) -> PartitionReader:
        return self.readers[partition]

    async def close(self) -> None:
        for r in (*self.readers.values(), self.log_reader):
            await r.close()

    async def last_seq(self) -> int:
        """The highest last sequence of the partition streams (a bound for a cut)."""
        return max([await r.last_seq() for r in self.readers.values()] or [0])

    async def read_partitions(self, starts: dict[int, int], count: int, timeout: float = READ_TIMEOUT,
                              subjects: dict[int, str] | None = None) -> list[PartitionBatch]:
        """As ``PartitionReader.read_partitions``; every stream is read unfiltered (``subjects``
        does not apply: a stream holds only its partition). Raises ``PartitionStreamLost``
        when a stream lacks the log's first message from where it is read."""
        batches = await read_shares(self.readers.__getitem__, starts, count, timeout,
                                    {p: subject_filter(ALL) for p in starts})
        read = {b.partition: b for b in batches if len(b)}
        await self.check_fronts({p: (s, _header_int(read[p].hdrs[0], b"Nats-Sequence:") if p in read else None)
                                 for p, s in starts.items()})
        return batches

    async def check_fronts(self, fronts: dict[int, tuple[int, int | None]]) -> None:
        """``fronts``: per partition, ``(from_seq, first)``, the first message its stream holds
        from ``from_seq`` on (None: none). ``PartitionStreamLost`` for the first partition
        whose stream lacks what its log holds there (``lost_from``)."""
        found = await asyncio.gather(*(self.lost_from(p, s, f) for p, (s, f) in fronts.items()))
        for p, seq in zip(fronts, found, strict=True):
            if seq is not None:
                raise PartitionStreamLost(p, self.streams[p], self.log, seq)

    async def lost_from(self, partition: int, from_seq: int, first: int | None) -> int | None:
        if self.without_log:
            return None
        try:
            return await lost_from(self.api, self.log, self.mirrors[partition], partition, from_seq, first)
        except JetStreamApiError as e:
            if e.err_code == ERR_STREAM_NOT_FOUND:  # a group an earlier version moved here: its streams only
                self.without_log = True
                return None
            raise DirectReadError(f"the log {self.log} of partition {partition}: {e}") from None
        except ConsumerGroupError as e:  # a restart or leader change: read again
            raise DirectReadError(f"the log {self.log} of partition {partition}: {e}") from None

    async def purge_through(self, partition: int, last_seq: int, timeout: float = 10.0) -> int:
        """The ack of a landed range: purged from the log (the copy of record), then from the
        partition's stream. Returns what the stream dropped."""
        if not self.without_log:
            await self.log_reader.purge_through(partition, last_seq, timeout)
        return await self.readers[partition].purge_through(ALL, last_seq, timeout)

    async def acked_through(self, partition: int, last_seq: int, deadline: float) -> bool:
        """Make sure the range up to ``last_seq`` is gone from the log (the ack), and then from
        the stream, re-purging both (``repurge_until_gone``)."""
        async def log_first() -> int | None:  # read from the log's leader
            head = None if self.without_log else await self.api.next_msg(self.log, 1, f"{partition}.>")
            first = int(head["seq"]) if head else None
            if first is None or first > last_seq:
                await self.readers[partition].purge_through(ALL, last_seq, timeout=5.0)
            return first

        return await repurge_until_gone(log_first, lambda t: self.purge_through(partition, last_seq, timeout=t),
                                        partition, last_seq, deadline)


async def lost_from(api: JsApi, log_stream: str, mirror: str, partition: int, from_seq: int, first: int | None,
                    mirror_info: dict | None = None) -> int | None:
    """The log's first message of ``partition`` from ``from_seq`` on when the partition's stream
    lost it, else None: the stream's first message from there (``first``) is past it (its
    mirror delivers in order), or it has none and its mirror consumer ``mirror`` (its info:
    ``mirror_info``, read when needed) says it delivered it. The log is read from its leader: a
    replica serving direct gets may not have seen the latest purge yet."""
    head = await api.next_msg(log_stream, max(from_seq, 1), f"{partition}.>")
    if head is None:
        return None
    seq = int(head["seq"])
    if first is not None:
        return seq if first > seq else None
    if mirror_info is None:
        mirror_info = await api.consumer_info(log_stream, mirror)
    floor = int(((mirror_info or {}).get("ack_floor") or {}).get("stream_seq") or 0)
    return seq if floor >= seq else None


async def plan_ranges(reader: PartitionReader | PartitionStreamReaders, starts: dict[int, tuple[str, int]], count: int,
                      last_seq: int, rounds: int = 16) -> tuple[list[ReadRange], int]:
    """Plan a batch of at most ``count`` (>= 1) messages without reading it: for each
    ``partition: (subject, first sequence to read)``, the range from its first message up to
    one common cut, at most ``last_seq`` (the stream's last sequence when planning started).
    The server counts (``count_from``); the cut is lowered (in proportion, then by halves)
    until the ranges hold at most ``count`` in all. Returns ``(ranges, cut)``; no ranges when
    nothing is stored up to ``last_seq``.

    Messages from the cut on are counted before those from the start, so a message stored in
    between is counted in the start's only: an overcount, and the batch never exceeds ``count``."""
    def of(p: int) -> PartitionReader:
        return reader[p] if isinstance(reader, PartitionStreamReaders) else reader

    found = await asyncio.gather(*(of(p).count_from(subject, start) for p, (subject, start) in starts.items()))
    if isinstance(reader, PartitionStreamReaders):
        await reader.check_fronts({p: (start, first or None) for (p, (_, start)), (_, first)
                                   in zip(starts.items(), found, strict=True)})
    firsts = {p: first for p, (_, first) in zip(starts, found, strict=True) if 0 < first <= last_seq}
    if not firsts:
        return [], 0

    async def held_through(cut: int) -> dict[int, int]:
        after = await asyncio.gather(*(of(p).count_from(starts[p][0], cut + 1) for p in firsts))
        total = await asyncio.gather(*(of(p).count_from(starts[p][0], f) for p, f in firsts.items()))
        return {p: max(0, t - a) for p, (t, _), (a, _) in zip(firsts, total, after, strict=True)}

    low = min(firsts.values())  # a cut here holds one message: it always fits
    cut = last_seq
    for _ in range(rounds):
        held = await held_through(cut)
        n = sum(held.values())
        if n <= count:
            break
        guess = low - 1 + (cut - low + 1) * count * 15 // (n * 16)  # messages spread about evenly
        cut = guess if low < guess < cut else (low + cut) // 2
        if cut <= low:
            break
    else:
        cut = low
    if cut <= low:
        cut, held = low, await held_through(low)
    stream = (lambda p: reader.streams[p]) if isinstance(reader, PartitionStreamReaders) else (lambda p: None)
    ranges = [ReadRange(p, starts[p][0], f, cut, held[p], stream(p)) for p, f in firsts.items() if held[p] and f <= cut]
    return ranges, cut


# --- rows ------------------------------------------------------------------------------------
