"""The origin checked, not trusted: a table's position is compared with what the origin holds.

Exactly-once rests on ``(origin_stream, origin_seq)`` naming one message forever. A store that
comes back older (a power loss under nats-server's lazy fsync, a restored disk or VM snapshot)
breaks that: the stream keeps its creation time, its last sequence goes back to some R, and the
next messages published take the sequences of the lost ones. A table that landed the lost ones
would drop the new ones as duplicates, and the group would acknowledge them: gone.

So the table remembers the origin (``stream_life.OriginMark``): each committed batch records the
origin's last message it read, with the time the origin stored it (read from the origin itself,
not from the work queue's copy, whose content it must equal). Before a job reads, and before
each batch is marked acking (after which it is acknowledged), ``OriginGuard`` asks the origin
for the message at the table's highest mark: the same stored time means the origin still holds
everything up to there (a store that went back below it would have lost or replaced it). A
different message there, or a stream that ends below it, means the origin went back, to the
last sequence stored before the first message stored after the mark's time (messages published
after a restart are stored after every lost one): ``OriginWentBack``, exit 1, nothing
acknowledged or written, naming R, the landed messages the origin lost, and the way forward
(``--stream-life went-back:<R>``: the messages from R + 1 land under a life key of their own).

Like Kafka's leader epochs (KIP-320), this is a check at every fetch boundary, cheap enough for
every batch: one message get of the origin per batch, plus one for the batch's own mark when it
was read from a work queue, the two at once before the batch is prepared (checked again before
its acking mark if the connection was made again meanwhile). What it does not see: a rollback that happened and was undone between
two checks (nothing was acknowledged meanwhile), a mark whose message the origin's limits
removed (``max_age``, ``max_msgs``: then the stream's end and later marks still tell), and a
server clock set back so far that new messages sort before lost ones (then the refusal says it
cannot tell where the origin went back).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.groups import layouts
from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig
from airflow_provider_cg.core.groups.names import work_queue_stream
from airflow_provider_cg.core.groups.sourcing import passed_without
from airflow_provider_cg.core.jetstream.api import JsApi, rfc3339, stored_ns
from airflow_provider_cg.core.landing.stream_life import (
    FIELD,
    WENT_BACK,
    LifeChoice,
    OriginKeys,
    OriginMark,
    origin_created,
    origin_keys,
    to_record,
)

if TYPE_CHECKING:
    from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import TwoPhaseSink

log = logging.getLogger("airflow_provider_cg.landing")

#: landed messages counted one by one when a refusal says how many the origin lost
COUNT_LIMIT = 2_000_000


@dataclass(frozen=True)
class WentBack:
    """What ``find_went_back`` saw: the table's ``mark`` is not in the origin any more; the
    origin now ends at ``last_seq`` and holds the table's messages up to ``to_seq`` (None: its
    stored times do not say), the first message after it stored at ``first_new_ns``; ``lost``:
    the table's landed messages after ``to_seq`` (None: not counted)."""

    stream: str
    mark: OriginMark
    to_seq: int | None
    last_seq: int
    first_new_ns: int | None = None
    lost: int | None = None
    #: the group read past ``to_seq`` on the older messages and would never take the new ones: the
    #: command that moves it back first (``sourcing.passed_without``)
    move_back: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """As ``cg status`` and the page show it (``groups/problems.py``)."""
        return {"stream": self.stream, "went_back_to": self.to_seq, "table_position": self.mark.seq,
                "table_key": self.mark.key, "landed_at": rfc3339(self.mark.ts), "origin_last_seq": self.last_seq,
                "first_new_at": rfc3339(self.first_new_ns) if self.first_new_ns else None,
                "lost_messages": self.lost, "move_back": self.move_back,
                "way_forward": f"--stream-life went-back:{self.to_seq}" if self.to_seq is not None else None}


