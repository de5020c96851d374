"""How far behind each member of a group is: its backlog and the age of its oldest pending
message (what users alert on), next to the pin holder. Read-only, no Airflow import.

An elastic member's pending messages are its partitions' messages in the work-queue stream
(acknowledged ones are deleted): the oldest is the first stored on ``<partition>.>``. A
static member's are the origin stream's messages after its consumer's ack floor on its
partitions' subjects. One direct get per partition with pending messages.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_cg.core.groups import layouts
from airflow_provider_cg.core.groups import names as groupnames
from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.status import GroupStatus, MemberState
from airflow_provider_cg.core.jetstream.api import DEFAULT_PREFIX, JsApi

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS


@dataclass
class MemberLag:
    member: str
    partitions: list[int]
    backlog: int
    num_ack_pending: int
    oldest_pending_age_s: float | None  # None: nothing pending
    pin_holder: str | None
    pinned_since: str | None
    active: bool  # its consumer exists
    by_partition: dict[str, dict] = field(default_factory=dict)  # "<p>" -> stored, oldest_pending_age_s


@dataclass
class GroupLag:
    stream: str
    group: str
    kind: str
    max_members: int
    backlog: int
    oldest_pending_age_s: float | None
    members: list[MemberLag] = field(default_factory=list)
    unassigned_partitions: list[int] = field(default_factory=list)
    source_lag: int | None = None
    source_stalled: str | None = None  # why its source is stalled (``sourcing.stalled``)
    sourcing_stopped: dict | None = None
    #: what the group's jobs found that no server state shows (``problems.py``), e.g. an origin that went back
    problems: dict[str, dict] = field(default_factory=dict)
    #: partition streams that are not current: "<p>" -> why (their backlog is not known)
    partition_problems: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def add_to(self, status: dict[str, Any]) -> dict[str, Any]:
        """A status dict (``GroupStatus.to_dict()``) with this lag's ages: the group's and each member's."""
        ages = {m.member: m.oldest_pending_age_s for m in self.members}
        return {**status, "oldest_pending_age_s": self.oldest_pending_age_s,
                "members": [{**m, "oldest_pending_age_s": ages.get(m["member"])} for m in status["members"]]}


def message_time(msg: dict) -> float:
    """Epoch seconds of a stored message's ``time`` (RFC 3339, nanoseconds)."""
    raw = msg["time"].replace("Z", "+00:00")
    head, _, rest = raw.partition(".")
    if rest:  # fromisoformat takes at most microseconds
        zone_at = next((i for i, c in enumerate(rest) if not c.isdigit()), len(rest))
        digits, zone = rest[:zone_at], rest[zone_at:]
        raw = f"{head}.{digits[:6].ljust(6, '0')}{zone}"
    return dt.datetime.fromisoformat(raw).timestamp()


def epoch_seconds(raw: Any) -> float | None:
    """Epoch seconds of a time as the server, the board or a summary writes it: RFC 3339
    (nanoseconds too; no zone: UTC), or a number of nanoseconds, microseconds, milliseconds or
    seconds since the epoch. None for nothing, or what is no time."""
    if raw is None or raw == "":
        return None
    text = str(raw).strip()
    if text.isdigit():
        n = int(text)
        for scale in (1e9, 1e6, 1e3, 1.0):  # the first that lands after 2001
            if n / scale > 1e9:
                return n / scale
        return float(n)
    zoned = "Z" in text or "+" in text[10:] or "-" in text[10:]
    try:
        return message_time({"time": text if zoned else text + "Z"})
    except ValueError:
        return None


def member_backlog(status: GroupStatus, member: MemberState) -> int:
    """Messages waiting for ``member``: its partitions' stored messages for an elastic group
    (the work queue holds only unacked ones), its consumer's pending + ack pending for a
    static group (the whole partition count while the consumer does not exist yet)."""
    if status.kind == "static" and member.consumer_exists:
        return int(member.num_pending + member.num_ack_pending)
    return int(member.backlog)


async def group_lag(nc: NATS, stream: str, group: str, *, js_prefix: str = DEFAULT_PREFIX,
                    now: float | None = None, status: GroupStatus | None = None) -> GroupLag:
    """The group's lag; ``status``: one the caller read already."""
    if status is None:
        status = await ConsumerGroups(nc, js_prefix=js_prefix).status(stream, group)
    api = JsApi(nc, prefix=js_prefix)
    now = time.time() if now is None else now
    oldest: dict[int, float] = {}
    if status.kind == "elastic":
        wq = groupnames.work_queue_stream(stream, group)
        layout = layouts.named(status.layout)
        for p, n in status.partitions.items():
            if n:  # the oldest is in the partition's store: its stream, if it has one that holds any
                msg = await layout.oldest(api, wq, p, status.partition_problems)
                if msg:
                    oldest[p] = message_time(msg)
    members = []
    for m in status.members:
        if not m.in_membership and not m.consumer_exists:
            continue
        if status.kind == "static" and m.consumer_exists and (m.num_pending or m.num_ack_pending):
            for p in m.partitions:
                msg = await api.next_msg(stream, m.ack_floor + 1, f"{p}.>")
                if msg:
                    oldest[p] = min(oldest.get(p, float("inf")), message_time(msg))
        times = [oldest[p] for p in m.partitions if p in oldest]
        members.append(MemberLag(
            member=m.member, partitions=list(m.partitions), backlog=member_backlog(status, m),
            num_ack_pending=m.num_ack_pending, oldest_pending_age_s=round(now - min(times), 3) if times else None,
            pin_holder=m.pinned_id, pinned_since=m.pinned_since, active=m.consumer_exists,
            by_partition={str(p): {"stored": int(status.partitions.get(p, 0)),
                                   "oldest_pending_age_s": round(now - oldest[p], 3) if p in oldest else None,
                                   **({"problem": status.partition_problems[p]}
                                      if p in status.partition_problems else {})}
                          for p in m.partitions}))
    ages = [x.oldest_pending_age_s for x in members if x.oldest_pending_age_s is not None]
    return GroupLag(stream=stream, group=group, kind=status.kind, max_members=status.max_members,
                    backlog=status.backlog, oldest_pending_age_s=max(ages) if ages else None, members=members,
                    unassigned_partitions=list(status.unassigned_partitions), source_lag=status.source_lag,
                    source_stalled=status.source_stalled, sourcing_stopped=status.sourcing_stopped,
                    problems=dict(status.problems),
                    partition_problems={str(p): why for p, why in sorted(status.partition_problems.items())})


async def all_groups_lag(nc: NATS, *, js_prefix: str = DEFAULT_PREFIX) -> list[GroupLag | dict]:
    """``group_lag`` of every group (a group that cannot be read: ``{"stream", "group", "error"}``)."""
    out: list[GroupLag | dict] = []
    for kind, stream, group in await ConsumerGroups(nc, js_prefix=js_prefix).list():
        try:
            out.append(await group_lag(nc, stream, group, js_prefix=js_prefix))
        except Exception as e:  # one broken group must not hide the others
            out.append({"stream": stream, "group": group, "kind": kind, "error": (str(e).splitlines() or [type(e).__name__])[0][:300]})
    return out
