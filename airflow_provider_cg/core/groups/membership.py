"""An elastic group's membership: add, drop or map members with compare-and-set on the KV
entry, then move the member consumers over (the transition the module ``admin`` describes).
Static groups' membership is fixed at creation, as in orbit."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Iterable
from typing import Any

import nats.js.errors

from airflow_provider_cg.core.errors import ConfigError, ConsumerGroupError
from airflow_provider_cg.core.groups import config as cgconfig
from airflow_provider_cg.core.groups import names as groupnames
from airflow_provider_cg.core.groups import partitioning
from airflow_provider_cg.core.groups import rules as grouprules
from airflow_provider_cg.core.groups.codec import dump_config
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, GroupConfig
from airflow_provider_cg.core.groups.consumers import (
    MemberConsumers,
    filters_of,
    pin_state,
    with_filters,
)
from airflow_provider_cg.core.groups.store import (
    ELASTIC,
    MAX_CONFIG_BYTES,
    STATIC,
    GroupInfo,
    GroupStore,
    consumer_name_of,
    consumer_stream_of,
    nats_errors,
)

TRANSITION_PAUSE = 0.5  # seconds, as the pcgroups design pauses
CAS_ATTEMPTS = 50
ASSIGNMENTS = ("block", "sticky")


def check_assignment(assignment: str) -> None:
    if assignment not in ASSIGNMENTS:
        raise ConfigError("assignment", f"must be one of {', '.join(ASSIGNMENTS)} (got {assignment!r})")


def sticky(cfg: GroupConfig, members: list[str]) -> GroupConfig:
    """``cfg`` with ``members`` assigned stickily (members left without a partition, when
    there are more members than partitions, are not in the mappings)."""
    members = list(dict.fromkeys(members))
    if not members:
        return cgconfig.with_members(cfg, [])
    assigned = partitioning.sticky_distribute(partitioning.assign_partitions(cfg), members, cfg.max_members)
    return cgconfig.with_mappings(cfg, {m: ps for m, ps in assigned.items() if ps})



def parse_members(field: str, value: Any) -> list[str]:
    """Member names from a string of comma-separated names or a list of them (each item may
    hold several, as ``--members a,b --members c`` gives); blanks dropped, at least one."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise ConfigError(field, "must be a list of member names")
    out: list[str] = []
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise ConfigError(f"{field}[{i}]", "must be a member name (a string)")
        out += [m.strip() for m in item.split(",") if m.strip()]
    if not out:
        raise ConfigError(field, "give at least one member name")
    for i, m in enumerate(out):
        groupnames.validate_name(f"{field}[{i}]", m, "member")
    return out


def parse_mappings(value: Any) -> list:
    """Mappings from JSON text, a list of ``{"member", "partitions"}`` or ``{member: [p...]}``."""
    if isinstance(value, (str, bytes)):
        if len(value) > MAX_CONFIG_BYTES:
            raise ConfigError("member_mappings", f"longer than {MAX_CONFIG_BYTES} bytes")
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise ConfigError("member_mappings", 'not valid JSON (expected [{"member": ..., "partitions": [...]}])') from None
    if isinstance(value, dict):
        value = [{"member": k, "partitions": v} for k, v in value.items()]
    if not isinstance(value, list | tuple):
        raise ConfigError("member_mappings", 'expected a list of {"member": ..., "partitions": [...]}')
    out = []
    for i, item in enumerate(value):
        where = f"member_mappings[{i}]"
        if isinstance(item, cgconfig.MemberMapping):
            out.append(item)
            continue
        if not isinstance(item, dict) or "member" not in item or not isinstance(item.get("partitions"), list):
            raise ConfigError(where, 'each mapping needs "member" and a "partitions" list')
        unknown = set(item) - {"member", "partitions"}
        if unknown:
            raise ConfigError(f"{where}.{sorted(map(str, unknown))[0]}", "unknown key")
        if not isinstance(item["member"], str):
            raise ConfigError(f"{where}.member", "must be a member name (a string)")
        groupnames.validate_name(f"{where}.member", item["member"], "member")
        if not all(isinstance(p, int) and not isinstance(p, bool) for p in item["partitions"]):
            raise ConfigError(f"{where}.partitions", "must be a list of integers")
        out.append(cgconfig.MemberMapping(member=item["member"], partitions=tuple(item["partitions"])))
    return out