class OriginWentBack(ConfigError):
    """The origin no longer holds what the table landed: nothing was acknowledged or written."""

    def __init__(self, went: WentBack) -> None:
        self.went = went
        m = went.mark
        if went.to_seq is None:
            where = (f"its message at {m.seq} is not the one this table landed (stored {rfc3339(m.ts)}), and its stored "
                     "times do not say where it went back (a server clock set back?): find the last sequence that is "
                     "still the table's, then --stream-life went-back:<that sequence>")
            super().__init__(FIELD, f"origin stream {went.stream!r} went back: {where}; nothing was acknowledged "
                                    "or written")
            return
        lost = (f"{went.lost:,} landed message{'s' if went.lost != 1 else ''} ({went.to_seq + 1}-{m.seq})"
                if went.lost is not None else f"the landed messages {went.to_seq + 1}-{m.seq}")
        since = (f"; its messages from {went.to_seq + 1} on are others, stored since {rfc3339(went.first_new_ns)}"
                 if went.first_new_ns else f"; it ends at {went.last_seq}")
        super().__init__(FIELD, (
            f"origin stream {went.stream!r} went back to sequence {went.to_seq}: this table landed its messages up to "
            f"{m.seq} (the last stored at {rfc3339(m.ts)}){since}. {lost[0].upper() + lost[1:]} are no longer in "
            "the stream (its server came back on an older copy of its store: a power loss under lazy fsync, a "
            "restored disk or snapshot); nothing was acknowledged or written. To land the messages published since "
            "beside the old ones, as a life of their own: "
            + (f"first {went.move_back} (the group read past {went.to_seq} on the older messages, so it would never "
               "take the new ones), then " if went.move_back else "")
            + f"--stream-life went-back:{went.to_seq} (operator: stream_life=\"went-back:{went.to_seq}\")"))


async def find_went_back(api: JsApi, stream: str, mark: OriginMark) -> WentBack | None:
    """Whether the origin still holds ``mark``'s message (None), else what it holds instead."""
    if mark.seq < 1:
        return None
    msg = await api.get_msg(stream, mark.seq)
    if msg is not None and stored_ns(msg) == mark.ts:
        return None
    after, info = await asyncio.gather(api.msg_after_time(stream, mark.ts + 1), api.stream_info(stream))
    last = int((info.get("state") or {}).get("last_seq") or 0)
    new_at = int(after["seq"]) if after is not None else None
    if msg is None and last >= mark.seq and (new_at is None or new_at > mark.seq):
        return None  # removed by the stream's limits or a purge, not replaced: nothing says it went back
    if new_at is not None and new_at <= mark.seq:
        return WentBack(stream, mark, new_at - 1, last, stored_ns(after) if after else None)
    return WentBack(stream, mark, last if msg is None else None, last)


async def group_past(api: JsApi, stream: str, group: str, seq: int) -> str | None:
    """The ``cg reset`` that moves ``group`` back to ``seq + 1`` when it read past ``seq`` on
    the origin's older messages (its sourcing, or a static member's durable, went past without
    the new ones): the messages published after the origin went back would never reach it."""
    groups = ConsumerGroups(api.nc, js_prefix=api.prefix)
    status = await groups.status(stream, group)
    cfg = (await groups.get(stream, group)).config
    if isinstance(cfg, ElasticGroupConfig):
        name = layouts.named(status.layout).sourcing_stream(work_queue_stream(stream, group))
        past = await passed_without(api, name, stream, seq, [f.filter for f in cfg.partitioning_filters])
    else:
        past = max((m.ack_floor for m in status.members if m.consumer_exists), default=0)
        past = past if past > seq else None
    return None if past is None else f"cg reset {stream} {group} --to-seq {seq + 1} --execute"


