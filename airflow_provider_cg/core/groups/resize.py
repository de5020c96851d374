"""Changing an elastic group's partition count (``max_members``) with no message lost,
duplicated or landed out of per-key order. orbit refuses any such change and Kafka can only add
partitions, breaking per-key order when it does; here keys move between partitions, so every
message of a key sourced before the change lands before any sourced after it:

1. *stop*: the work queue's sourcing stops at a cut (``sourcing.py``), recorded on the stream;
2. *drain*: the members' jobs land what the work queue holds (old numbering) while the tool
   waits until it is empty (``drain_timeout``; running the same resize again goes on waiting);
3. *switch*: the group's config gets the new count (compare-and-set; orbit's JSON), stale member
   consumers are deleted; running jobs see their partitions change and go on with the new
   ones, and their fences carry the new count, so each member's first pin holder finishes any
   write left prepared under the old numbering before it lands anything;
4. *resume*: sourcing starts again after the cut, with the new partition transform.

A resize killed part way is finished by running it again (the stop records the new count).
orbit's instances stop when ``max_members`` changes: stop them before, start them after.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_cg.core.errors import ConfigError, ConsumerGroupError
from airflow_provider_cg.core.groups import config as cgconfig
from airflow_provider_cg.core.groups import names as groupnames
from airflow_provider_cg.core.groups import partitioning, sourcing
from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.jetstream.api import JsApi

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from airflow_provider_cg.core.groups.store import GroupInfo

DRAIN_TIMEOUT = 300.0


class ResizeIncomplete(ConsumerGroupError):
    """The work queue did not drain in time; the same resize, run again, goes on."""


@dataclass
class ResizePlan:
    """What a resize does (or did): partitions per member before and after, what is left to land
    under the old numbering, and where sourcing stopped."""

    stream: str
    group: str
    max_members: int  # now
    new_max_members: int
    partitions: dict[str, list[int]]  # member -> partitions now
    new_partitions: dict[str, list[int]]  # member -> partitions after
    backlog: int  # messages the work queue holds now: landed before the switch
    in_progress: bool = False  # a resize to new_max_members stopped sourcing already
    cut: int | None = None  # the origin sequence sourcing stopped after
    state: str = "planned"  # planned | done

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class GroupResize:
    """Plans and executes resizes on one connection (see the module doc)."""

    def __init__(self, nc: NATS, js_prefix: str = "$JS.API") -> None:
        self.groups = ConsumerGroups(nc, js_prefix=js_prefix)
        self.api = JsApi(nc, prefix=js_prefix)

    async def _target(self, stream: str, group: str, max_members: int, mappings: Any
                      ) -> tuple[GroupInfo, cgconfig.ElasticGroupConfig, sourcing.Stopped | None]:
        info = await self.groups.get(stream, group)
        if not isinstance(info.config, cgconfig.ElasticGroupConfig):  # the elastic kind's config
            raise ConfigError("group", f"{group!r} is a static group: its partitions are in the origin's subjects, "
                              "fixed by the stream's subject transform")
        if isinstance(max_members, bool) or not isinstance(max_members, int) or max_members < 1:
            raise ConfigError("max_members", f"must be an integer >= 1 (got {max_members!r})")
        (await self.groups.layout(info)).check_repartition("resize", stream, group)
        cfg: cgconfig.ElasticGroupConfig = info.config
        stopped = await sourcing.current_stop(self.api, groupnames.work_queue_stream(stream, group))
        intent = stopped.intent if stopped is not None else {}
        resized = intent.get("op") == "resize"
        if resized and intent.get("max_members") != max_members:
            raise ConfigError("max_members", f"a resize to {intent.get('max_members')} partitions is in "
                              "progress: run it again to finish it first")
        if cfg.max_members == max_members and not resized:
            raise ConfigError("max_members", f"the group has {max_members} partitions already")
        if mappings is None and resized and intent.get("mappings") is not None:
            mappings = intent["mappings"]
        if mappings is not None:
            from airflow_provider_cg.core.groups.membership import parse_mappings

            new = cgconfig.with_mappings(dataclasses.replace(cfg, max_members=max_members), parse_mappings(mappings))
        elif cfg.member_mappings and cfg.max_members != max_members:
            raise ConfigError("mappings", "the group maps members to partitions explicitly: give the mappings for "
                              f"{max_members} partitions")
        else:
            new = dataclasses.replace(cfg, max_members=max_members).validate(stream, group)
        return info, new, stopped if resized else None

    async def plan(self, stream: str, group: str, max_members: int, mappings: Any = None) -> ResizePlan:
        info, new, stopped = await self._target(stream, group, max_members, mappings)
        wq = groupnames.work_queue_stream(stream, group)
        backlog = int((await self.api.stream_info(wq))["state"].get("messages", 0))
        cur = info.config
        switched = cur.max_members == max_members  # an interrupted resize got past its switch
        return ResizePlan(
            stream, group, int(stopped.intent["from"]) if switched and stopped else cur.max_members, max_members,
            {} if switched else partitioning.assign_partitions(cur), partitioning.assign_partitions(new), backlog,
            in_progress=stopped is not None, cut=stopped.cut if stopped else None)

    async def execute(self, stream: str, group: str, max_members: int, mappings: Any = None, *,
                      drain_timeout: float = DRAIN_TIMEOUT) -> ResizePlan:
        """Stop, drain, switch, resume (see the module doc). If the work queue does not drain
        within ``drain_timeout`` seconds: ``ResizeIncomplete``, sourcing stays stopped, and
        running the same resize again goes on from there."""
        plan = await self.plan(stream, group, max_members, mappings)
        info, new, stopped = await self._target(stream, group, max_members, mappings)
        wq = groupnames.work_queue_stream(stream, group)
        if stopped is None:
            stopped = await sourcing.stop(self.api, wq, {
                "op": "resize", "from": info.config.max_members, "max_members": max_members,
                "mappings": None if mappings is None else [asdict(m) for m in new.member_mappings]})
        plan.in_progress, plan.cut = True, stopped.cut
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_timeout
        while True:
            left = int((await self.api.stream_info(wq))["state"].get("messages", 0))
            plan.backlog = left
            if left == 0:
                break
            if loop.time() > deadline:
                raise ResizeIncomplete(
                    f"the work queue still holds {left} message(s) of the old partitions after {drain_timeout:.0f}s "
                    f"(the members' jobs land them); sourcing stays stopped after origin sequence {stopped.cut}: "
                    "run the same resize again to finish it")
            await asyncio.sleep(0.25)
        if info.config.max_members != max_members:
            await self.groups.write_partition_count(stream, group, new, info.revision)
        await self.groups.reconcile(stream, group, leave_pinned=True)
        await sourcing.resume(self.api, wq, stopped, stopped.cut + 1,
                              subject_transforms=self.groups.wq_stream_config(stream, group, new, {})
                              ["sources"][0]["subject_transforms"])
        plan.state = "done"
        return plan
