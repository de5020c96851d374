"""The planning side of the streaming source (``source.py``): each member's pin, held for the
query's life; micro-batches planned as offsets; what Spark committed, acknowledged.

Spark runs a Python stream reader's planning calls (``initialOffset``, ``latestOffset``,
``partitions``, ``commit``) one at a time in one long-lived Python process beside the query's
driver. The session lives there. Its asyncio loop runs in a thread of its own, so between
Spark's calls it keeps the pins: a pinned client must pull within the consumer's priority
timeout, and a trigger interval may be longer.

Offsets (``{"<member>": {"<partition>": next sequence, "@": marks}}``, ``"*"``: every
partition of the member's stream, or a static member's one position) are where a batch ends. A batch's
messages are acknowledged (an elastic group's purged from its work queue or partition
streams, a static member's durable moved past them) only once Spark has committed it:
in ``commit(end)``, and again for ``start`` when the next batch is planned (Spark never calls
``commit`` for an available-now query's last batch; an ack is idempotent). So a query
restarted from its checkpoint finds every message of an uncommitted batch still there to read
again, and none of a committed one.

The streams read are checked, not trusted. A store that comes back older (a power loss under
lazy fsync, a restored snapshot) or a stream created again gives the sequences of messages a
checkpoint has read to other messages: acknowledging up to the checkpoint's offsets would then
purge new messages unread, and reading on from them would skip them. So each offset carries the
**marks** of the streams its member reads (``"@": {"<stream>": [last sequence, its stored
time]}``, taken when the batch was planned), and before an offset's messages are acknowledged
or read on from (``_ack``: every planning call and commit begins there) the session asks the
stream whether it still holds that message there (``origin_guard.find_went_back``, as the member
job checks its table's marks). A stream that went back below the offset stops the query
(``StreamWentBack``), nothing acknowledged; with ``failOnDataLoss`` false the query reads on
from where the stream went back instead (``MemberHold.rewound``), as Kafka's source reads on
from the earliest offset it still has.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_provider_cg.core.errors import (
    ConfigError,
    ConsumerGroupError,
    GroupNotFound,
    JetStreamApiError,
)
from airflow_provider_cg.core.groups import partitioning
from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import in_membership
from airflow_provider_cg.core.groups.consumers import pinned_id
from airflow_provider_cg.core.jetstream import tasks
from airflow_provider_cg.core.jetstream.api import JsApi, rfc3339, stored_ns
from airflow_provider_cg.core.jetstream.client import PriorityClient
from airflow_provider_cg.core.jetstream.direct_gets import (
    ALL,
    PartitionStreamReaders,
    ReadRange,
)
from airflow_provider_cg.core.landing.contract import BatchOptions
from airflow_provider_cg.core.landing.pipeline.nats_source import batch_plan, server_away
from airflow_provider_cg.core.landing.protocol.origin_guard import find_went_back
from airflow_provider_cg.core.landing.reads.direct import ConsumerPosition, Positions
from airflow_provider_cg.core.landing.reads.pin import Pin
from airflow_provider_cg.core.landing.reads.reading import Assignment
from airflow_provider_cg.core.landing.run.member import direct_reader, member_assignment, positions_of
from airflow_provider_cg.core.landing.stream_life import OriginMark

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from airflow_provider_cg.core.streaming.source_options import SourceOptions

log = logging.getLogger("airflow_provider_cg.streaming")

T = TypeVar("T")
#: a source offset: per member, per partition key (``"*"``: ``ALL``), the next sequence, and
#: under ``MARKS`` the marks of the streams read
Offset = dict[str, dict[str, Any]]
#: an offset's key for the marks of the streams its member reads: ``{stream: [seq, stored ns]}``
MARKS = "@"
ZERO_TIME = "0001-01-01T00:00:00Z"  # Go's zero time, as the server writes an unknown one
#: a Spark call waits at most this long for the session (beyond the pin wait it asks for)
CALL_TIMEOUT = 120.0
#: how long a Spark call retries what a server restart, a leader change or a busy server
#: interrupts (every step it retries is a read or an idempotent ack) before the query fails
RETRY_SECONDS = 60.0


#: why else a query finds its pin gone: the server keeps no pin across a restart or a leader
#: change, and lets it lapse after the consumer's priority timeout without a pull
PIN_LOST_WHY = (" or the server let it go (a server restart or leader change, or the query stalled past the "
                "consumer's priority timeout)")


class PinNotHeld(ConsumerGroupError):
    """The query does not hold, or lost, a member's pin: it stops, acknowledging nothing more."""