class OriginGuard:
    """One writer's check of its origin (see the module docstring): ``keys`` say where the
    origin's messages land; ``reads_origin``: the rows read carry the origin's stored time
    (a static group, a backfill), else each batch's mark is read from the origin."""

    def __init__(self, api: JsApi, sink: TwoPhaseSink, stream: str, keys: OriginKeys, reads_origin: bool) -> None:
        self.api, self.sink, self.stream, self.keys, self.reads_origin = api, sink, stream, keys, reads_origin
        self._reconnects = 0  # the connection's reconnects when the last check began
        self._reads = ThreadPoolExecutor(1, thread_name_prefix="cg-origin-guard")

    @classmethod
    async def open(cls, api: JsApi, sink: TwoPhaseSink, stream: str, choice_text: str | None, *,
                   reads_origin: bool, group: str | None = None) -> OriginGuard:
        """The origin's life in ``sink`` (recorded if new, ``stream_life.py``) and checked:
        ``OriginWentBack`` unless the table's marks are still the origin's, or ``choice_text``
        (``--stream-life``) is ``went-back:<R>`` with the R found, which records the life after
        it, once ``group`` (its members' position) is sure to take the messages after R."""
        choice = LifeChoice.parse(choice_text)
        created = await origin_created(api, stream)
        # checked before anything is recorded: a life said to continue the table's is checked too
        lives = await asyncio.to_thread(sink.stream_lives, stream)
        guard = cls(api, sink, stream, origin_keys(stream, created, [*lives, *to_record(stream, created, lives, choice)]),
                    reads_origin)
        went = await guard.went_back()
        if went is not None and went.to_seq is not None and group is not None:
            went = replace(went, move_back=await group_past(api, stream, group, went.to_seq))
        if went is not None and (choice is None or choice.mode != WENT_BACK or went.to_seq != choice.seq
                                 or went.move_back is not None):
            raise OriginWentBack(await guard.counted(went))
        guard.keys = await asyncio.to_thread(sink.stream_life, stream, created, choice)
        if went is not None and went.to_seq is not None and choice is not None:
            anchor = await guard.anchor_at(went.to_seq)
            guard.keys = await asyncio.to_thread(sink.stream_life, stream, created, replace(choice, anchor=anchor))
            log.warning("cg origin %s went back to %d: its messages from %d on land under %s", stream, went.to_seq,
                        went.to_seq + 1, guard.keys.current)
            if (again := await guard.went_back()) is not None:
                raise OriginWentBack(await guard.counted(again))
        return guard

    async def went_back(self) -> WentBack | None:
        """The check: the table's highest mark of the current life (else the life's anchor)."""
        # on a thread of its own: not queued behind the batches' prepares in the default pool
        mark = await asyncio.get_running_loop().run_in_executor(
            self._reads, self.sink.origin_mark, self.keys.current) or self.keys.anchor
        return None if mark is None else await find_went_back(self.api, self.stream, mark)

    async def check(self) -> None:
        """``OriginWentBack`` if the origin went back since the table's last commit."""
        self._reconnects = self._reconnect_count()
        went = await self.went_back()
        if went is not None:
            raise OriginWentBack(await self.counted(went))

    async def confirm(self, checked: asyncio.Task | None = None) -> None:
        """Before a batch's acking mark: ``checked`` (a ``check`` started with the batch) or a
        check now, and another if the connection was made again since it began (a server that
        restarted may have come back older)."""
        if checked is None:
            await self.check()
            return
        await checked
        if self._reconnect_count() != self._reconnects:
            await self.check()

    def _reconnect_count(self) -> int:
        stats = getattr(self.api.nc, "stats", None) or {}
        return int(stats.get("reconnects", 0))

    async def anchor_at(self, seq: int) -> OriginMark:
        """The origin's message at ``seq`` as a mark (the last one a rollback left the table)."""
        key = self.keys.key_of(max(seq, 1))
        if seq < 1:
            return OriginMark(key, 0, 0)
        msg = await self.api.get_msg(self.stream, seq)
        if msg is None:
            raise ConfigError(FIELD, f"origin stream {self.stream!r} has no message at {seq} any more to mark where it "
                                     "went back; nothing was acknowledged or written")
        return OriginMark(key, seq, stored_ns(msg))

    async def counted(self, went: WentBack) -> WentBack:
        """``went`` with the landed messages the origin lost counted from the table."""
        if went.to_seq is None or went.mark.seq - went.to_seq > COUNT_LIMIT:
            return went
        seqs = np.arange(went.to_seq + 1, went.mark.seq + 1, dtype=np.int64)
        held = await asyncio.to_thread(self.sink.committed_keys_exist, went.mark.key, seqs)
        return replace(went, lost=int(np.count_nonzero(held)))

    async def mark_of(self, inputs: pa.Table) -> OriginMark | None:
        """The mark a batch read as ``inputs`` records: its highest origin sequence, stored when
        the origin says (None: the origin's limits removed it already). A message the origin
        holds otherwise than the group gave it is an origin that went back (``OriginWentBack``)."""
        if inputs.num_rows == 0:
            return None
        seqs = inputs.column("origin_seq").to_numpy()
        i = int(np.argmax(seqs))
        seq = int(seqs[i])
        key = self.keys.key_of(seq)
        names = inputs.column_names
        if self.reads_origin and "timestamp" in names:
            return OriginMark(key, seq, int(inputs.column("timestamp").cast(pa.int64())[i].as_py()))
        msg = await self.api.get_msg(self.stream, seq)
        if msg is None:
            return None
        if "payload" in names and inputs.column("payload")[i].as_py() != base64.b64decode(msg.get("data") or b""):
            # the group's copy (sourced before) is not the origin's message: the origin went back
            read_at = int(inputs.column("timestamp").cast(pa.int64())[i].as_py())
            went = await find_went_back(self.api, self.stream, OriginMark(key, seq, read_at))
            raise OriginWentBack(went or WentBack(self.stream, OriginMark(key, seq, read_at), None, seq))
        return OriginMark(key, seq, stored_ns(msg))
