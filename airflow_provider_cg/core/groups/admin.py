"""Administration of partitioned consumer groups, compatible with Synadia orbit ``pcgroups``.

:class:`ConsumerGroups` is the one entry point, on one nats-py connection. Its parts, each in
its own module:

- ``store``: the KV entry (``static-consumer-groups`` / ``elastic-consumer-groups``, key
  ``<stream>.<group>``) and an elastic group's work-queue stream: create, get, list, delete;
- ``membership``: an elastic group's membership changed with compare-and-set, then the member
  consumers moved over safely (below);
- ``consumers``: member consumers built and ensured as orbit creates them, a pinned instance
  stepped down;
- ``status``: member state and per-partition backlog.

Membership transition (the pcgroups design's "Transitioning"), run after every membership write and by
:meth:`ConsumerGroups.reconcile`:

1. read the latest config and every member consumer (priority group ``PCG``) of the group;
2. delete every consumer whose filter subjects differ from what the config now gives its
   member (all deletes first: a work-queue stream refuses overlapping filters, 10100);
3. pause briefly so running instances notice the deletion;
4. re-create, create-only, the consumers of members that had one and are still members,
   keeping their settings (ack wait, max ack pending, ...) with the new filters; an overlap
   (10100) is retried with backoff until a deadline;
5. if the config changed meanwhile, go round again.

Members that had no consumer get none: a consumer means "an instance is running" (orbit
lists active members that way), and a member job ensures its own consumer when it starts.
The work-queue stream keeps every unacknowledged message, and a re-created consumer starts
at the first message still there, so nothing is skipped; an in-flight ack to a deleted
consumer fails (double ack) and the message goes to the new owner.

Static groups consume the origin stream directly with durable consumers; their position
cannot be carried from one member to another, so their membership is fixed at creation
(as in orbit): change it by deleting and re-creating the group.
"""


from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_cg.core.groups.config import current_members
from airflow_provider_cg.core.groups.consumers import (
    DEFAULT_ACK_WAIT,
    PRIORITY_GROUP,
    STATIC_ACK_WAIT,
    MemberConsumers,
    pinned_id,
    priority_group_of,
    static_max_ack_pending,
)
from airflow_provider_cg.core.groups.membership import (
    ASSIGNMENTS,
    TRANSITION_PAUSE,
    Membership,
    check_assignment,
    parse_mappings,
    parse_members,
)
from airflow_provider_cg.core.groups.moves import LayoutMove, LayoutMoves
from airflow_provider_cg.core.groups.status import GroupObservation, GroupStatus, MemberState
from airflow_provider_cg.core.groups.store import (
    ELASTIC,
    KINDS,
    MAX_CONFIG_BYTES,
    STATIC,
    GroupBroken,
    GroupInfo,
    GroupStore,
    consumer_name_of,
    consumer_stream_of,
    kind_of,
    stored_subjects,
)
from airflow_provider_cg.core.jetstream.api import DEFAULT_PREFIX

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

__all__ = [
    "ASSIGNMENTS", "DEFAULT_ACK_WAIT", "ELASTIC", "KINDS", "MAX_CONFIG_BYTES", "PRIORITY_GROUP", "STATIC",
    "STATIC_ACK_WAIT", "ConsumerGroups", "GroupBroken", "GroupInfo", "GroupStatus", "LayoutMove", "MemberState",
    "check_assignment", "consumer_name_of", "consumer_stream_of", "current_members", "kind_of", "parse_mappings",
    "parse_members", "pinned_id", "priority_group_of", "static_max_ack_pending", "stored_subjects",
]


class ConsumerGroups:
    """Async administration of consumer groups on one nats-py connection: one object made of
    its parts (``store``, ``consumers``, ``observation``, ``membership``, ``moves``), each
    with its own module; the methods below are theirs."""

    def __init__(
        self,
        nc: NATS,
        *,
        js_prefix: str = DEFAULT_PREFIX,
        timeout: float = 5.0,
        transition_pause: float = TRANSITION_PAUSE,
        overlap_deadline: float = 30.0,
    ) -> None:
        self.store = GroupStore(nc, js_prefix=js_prefix, timeout=timeout)
        self.consumers = MemberConsumers(self.store, overlap_deadline=overlap_deadline)
        self.observation = GroupObservation(self.store, self.consumers)
        self.membership = Membership(self.store, self.consumers, transition_pause=transition_pause)
        self.moves = LayoutMoves(self.store)
        # the groups and their streams
        self.create, self.get, self.list, self.delete = (self.store.create, self.store.get, self.store.list,
                                                         self.store.delete)
        self.layout, self.wq_stream_config = self.store.layout, self.store.wq_stream_config
        # member consumers
        self.member_consumer_config = self.consumers.member_consumer_config
        self.ensure_member_consumer, self.step_down = self.consumers.ensure_member_consumer, self.consumers.step_down
        # state and backlog
        self.member_info, self.status = self.observation.member_info, self.observation.status
        # membership and layout
        m = self.membership
        self.add_members, self.drop_members, self.set_mappings = m.add_members, m.drop_members, m.set_mappings
        self.delete_mappings, self.reconcile = m.delete_mappings, m.reconcile
        self.write_partition_count = m.write_partition_count
        self.move_layout = self.moves.move_layout