class StreamWentBack(ConfigError):
    """A stream a member reads no longer holds what the query's checkpoint read from it: the
    query stops, nothing acknowledged (see the module docstring)."""

    def __init__(self, member: str, stream: str, mark: OriginMark, to_seq: int | None, last_seq: int) -> None:
        self.stream, self.to_seq = stream, to_seq
        where = (f"went back to sequence {to_seq}" if to_seq is not None
                 else f"no longer holds its message at {mark.seq} (it ends at {last_seq})")
        super().__init__("stream", (
            f"stream {stream!r}, which member {member!r} reads, {where}: this query's checkpoint read it up to "
            f"{mark.seq} (stored {rfc3339(mark.ts)}), so "
            + (f"its messages after {to_seq}" if to_seq is not None else "some of the messages it read")
            + " are others, or gone (its server came back on an older copy of its store, or the stream was created "
            "again). Nothing was acknowledged; the query stops. To read on from where it went back, keeping the "
            "query's state, run it with option failOnDataLoss=false; or start it from a new checkpoint (through "
            "SinkBatches into a table that holds the lost messages: with stream_life=\"went-back:<R>\" as the "
            "table's refusal says)"))


def _where(offset: dict | None) -> dict[int, int]:
    """A member's offset as positions: partition (``ALL``) to the next sequence."""
    return {_part(k): int(v) for k, v in (offset or {}).items() if k != MARKS}


def _marks(offset: dict | None) -> dict[str, tuple[int, int]]:
    return {stream: (int(v[0]), int(v[1])) for stream, v in ((offset or {}).get(MARKS) or {}).items()}


def _key(k: int) -> str:
    return "*" if k == ALL else str(k)


def _part(k: str) -> int:
    return ALL if k == "*" else int(k)


@dataclass(frozen=True)
class Fence:
    """What a task checks before and after it reads (``source.py``), and the session before it
    plans or acknowledges: the member consumer, as created when it was pinned, pins this
    session (``holder_is``)."""

    stream: str
    consumer: str
    pin_id: str
    created: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"stream": self.stream, "consumer": self.consumer, "pin": self.pin_id, "created": self.created}


def holder_is(info: dict | None, fence: dict) -> bool:
    """Whether a member consumer's ``info`` still pins the ``fence``'s client (``Fence.to_dict``).
    Strictly: a query keeps its pin alive all its life, so a consumer that pins nobody lost it
    (unpinned, or another instance held it meanwhile and gave it back)."""
    if info is None or info.get("created") != fence.get("created"):
        return False
    return pinned_id(info) == fence.get("pin")


