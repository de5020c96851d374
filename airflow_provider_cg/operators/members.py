"""The fan-out of a consumer group: one dict per member to map a Spark task over.

``ConsumerGroupMembersOperator`` returns one dict per member (``member``, ``partitions``,
``backlog``) for ``ConsumerGroupSparkSubmitOperator.partial(...).expand_kwargs(...)``::

    members = ConsumerGroupMembersOperator(task_id="members", stream="ORDERS", group="lake")
    ConsumerGroupSparkSubmitOperator.partial(
        task_id="consume", stream="ORDERS", group="lake", sink_path="/data/lake/orders",
    ).expand_kwargs(members.output)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_cg.core.errors import ConfigError, GroupNotFound
from airflow_provider_cg.core.groups import names as groupnames
from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.lag import member_backlog
from airflow_provider_cg.hooks.nats import NatsHook
from airflow_provider_cg.lineage import MovesNoData

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from airflow_provider_cg.core.groups.status import GroupStatus

__all__ = ["ConsumerGroupMembersOperator", "member_states"]

UI_COLOR = "#fce5cd"
#: how long to wait, at most, for an elastic group's work queue to catch up with its origin
#: (sourcing is asynchronous) before the backlogs are read; settled queues end the wait at once
SETTLE_TIMEOUT = 30.0


def templated(value: Any) -> bool:
    """Whether a value holds a Jinja template (in a dict's or list's items too)."""
    if isinstance(value, dict):
        return any(templated(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(templated(v) for v in value)
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def member_states(hook: NatsHook, stream: str, group: str) -> Any:
    """``ConsumerGroups.status`` of the group (one connection)."""

    async def go(nc: NATS) -> GroupStatus:
        return await ConsumerGroups(nc).status(stream, group)

    return hook.run(go)


def settled_states(hook: NatsHook, stream: str, group: str, settle_timeout: float) -> Any:
    """``member_states``; for an elastic group, first wait (at most ``settle_timeout``) until
    its work queue has caught up with the origin stream: source lag 0 and the size unchanged
    for 0.5 s. (Sourcing is asynchronous: right after a publish the lag can still read 0.)"""
    status = member_states(hook, stream, group)
    deadline = time.monotonic() + settle_timeout
    while status.kind == "elastic" and time.monotonic() < deadline:
        time.sleep(0.5)
        again = member_states(hook, stream, group)
        settled = again.source_lag in (0, None) and again.backlog == status.backlog
        status = again
        if settled:
            break
    return status


def member_fanout(
    stream: str, group: str, nats_conn_id: str = NatsHook.default_conn_name,
    settle_timeout: float = SETTLE_TIMEOUT,
) -> list[dict[str, Any]]:
    """``[{"member", "partitions", "backlog"}, ...]`` for the group's current members (sync).

    ``settle_timeout`` > 0: first wait (at most that long) until an elastic group's work
    queue has caught up with the origin stream (source lag 0, size unchanged for 0.5 s), so
    the backlogs are complete right after the group was created or messages published.
    """
    return fanout_of(settled_states(NatsHook(nats_conn_id=nats_conn_id), stream, group, settle_timeout))


def fanout_of(status: Any) -> list[dict[str, Any]]:
    return [
        {"member": m.member, "partitions": list(m.partitions), "backlog": member_backlog(status, m)}
        for m in status.members
        if m.in_membership and m.partitions
    ]


class ConsumerGroupMembersOperator(MovesNoData, BaseOperator):
    """Return one dict per member (``member``, ``partitions``, ``backlog``) to map over.

    Members without partitions (more members than partitions) are left out; so is any
    consumer not in the membership. ``only_with_backlog=True`` also drops idle members.
    """

    template_fields: Sequence[str] = ("stream", "group", "nats_conn_id")
    ui_color = UI_COLOR

    def __init__(
        self,
        *,
        stream: str,
        group: str,
        nats_conn_id: str = NatsHook.default_conn_name,
        only_with_backlog: bool = False,
        settle_timeout: float = SETTLE_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.stream, self.group, self.nats_conn_id = stream, group, nats_conn_id
        self.only_with_backlog = only_with_backlog
        self.settle_timeout = settle_timeout
        for field in ("stream", "group"):
            if not templated(getattr(self, field)):
                groupnames.validate_name(field, getattr(self, field), field)

    @cached_property
    def hook(self) -> NatsHook:
        return NatsHook(nats_conn_id=self.nats_conn_id)


    def execute(self, context: Any) -> list[dict[str, Any]]:
        try:
            groupnames.validate_name("stream", self.stream, "stream")
            groupnames.validate_name("group", self.group, "group")
            status = settled_states(self.hook, self.stream, self.group, self.settle_timeout)
        except (ConfigError, GroupNotFound) as e:
            raise AirflowFailException(str(e)) from e
        members = fanout_of(status)
        if self.only_with_backlog:
            members = [m for m in members if m["backlog"] > 0]
        for m in members:
            self.log.info("member %s: partitions %s, backlog %d", m["member"], m["partitions"], m["backlog"])
        return members
