"""Member consumers, as orbit ``pcgroups`` (v0.2) creates them: one per member, on the
work-queue stream (elastic) or the origin (static durable ``<group>-<member>``), filtered to the
member's partitions, priority group ``PCG`` with ``pinned_client`` so one instance at a time
consumes it. :class:`MemberConsumers` builds, ensures and steps them down."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from typing import Any

from airflow_provider_cg.core.errors import ConfigError, ConsumerGroupError, JetStreamApiError
from airflow_provider_cg.core.groups import config as cgconfig
from airflow_provider_cg.core.groups import layouts
from airflow_provider_cg.core.groups import names as groupnames
from airflow_provider_cg.core.groups.config import GroupConfig
from airflow_provider_cg.core.groups.store import (
    ELASTIC,
    STATIC,
    GroupBroken,
    GroupInfo,
    GroupStore,
    consumer_name_of,
    consumer_stream_of,
    kind_of,
)
from airflow_provider_cg.core.jetstream.api import (
    ERR_CONSUMER_EXISTS,
    ERR_STREAM_NOT_FOUND,
    ERR_WQ_CONSUMER_NOT_UNIQUE,
)

PRIORITY_GROUP = "PCG"
DEFAULT_ACK_WAIT = 5.0  # seconds: orbit's default ack wait for the consumers it creates
IDLE_FACTOR = 1  # orbit (v0.2): an elastic member's inactive_threshold = ack_wait * 1
MIN_PRIORITY_TIMEOUT = 1.0  # seconds: orbit's pinned TTL is max(ack_wait, 1 s)
STATIC_ACK_WAIT = 60.0  # seconds: a static member job reads through its durable: room to land a batch
NS = 1_000_000_000
_ZERO_TS = "0001-01-01T00:00:00Z"


def static_max_ack_pending(batch_size: int) -> int:
    """``max_ack_pending`` of the static durable a member job creates: three of its batches."""
    return max(3 * batch_size, 1000)


def filters_of(consumer_config: dict) -> list[str]:
    subjects = consumer_config.get("filter_subjects") or []
    if not subjects and consumer_config.get("filter_subject"):
        subjects = [consumer_config["filter_subject"]]
    return list(subjects)


def priority_group_of(consumer_config: dict) -> str | None:
    """The pinned-client priority group of a member consumer: ``PCG`` (orbit v0.2, ours), or
    the member's own name (orbit v0.1 names the group after the member); ``None`` if the
    consumer has no pinned-client group."""
    groups = consumer_config.get("priority_groups") or []
    if consumer_config.get("priority_policy") != "pinned_client" or len(groups) != 1:
        return None
    return groups[0]


def is_member_consumer(consumer_config: dict) -> bool:
    return priority_group_of(consumer_config) is not None


def check_pinned(cstream: str, consumer_config: dict) -> None:
    if priority_group_of(consumer_config) is None:
        name = consumer_config.get("name") or consumer_config.get("durable_name")
        raise ConsumerGroupError(
            f"consumer {name!r} on {cstream!r} has the member's filters but no pinned_client priority "
            "group, so instances cannot exclude each other; delete it (or let orbit re-create it)"
        )


def pinned_id(info: dict | None) -> str | None:
    """The pin id of the instance pinned on a member consumer (its info), or None."""
    return pin_state(info or {})[0]


def pin_state(info: dict) -> tuple[str | None, str | None]:
    group = priority_group_of(info.get("config") or {}) or PRIORITY_GROUP
    for pg in info.get("priority_groups") or []:
        if pg.get("group") == group:
            pid = pg.get("pinned_client_id") or None
            ts = pg.get("pinned_ts")
            return pid, (ts if pid and ts and ts != _ZERO_TS else None)
    return None, None



def with_filters(consumer_config: dict, filters: Sequence[str]) -> dict:
    """A consumer config to re-create: the old settings, new filters, no server metadata."""
    cc = {k: v for k, v in consumer_config.items() if k not in ("filter_subject", "filter_subjects")}
    md = {k: v for k, v in (cc.get("metadata") or {}).items() if not k.startswith("_nats.")}
    if md:
        cc["metadata"] = md
    else:
        cc.pop("metadata", None)
    cc["filter_subjects"] = list(filters)
    return cc



class MemberConsumers:
    """Build, ensure and step down member consumers (of the groups ``store`` keeps)."""

    def __init__(self, store: GroupStore, *, overlap_deadline: float) -> None:
        self.store, self.api, self.overlap_deadline = store, store.api, overlap_deadline

    async def member_consumers(self, info: GroupInfo, cstream: str) -> dict[str, dict]:
        """member -> consumer info, for every member consumer of the group that exists."""
        out: dict[str, dict] = {}
        try:
            consumers = await self.api.list_consumers(cstream)
        except JetStreamApiError as e:
            if e.err_code == ERR_STREAM_NOT_FOUND:
                return out
            raise
        durables = {consumer_name_of(STATIC, info.group, m): m for m in cgconfig.current_members(info.config)}
        for c in consumers:
            name, ccfg = c.get("name", ""), c.get("config", {})
            if not is_member_consumer(ccfg):
                continue
            if info.kind == ELASTIC:
                out[name] = c
            elif name in durables:  # never another group's durable that shares the prefix
                out[durables[name]] = c
        return out


    def member_consumer_config(
        self,
        stream: str,
        group: str,
        member: str,
        config: GroupConfig,
        *,
        ack_wait: float = DEFAULT_ACK_WAIT,
        max_ack_pending: int | None = None,
        layout: layouts.Layout | None = None,
    ) -> tuple[str, dict]:
        """``(consumer stream, raw consumer config)`` of a member, as orbit (v0.2) creates it.

        Elastic: what orbit's ``ElasticConsume`` creates for a user config of explicit acks and
        ``ack_wait`` (its default 5 s): name ``<member>``, the member's filters, priority group
        ``PCG`` with ``pinned_client``, priority timeout ``max(ack_wait, 1 s)``,
        ``inactive_threshold = ack_wait``, nothing else. The server compares a create-only
        request with an existing consumer field by field (after its defaults), so an orbit
        instance with the same ack wait finds this consumer equal and shares it through the pin.
        Static: the durable ``<group>-<member>`` with the same fields but no inactivity
        threshold (the server would delete the durable once idle, and a re-created one starts
        again at the stream's first message). ``max_ack_pending``, only when given (the job
        sizes a static durable for its batches; orbit's user config may carry one).
        """
        kind = kind_of(config)
        groupnames.validate_name("member", member, "member")
        if not cgconfig.in_membership(config, member):
            raise ConfigError("member", f"{member!r} is not a member of group {group!r} on stream {stream!r}")
        filters = (layout or layouts.named(layouts.DEFAULT)).member_filters(config, member,
                                                                           consumer_stream_of(kind, stream, group))
        if not filters:
            raise ConfigError("member", f"{member!r} gets no partitions (more members than max_members)")
        if not ack_wait > 0:
            raise ConfigError("ack_wait", "must be > 0 seconds")
        name = consumer_name_of(kind, group, member)
        cc: dict[str, Any] = {
            "name": name,
            "filter_subjects": filters,
            "ack_policy": "explicit",
            "deliver_policy": "all",
            "ack_wait": int(ack_wait * NS),
            "priority_groups": [PRIORITY_GROUP],
            "priority_policy": "pinned_client",
            "priority_timeout": int(max(ack_wait, MIN_PRIORITY_TIMEOUT) * NS),
        }
        if kind == STATIC:
            cc["durable_name"] = name
        else:
            cc["inactive_threshold"] = int(ack_wait * IDLE_FACTOR * NS)
        if max_ack_pending is not None:
            if max_ack_pending < 1:
                raise ConfigError("max_ack_pending", "must be >= 1")
            cc["max_ack_pending"] = int(max_ack_pending)
        return consumer_stream_of(kind, stream, group), cc

    async def ensure_member_consumer(
        self, stream: str, group: str, member: str, *, deadline: float | None = None,
        layout: layouts.Layout | None = None,
        **opts: Any
    ) -> tuple[str, str]:
        """Create the member's consumer (create-only) unless it exists with the right filters.

        An existing consumer with the member's current filters and a ``pinned_client``
        priority group is used as it is, whoever created it and with whatever ack wait or
        limits (an orbit instance's, say): replacing it would end the instance pinned on it.
        One with stale filters (membership changed) is deleted and re-created, as orbit does;
        an overlap with another member's consumer (10100) is retried until ``deadline``
        seconds. ``layout``: the group's, when the caller knows it (else read from the server).
        ``opts`` go to :meth:`member_consumer_config`.
        """
        info = await self.store.get(stream, group)
        layout = layout or await self.store.layout(info)
        cstream, cc = self.member_consumer_config(stream, group, member, info.config, layout=layout, **opts)
        try:
            await self.create_consumer(cstream, cc, info.kind, stream, group, member, deadline=deadline)
        except JetStreamApiError as e:
            if e.err_code != ERR_STREAM_NOT_FOUND:
                raise
            what = "work-queue" if info.kind == ELASTIC else "origin"
            raise GroupBroken(f"the {what} stream {cstream!r} of {info.kind} group {group!r} is missing (deleted?)") from None
        return cstream, cc["name"]

    async def create_consumer(
        self,
        cstream: str,
        cc: dict,
        kind: str,
        stream: str,
        group: str,
        member: str,
        *,
        deadline: float | None = None,
    ) -> None:
        """Create-only with the retries of orbit's tryCreateConsumer plus overlap backoff."""
        limit = time.monotonic() + (self.overlap_deadline if deadline is None else deadline)
        delay = 0.05
        while True:
            try:
                await self.api.create_consumer(cstream, cc, action="create")
                return
            except JetStreamApiError as e:
                if e.err_code == ERR_CONSUMER_EXISTS:
                    have = await self.api.consumer_info(cstream, cc["name"])
                    if have is not None and sorted(filters_of(have["config"])) == sorted(cc["filter_subjects"]):
                        check_pinned(cstream, have["config"])
                        return  # created by another instance of the member (ours or orbit's): use it
                    # stale filters: make sure ours are the current ones, then replace it
                    want = await self._wanted_filters(stream, group, member, cstream)
                    if not want:
                        raise ConfigError("member", f"{member!r} is no longer a member of group {group!r}") from None
                    cc = with_filters(cc, want)
                    if have is not None and sorted(filters_of(have["config"])) == sorted(want):
                        check_pinned(cstream, have["config"])
                        return
                    if kind == STATIC and have is not None:
                        # a re-created durable would start again at the stream's first message
                        raise ConfigError(
                            "member",
                            f"durable consumer {cc['name']!r} on {cstream!r} has other filters than the group "
                            "gives this member; delete it deliberately (re-creating it replays the stream)",
                        ) from None
                    await self.api.delete_consumer(cstream, cc["name"])
                    continue
                transient = e.code >= 500  # e.g. 10012 when a same-named consumer is being deleted
                if e.err_code != ERR_WQ_CONSUMER_NOT_UNIQUE and not transient:
                    raise
                if time.monotonic() >= limit:
                    if transient:
                        raise
                    raise ConsumerGroupError(
                        f"consumer {cc['name']!r} on {cstream!r}: its partitions are still held by another "
                        f"member's consumer (overlapping filters, 10100) after "
                        f"{self.overlap_deadline if deadline is None else deadline}s; a membership "
                        "transition may be stuck: run reconcile or check the other members"
                    ) from None
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, 1.0)
                # the membership (or the layout) may have changed while we waited
                want = await self._wanted_filters(stream, group, member, cstream)
                if not want:
                    raise ConfigError("member", f"{member!r} is no longer a member of group {group!r}") from None
                cc = with_filters(cc, want)

    async def _wanted_filters(self, stream: str, group: str, member: str, cstream: str) -> list[str]:
        info = await self.store.get(stream, group)
        return (await self.store.layout(info)).member_filters(info.config, member, cstream)

    async def step_down(self, stream: str, group: str, member: str) -> None:
        """Unpin the member's active instance; the server pins another waiting one."""
        info = await self.store.get(stream, group)
        cstream = consumer_stream_of(info.kind, stream, group)
        name = consumer_name_of(info.kind, group, member)
        have = await self.api.consumer_info(cstream, name)
        if have is None:
            raise ConfigError("member", f"{member!r} has no consumer (no running instance) to step down")
        try:
            await self.api.unpin(cstream, name, priority_group_of(have["config"]) or PRIORITY_GROUP)
        except JetStreamApiError as e:
            if e.code == 404:
                raise ConfigError("member", f"{member!r} has no consumer (no running instance) to step down") from None
            raise