class MemberHold:
    """One member of the query: its assignment, direct-get reader, positions and pin."""

    def __init__(self, nc: NATS, options: BatchOptions, member: str, js_prefix: str) -> None:
        self.nc, self.options, self.member = nc, options, member
        self.api = JsApi(nc, prefix=js_prefix)
        self.groups = ConsumerGroups(nc, js_prefix=js_prefix)
        self.owner = f"{member}/stream-{secrets.token_hex(6)}"
        self.assignment: Assignment | None = None
        self.positions: Positions | None = None
        self.pin: Pin | None = None
        self.reader: Any = None
        self.keeper: asyncio.Task | None = None
        self.acquiring: asyncio.Task | None = None  # the pin's acquisition (``_acquire``)
        self.pending: dict[int, int] = {}  # what Spark committed, to acknowledge once pinned
        self.done = False  # an available-now query landed all it will: its pin given back
        self.acked: dict[int, int] = {}  # the next sequence not yet acknowledged by this session, per key
        self.first_where: dict[int, int] = {}  # where a new query starts (``initial``)
        self.planned: tuple[dict[int, int], dict[int, int], list[ReadRange]] | None = None  # the last plan
        #: per stream, the last mark checked and the connection's reconnects then (``check_marks``)
        self.verified: dict[str, tuple[int, int, int]] = {}
        #: where a stream that went back is read on from (``failOnDataLoss`` false): per mark of
        #: the checkpoint's offset, its positions there and the ones that replace them
        self.rewound: dict[tuple[str, int, int], dict[int, tuple[int, int]]] = {}

    async def open(self) -> None:
        """The assignment, its reader and positions; the pin is acquired in the background
        (``_acquire``): a member with nothing to deliver pins nobody, and a query may start
        before its first message. Waits a moment for it, so a member with messages starts pinned."""
        o = self.options
        a = self.assignment = await member_assignment(self.groups, self.api, o, self.member, o.batch_size)
        self.reader, why = await direct_reader(self.nc, self.api, a, True)
        if self.reader is None:
            raise ConfigError("stream", f"a streaming query reads by direct gets: {why}")
        client = PriorityClient(self.nc, a.consumer_stream, a.consumer, a.priority_group)
        self.pin = Pin(self.nc, client, member=self.member, owner=self.owner, anchored=a.partition_streams,
                       ack_wait=a.ack_wait)
        info = await client.consumer_info()
        self.pin.adopt_timings(info.get("config") or {}, a.ack_wait)
        self.positions = positions_of(a, self.reader, self.api, a.consumer)
        if isinstance(self.positions, ConsumerPosition):  # the durable's place: after what it acknowledged
            self.positions.next_seq = int((info.get("ack_floor") or {}).get("stream_seq") or 0) + 1
            self.acked = {ALL: self.positions.next_seq}
        self.first_where = self.positions.where()
        self.acquiring = asyncio.create_task(self._acquire())
        await asyncio.wait({self.acquiring}, timeout=2.0)
        if self.acquiring.done():
            self.acquiring.result()  # (a failure raised here)

    async def _acquire(self) -> None:
        """Pull as a standby until the server pins this session (then keep the pin). Nobody
        pinned and nothing delivered within ``pinTimeout``: nothing to read yet, go on waiting;
        another instance holding the pin that long: ``PinNotHeld``."""
        o, a, pin = self.options, self._assignment(), self._pin()
        while True:
            first = await pin.acquire(time.monotonic() + o.standby_timeout, 1, lambda: False)
            if first:
                break
            holder = pinned_id(await pin.client.consumer_info())
            log.info("cg stream source: member=%s not pinned after %.0f s (%s)", self.member, o.standby_timeout,
                     f"held by {holder}" if holder else "nothing delivered: no message to read yet")
            if holder:
                raise PinNotHeld(f"member {self.member!r} of group {o.group!r}: another instance holds its pin (pin "
                                 f"id {holder}) for longer than pinTimeout ({o.standby_timeout:g} s): stop it, or give "
                                 "a longer pinTimeout for this query to wait as its standby")
        if a.partition_streams:  # pin anchors: nothing to read
            for m in first:
                await pin.client.ack(m)
        await pin.pinned()
        self.keeper = asyncio.create_task(pin.keep_until_lost())
        log.info("cg stream source: pinned member=%s pin_id=%s partitions=%s", self.member, pin.pin_id,
                 list(a.partitions))

    def pinned(self) -> bool:
        """Whether the session holds the pin now (a failed acquisition raises its error)."""
        if self.acquiring is None or not self.acquiring.done():
            return False
        self.acquiring.result()
        return True

    async def wait_pinned(self) -> None:
        if self.acquiring is None:
            raise PinNotHeld(f"member {self.member!r}: not open")
        await asyncio.shield(self.acquiring)

    async def _consumer_info(self) -> dict | None:
        """The member consumer's info (None: gone, or no answer: either way not held)."""
        try:
            return await self._pin().client.consumer_info()
        except ConsumerGroupError as e:
            if server_away(e):
                raise  # (the Spark call retries it)
            return None

    def fence(self) -> Fence:
        a, pin = self._assignment(), self._pin()
        if pin.pin_id is None:
            raise PinNotHeld(f"member {self.member!r}: the pin was lost")
        return Fence(a.consumer_stream, a.consumer, pin.pin_id, pin.created)

    async def check_held(self) -> None:
        """Raises ``PinNotHeld`` when the pin moved (the query stops: nothing more is planned
        or acknowledged)."""
        if self.keeper is None or self.keeper.done() or self._pin().pin_id is None or \
                not holder_is(await self._consumer_info(), self.fence().to_dict()):
            raise PinNotHeld(f"member {self.member!r} of group {self.options.group!r}: its pin moved to another "
                             f"instance{PIN_LOST_WHY}; the query stops and acknowledges nothing more (the new holder, "
                             "or the query restarted from its checkpoint, gets what this query did not commit)")

    async def membership_changed(self) -> tuple[int, ...] | None:
        """The member's partitions when the group now gives it others than this assignment's (an
        elastic group's membership change, by this project's tools or orbit's), else None."""
        a, o = self._assignment(), self.options
        try:
            cfg = (await self.groups.get(o.stream, o.group)).config
        except GroupNotFound:
            raise ConsumerGroupError(f"group {o.group!r} on stream {o.stream!r} was deleted") from None
        now = partitioning.member_filter_subjects(cfg, self.member) if in_membership(cfg, self.member) else []
        if sorted(now) == sorted(a.filters):
            return None
        return tuple(partitioning.member_partitions(cfg, self.member)) if now else ()

    async def hand_over(self) -> None:
        """After a membership change, with everything Spark committed acknowledged: as orbit's
        pinned instance does, delete the member consumer (it is made again with the new
        filters, and the partitions the member lost are free for their new owners), then take
        the new assignment and its pin."""
        a, o = self._assignment(), self.options
        holds = await self._pin().holds()
        await self.close(release=False)
        if holds:
            try:
                await self.api.delete_consumer(a.consumer_stream, a.consumer)
            except JetStreamApiError as e:
                if e.code != 404:
                    raise
        cfg = (await self.groups.get(o.stream, o.group)).config
        if not (in_membership(cfg, self.member) and partitioning.member_partitions(cfg, self.member)):
            raise ConsumerGroupError(f"member {self.member!r} left group {o.group!r}: it has no partitions to read")
        log.info("cg stream source: member=%s membership changed; taking its new partitions", self.member)
        self.acked, self.planned = {}, None
        await self.open()

    def begin(self, start: dict[int, int]) -> dict[int, int]:
        """Where a batch after ``start`` begins in each of the member's partitions now (a
        partition ``start`` does not name, a new one: from its first message)."""
        return {k: start.get(k, self.first_where.get(k, 0)) for k in self._positions().where()}

    async def plan(self, start: dict[int, int], count: int, last_seq: int | None) -> tuple[dict[int, int], int]:
        """The next batch after ``start``: its end and how many messages it holds (at most
        ``count``, up to ``last_seq`` when given). Nothing new: ``start`` itself."""
        positions, begin = self._positions(), self.begin(start)
        positions.place(begin)
        ranges, cut = await positions.plan(max(1, count), last_seq)
        if not ranges:
            return begin, 0
        end = {k: max(s, cut + 1) for k, s in begin.items()}
        self.planned = (begin, end, ranges)  # what ``ranges`` gives Spark's next call
        return end, sum(r.messages for r in ranges)

    async def ranges(self, start: dict[int, int], end: dict[int, int]) -> list[ReadRange]:
        """A planned batch's ranges: as ``plan`` counted them, or for a batch Spark runs again
        after a restart, each from its first message still stored (an elastic partition's
        ``start`` may lie far below it, or name nothing: from the first)."""
        if self.planned is not None and self.planned[:2] == (self.begin(start), end):
            return self.planned[2]
        positions = self._positions()
        out = []
        for r in positions.ranges_between(start, end):
            reader = self.reader[r.partition] if r.stream else self.reader
            n, first = await reader.count_from(r.subject, r.first_seq)
            if n and first <= r.last_seq:
                out.append(ReadRange(r.partition, r.subject, first, r.last_seq, min(n, r.last_seq - first + 1),
                                     r.stream))
        return out

    async def ack(self, end: dict[int, int]) -> None:
        """Acknowledge everything before ``end`` that this session has not yet (Spark has
        committed it), after making sure the pin is still this query's."""
        positions = self._positions()
        todo = {k: e for k, e in end.items() if e > self.acked.get(k, 1) and (k in positions.where())}
        if not todo:
            return
        if not self.pinned():  # acknowledged once pinned: never without the pin
            self.pending = {k: max(e, self.pending.get(k, 0)) for k, e in todo.items()}
            return
        todo = {k: max(e, self.pending.pop(k, 0)) for k, e in todo.items()}
        await self.check_held()
        if self._assignment().elastic and (now := await self.membership_changed()) is not None:
            # partitions that moved away are their new owner's, who may be landing them now:
            # only what is still this member's is acknowledged (never another's messages)
            if ALL in todo:
                e = todo.pop(ALL)
                todo.update({p: e for p in now})
            todo = {k: e for k, e in todo.items() if k in now}
            if not todo:
                return
        done = [ReadRange(k, "", 0, e - 1, 0) for k, e in todo.items()]
        cut = max(e for e in todo.values()) - 1
        unknown = await positions.ack(done, cut)
        if unknown:
            raise ConsumerGroupError(f"member {self.member!r}: the ack of {unknown} committed messages could not be "
                                     "confirmed (server unreachable); the query stops, and its restart acknowledges "
                                     "them again")
        self.acked.update(todo)

    async def finish(self) -> None:
        """An available-now query has landed and acknowledged everything up to its end: give the
        pin back now (Spark may end the planning process before ``stop``; a pin left to lapse
        would keep the member's next run waiting for the consumer's priority timeout)."""
        self.done = True
        keeper, self.keeper = self.keeper, None
        if keeper is not None:
            await tasks.stop(keeper)
        if self.pin is not None:
            await self.pin.release()
            log.info("cg stream source: member=%s landed what it was to land; pin released", self.member)

    def streams_read(self) -> dict[str, Any]:
        """The streams the member's messages are read from, with their readers (a partition
        stream each, or the work queue, or a static member's origin)."""
        if isinstance(self.reader, PartitionStreamReaders):
            return {r.stream: r for r in self.reader.readers.values()}
        return {self.reader.stream: self.reader}

    async def marks(self) -> dict[str, list[int]]:
        """Each stream read's last message now, ``[sequence, stored time]`` (``MARKS``): taken
        when a batch is planned, so it is at or after the batch's last message."""
        streams = self.streams_read()
        infos = await asyncio.gather(*(r.api.stream_info(s) for s, r in streams.items()))
        out = {}
        for stream, info in zip(streams, infos, strict=True):
            state = info.get("state") or {}
            seq, ts = int(state.get("last_seq") or 0), stored_ns({"time": state.get("last_ts") or ZERO_TIME})
            if seq > 0 and ts > 0:  # (a store recovered empty may not know its last message's time)
                out[stream] = [seq, ts]
        return out

    async def check_marks(self, offset: dict, fail: bool = True) -> None:
        """``StreamWentBack`` unless each stream read still holds its mark of ``offset`` (or went
        back only past what ``offset`` has read); not ``fail``: the positions of ``offset`` in
        such a stream are replaced by where it went back (``rewound``). A mark is asked once per
        connection: a server that comes back older is one the connection was made to again."""
        where, reconnects = _where(offset), int((getattr(self.nc, "stats", None) or {}).get("reconnects", 0))
        streams = self.streams_read()
        for stream, (seq, ts) in _marks(offset).items():
            if self.verified.get(stream) == (seq, ts, reconnects) or stream not in streams:
                continue
            went = await find_went_back(streams[stream].api, stream, OriginMark(stream, seq, ts))
            keys = [k for k in where if self._stream_of(k) == stream]
            if went is not None and (went.to_seq is None or went.to_seq < max([where[k] - 1 for k in keys] or [0])):
                if fail:
                    raise StreamWentBack(self.member, stream, went.mark, went.to_seq, went.last_seq)
                # from the first message after the last one it still holds of the checkpoint's
                # (not knowing which: from where the group is, which may read some again)
                again = {k: went.to_seq + 1 if went.to_seq is not None else self.first_where.get(k, 0) for k in keys}
                self.rewound[(stream, seq, ts)] = {k: (where[k], again[k]) for k in keys if where[k] > again[k]}
                log.warning("cg stream source: member=%s: stream %s went back to %s, below this query's checkpoint "
                            "(read up to %d); failOnDataLoss is false: reading on from there", self.member, stream,
                            went.to_seq if went.to_seq is not None else "an unknown sequence", seq)
            self.verified[stream] = (seq, ts, reconnects)

    def where_of(self, offset: dict | None) -> dict[int, int]:
        """The positions of the member's ``offset``, those of a checkpoint in a stream that went
        back replaced (``rewound``: the offset is known by its marks, since after a rollback the
        same positions name other messages)."""
        where = _where(offset)
        for stream, (seq, ts) in _marks(offset).items():
            for k, (old, again) in self.rewound.get((stream, seq, ts), {}).items():
                if where.get(k) == old:
                    where[k] = again
        return where

    def _stream_of(self, key: int) -> str:
        if isinstance(self.reader, PartitionStreamReaders):
            return self.reader.readers[key].stream if key in self.reader.readers else ""
        return self.reader.stream

    async def latest(self) -> dict[int, int]:
        """Where the member's streams end now (for Spark's progress: how far behind it is)."""
        last = await self.reader.last_seq()
        return {k: last + 1 for k in self._positions().where()}

    async def close(self, release: bool = True) -> None:
        acquiring, self.acquiring = self.acquiring, None
        if acquiring is not None:
            await tasks.stop(acquiring)
        keeper, self.keeper = self.keeper, None
        if keeper is not None:
            await tasks.stop(keeper)
        pin, reader = self.pin, self.reader
        self.pin = self.reader = None
        if pin is not None:
            if release:
                await pin.release()
            await pin.close()
        if reader is not None:
            await reader.close()

    def _assignment(self) -> Assignment:
        if self.assignment is None:
            raise ConsumerGroupError("the member is not open")
        return self.assignment

    def _positions(self) -> Positions:
        if self.positions is None:
            raise ConsumerGroupError("the member is not open")
        return self.positions

    def _pin(self) -> Pin:
        if self.pin is None:
            raise PinNotHeld(f"member {self.member!r}: no pin (closed)")
        return self.pin