class Membership:
    """Membership changes of elastic groups and the consumer transition after each."""

    def __init__(self, store: GroupStore, consumers: MemberConsumers, *, transition_pause: float) -> None:
        self.store, self.consumers, self.api = store, consumers, store.api
        self.transition_pause = transition_pause

    async def add_members(self, stream: str, group: str, members: Iterable[str], *,
                          assignment: str = "block") -> GroupInfo:
        """Add members. ``assignment="sticky"`` moves only the partitions the new members
        take (stored as orbit-readable ``member_mappings``); ``"block"`` re-distributes the
        members' contiguous blocks (orbit's own ``members``)."""
        members = parse_members("members", members)
        check_assignment(assignment)

        def change(cfg: GroupConfig) -> GroupConfig:
            if assignment == "sticky":
                return sticky(cfg, [*cgconfig.current_members(cfg), *members])
            if cfg.member_mappings:
                raise ConfigError("members", "the group uses member_mappings; delete them before adding members "
                                             "(or add with assignment 'sticky')")
            return cgconfig.with_members(cfg, list(dict.fromkeys([*cfg.members, *members])))

        return await self._change_membership(stream, group, change, "members")

    async def drop_members(self, stream: str, group: str, members: Iterable[str], *,
                           assignment: str = "block") -> GroupInfo:
        """Drop members (``assignment`` as for :meth:`add_members`: sticky moves only the
        dropped members' partitions)."""
        members = parse_members("members", members)
        check_assignment(assignment)

        def change(cfg: GroupConfig) -> GroupConfig:
            if assignment == "sticky":
                return sticky(cfg, [m for m in cgconfig.current_members(cfg) if m not in set(members)])
            if cfg.member_mappings:
                raise ConfigError("members", "the group uses member_mappings; delete them before dropping members "
                                             "(or drop with assignment 'sticky')")
            return cgconfig.with_members(cfg, [m for m in cfg.members if m not in set(members)])

        return await self._change_membership(stream, group, change, "members")

    async def set_mappings(self, stream: str, group: str, mappings: Any) -> GroupInfo:
        """Replace the membership with explicit member -> partitions mappings."""
        parsed = parse_mappings(mappings)
        if not parsed:
            raise ConfigError("member_mappings", "give at least one mapping (delete_mappings removes them)")
        for m in parsed:
            groupnames.validate_name("member", m.member, "member")
        return await self._change_membership(
            stream, group, lambda cfg: cgconfig.with_mappings(cfg, parsed), "member_mappings"
        )

    async def delete_mappings(self, stream: str, group: str) -> GroupInfo:
        """Remove the mappings (the group then has no members until some are added)."""
        return await self._change_membership(
            stream, group, lambda cfg: cgconfig.with_mappings(cfg, []), "member_mappings"
        )

    async def _change_membership(
        self, stream: str, group: str, change: Callable[[GroupConfig], GroupConfig], what: str
    ) -> GroupInfo:
        """Read, change, validate, compare-and-set (retried on conflict), then transition."""
        for attempt in range(CAS_ATTEMPTS):
            info = await self.store.get(stream, group)
            if info.kind == STATIC:
                raise ConfigError(
                    what, "a static group's membership is fixed at creation; delete and re-create the group"
                )
            new = change(info.config)
            new.validate()
            grouprules.check_change(info.config, new)
            if dump_config(new) == dump_config(info.config):
                return info  # nothing to change
            kv = await self.store.existing_kv(info.kind)
            async with nats_errors():
                try:
                    revision = await kv.update(groupnames.config_key(stream, group), dump_config(new), last=info.revision)
                except nats.js.errors.KeyWrongLastSequenceError:
                    await asyncio.sleep(random.uniform(0.005, 0.02 * (attempt + 1)))
                    continue
            # A consumer with a pinned instance is left to that instance: it sees the change,
            # lands its batch in flight and hands the consumer over itself (graceful revoke).
            await self.reconcile(stream, group, leave_pinned=True)
            return GroupInfo(info.kind, new, revision, stream, group)
        raise ConsumerGroupError(f"could not update {stream}.{group}: {CAS_ATTEMPTS} concurrent changes in a row")

    async def write_partition_count(self, stream: str, group: str, new: ElasticGroupConfig, last: int) -> int:
        """Store a config whose ``max_members`` changed (only ``resize`` may: it has stopped and
        drained the work queue first), compare-and-set on revision ``last``; the new revision."""
        new.validate(stream, group)
        kv = await self.store.existing_kv(ELASTIC)
        async with nats_errors():
            try:
                return await kv.update(groupnames.config_key(stream, group), dump_config(new), last=last)
            except nats.js.errors.KeyWrongLastSequenceError:
                raise ConsumerGroupError(f"the config of {stream}.{group} changed while resizing; run the resize "
                                         "again") from None

    async def reconcile(
        self, stream: str, group: str, *, pause: float | None = None, leave_pinned: bool = False
    ) -> dict[str, list[str]]:
        """Bring the member consumers in line with the stored membership (see module doc).

        ``leave_pinned``: skip consumers that have a pinned instance (it follows the config
        itself and hands its consumer over once its batch in flight has landed; if it died, the
        consumer idles out after its inactivity threshold). Returns the consumers it
        ``deleted`` and ``recreated``.
        """
        pause = self.transition_pause if pause is None else pause
        if (await self.store.get(stream, group)).kind == STATIC:
            raise ConfigError(
                "group", "only elastic groups are reconciled: a static member's durable consumer keeps its "
                "position and is never re-created"
            )
        had: dict[str, dict] = {}  # member -> its consumer's config before we deleted it
        deleted: list[str] = []
        for _ in range(10):
            info = await self.store.get(stream, group)
            cstream = consumer_stream_of(info.kind, stream, group)
            layout = await self.store.layout(info)
            existing = await self.consumers.member_consumers(info, cstream)
            stale = [
                (m, c)
                for m, c in existing.items()
                if sorted(filters_of(c["config"])) != sorted(layout.member_filters(info.config, m, cstream))
                and not (leave_pinned and pin_state(c)[0])
            ]
            for member, c in stale:
                await self.api.delete_consumer(cstream, c["name"])
                had.setdefault(member, c["config"])
                deleted.append(c["name"])
            todo = {m: cfg for m, cfg in had.items() if cgconfig.in_membership(info.config, m)}
            todo = {m: cfg for m, cfg in todo.items() if layout.member_filters(info.config, m, cstream)}
            if stale and todo:
                await asyncio.sleep(pause)
            for member, old in todo.items():
                filters = layout.member_filters(info.config, member, cstream)
                await self.consumers.create_consumer(cstream, with_filters(old, filters), info.kind, stream, group, member)
            latest = await self.store.get(stream, group)
            if latest.revision == info.revision:
                break
        recreated = sorted(consumer_name_of(info.kind, group, m) for m in todo)
        return {"deleted": deleted, "recreated": recreated}