class SourceSession:
    """The members of one query, on an asyncio loop of their own (see the module docstring).
    Its methods are Spark's calls, synchronous, with offsets as Spark keeps them."""

    def __init__(self, settings: dict, options: SourceOptions) -> None:
        self.settings, self.options = settings, options
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="cg-stream-source", daemon=True)
        self.thread.start()
        self.nc: NATS | None = None
        self.holds: dict[str, MemberHold] = {}
        self.bound: dict[str, int] | None = None  # an available-now query's end, per member
        self.available_now = False
        self._turn = 0  # the member whose batch share is planned first, in turn
        try:
            self._call(self._open())
        except BaseException:
            self.stop()
            raise

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(
            timeout or CALL_TIMEOUT + RETRY_SECONDS + self.options.pin_timeout)

    def _retrying(self, step: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """``_call(step())``, again while the server is away or slow (``server_away``) for up to
        ``RETRY_SECONDS``: a step is a read or an idempotent ack, so doing it again is safe."""
        async def go() -> T:
            deadline = time.monotonic() + RETRY_SECONDS
            while True:
                try:
                    return await step()
                except Exception as e:
                    if not server_away(e) or time.monotonic() > deadline:
                        raise
                    log.warning("cg stream source: %s; retrying", str(e)[:200] or type(e).__name__)
                    await asyncio.sleep(0.5)
        return self._call(go())

    async def _open(self) -> None:
        from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings

        o = self.options
        settings = NatsConnectionSettings.from_mapping({**self.settings, **({"servers": o.servers} if o.servers else {})})
        settings.name = settings.name or f"cg-stream-{o.stream}-{o.group}"
        self.nc = await settings.connect()
        batch = BatchOptions(stream=o.stream, group=o.group, member=o.members[0], standby_timeout=o.pin_timeout,
                             ack_wait=o.ack_wait)
        self.holds = {m: MemberHold(self.nc, batch, m, o.js_prefix) for m in o.members}
        await asyncio.gather(*(h.open() for h in self.holds.values()))
        if o.starting_position == "latest":
            for h in self.holds.values():
                h.first_where = await h.latest()

    # --- Spark's calls -----------------------------------------------------------------------

    def initial_offset(self) -> Offset:
        return {m: {_key(k): s for k, s in h.first_where.items()} for m, h in self.holds.items()}

    def latest_offset(self, start: Offset, max_messages: int | None) -> Offset:
        """Everything before ``start`` is committed: acknowledged first. Then the next batch,
        at most ``max_messages`` (shared by the members, each first in turn)."""
        return self._retrying(lambda: self._latest_offset(start, max_messages))

    async def _latest_offset(self, start: Offset, max_messages: int | None) -> Offset:
        await self._ack(start)
        for h in self.holds.values():
            if h.pinned() and not h.done:
                await h.check_held()
                if await h.membership_changed() is not None:
                    await h.hand_over()
        if self.available_now and self.bound is None:
            self.bound = {m: await h.reader.last_seq() for m, h in self.holds.items()}
        left = max_messages if max_messages is not None else 10 ** 12
        out: Offset = {}
        members = list(self.holds)
        self._turn = (self._turn + 1) % len(members)
        for m in members[self._turn:] + members[:self._turn]:
            h = self.holds[m]
            begin = h.where_of(start.get(m))
            end, n = await h.plan(begin, left, self.bound.get(m) if self.bound else None) if left > 0 and not h.done \
                else (h.begin(begin), 0)
            if self.bound is not None and n == 0 and left > 0 and not h.done and h.pinned() and not h.pending:
                await h.finish()  # everything up to the end planned, committed (start) and acknowledged
            if n and not h.pinned():  # its tasks read only while it holds the pin: a message came, it comes
                await h.wait_pinned()
                await h.ack(h.pending)
            left -= n
            marks = (await h.marks()) if n else (start.get(m) or {}).get(MARKS)
            out[m] = {**{_key(k): s for k, s in end.items()}, **({MARKS: marks} if marks else {})}
        return out

    def partitions(self, start: Offset, end: Offset) -> list[tuple[str, list]]:
        """The batch ``(start, end]`` as tasks: ``(plan, split)`` pairs for ``source.read``,
        one per range (``min_partitions`` splits them further), each plan fenced by the pin."""
        return self._retrying(lambda: self._partitions(start, end))

    async def _partitions(self, start: Offset, end: Offset) -> list[tuple[str, list]]:
        await self._ack(start)
        out: list[tuple[str, list]] = []
        ranges_of = {}
        for m, h in self.holds.items():
            if (end.get(m) or {}) == (start.get(m) or {}):  # (after a stream went back, positions
                continue                                     # may repeat: the marks tell them apart)
            ranges_of[m] = await h.ranges(h.where_of(start.get(m)), _where(end.get(m)))
            if ranges_of[m]:  # (a batch run again after a restart: its messages are there to pin on)
                await h.wait_pinned()
                await h.ack(h.pending)
                await h.check_held()
        total = sum(len(r) for r in ranges_of.values())
        for m, ranges in ranges_of.items():
            if not ranges:
                continue
            h = self.holds[m]
            a, positions = h._assignment(), h._positions()
            per = max(1, -(-(self.options.min_partitions or total) // total)) * len(ranges)
            plan = json.loads(batch_plan(ranges, stream=a.consumer_stream, origin=positions.origin,
                                         group=self.options.group, member=m, key_rules=a.key_rules,
                                         js_prefix=self.options.js_prefix, only=positions.only, parallelism=per))
            splits = plan.pop("splits")
            plan["fence"] = h.fence().to_dict()
            text = json.dumps(plan, separators=(",", ":"))
            out.extend((text, split) for split in splits)
        return out

    def commit(self, end: Offset) -> None:
        self._retrying(lambda: self._ack(end))

    async def _ack(self, end: Offset) -> None:
        """Acknowledge what ``end`` says was committed, once its streams are checked (``MARKS``):
        every planning call begins here, with the offset it reads on from."""
        for m, h in self.holds.items():
            if end.get(m):
                await h.check_marks(end[m], self.options.fail_on_data_loss)
                await h.ack(h.where_of(end[m]))

    def report_latest(self) -> Offset:
        async def latest() -> Offset:
            return {m: {_key(k): s for k, s in (await h.latest()).items()} for m, h in self.holds.items()}
        return self._retrying(latest)

    def stop(self) -> None:
        """Release the pins (a standby, or the next run, gets them now) and close."""
        async def close() -> None:
            for h in self.holds.values():
                try:
                    await h.close()
                except Exception as e:  # noqa: BLE001 - the pin's timeout frees it anyway
                    log.info("cg stream source: member=%s not closed cleanly (%s)", h.member, e)
            if self.nc is not None:
                try:
                    await self.nc.close()
                except Exception:  # noqa: BLE001 - closing a broken connection
                    pass
        if self.loop.is_running():
            try:
                self._call(close(), timeout=30.0)
            except Exception as e:  # noqa: BLE001
                log.info("cg stream source: not closed cleanly (%s)", e)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5.0)
