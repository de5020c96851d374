"""Administration of partitioned consumer groups, compatible with Synadia orbit ``pcgroups``.

:class:`ConsumerGroups` creates, reads, lists and deletes groups (config in the KV buckets
``static-consumer-groups`` / ``elastic-consumer-groups``, key ``<stream>.<group>``), changes
an elastic group's membership with compare-and-set and then moves the member consumers over
safely, builds and ensures member consumers, steps a member's pinned instance down, and
reports member state and per-partition backlog.

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

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import nats.errors
import nats.js.errors
from nats.js.api import StorageType

from airflow_provider_cg.core.errors import (
    ConfigError,
    ConsumerGroupError,
    GroupNotFound,
    JetStreamApiError,
    ServerUnavailable,
    StoredConfigInvalid,
)
from airflow_provider_cg.core.groups import config as cgconfig
from airflow_provider_cg.core.groups import partitioning, sourcing
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, GroupConfig, StaticGroupConfig
from airflow_provider_cg.core.jetstream.api import (
    DEFAULT_PREFIX,
    ERR_CONSUMER_EXISTS,
    ERR_STREAM_NAME_IN_USE,
    ERR_STREAM_NOT_FOUND,
    ERR_WQ_CONSUMER_NOT_UNIQUE,
    JsApi,
)

STATIC, ELASTIC = "static", "elastic"
KINDS = (STATIC, ELASTIC)
class GroupBroken(ConsumerGroupError):
    """A group's config exists but a stream it needs does not (deleted behind its back)."""


PRIORITY_GROUP = "PCG"
MAX_CONFIG_BYTES = 1024 * 1024  # a stored config larger than this is refused on read
DEFAULT_ACK_WAIT = 5.0  # seconds: orbit's default ack wait for the consumers it creates
IDLE_FACTOR = 1  # orbit (v0.2): an elastic member's inactive_threshold = ack_wait * 1
MIN_PRIORITY_TIMEOUT = 1.0  # seconds: orbit's pinned TTL is max(ack_wait, 1 s)
STATIC_ACK_WAIT = 60.0  # seconds: a static member job reads through its durable: room to land a batch


def static_max_ack_pending(batch_size: int) -> int:
    """``max_ack_pending`` of the static durable a member job creates: three of its batches."""
    return max(3 * batch_size, 1000)
TRANSITION_PAUSE = 0.5  # seconds, as the pcgroups design pauses
CAS_ATTEMPTS = 50
NS = 1_000_000_000
_ZERO_TS = "0001-01-01T00:00:00Z"



# --- results ------------------------------------------------------------------------------


@dataclass
class GroupInfo:
    """A stored group: its kind, config and KV revision."""

    kind: str
    config: GroupConfig
    revision: int
    stream: str = ""
    group: str = ""
    created: bool = False  # set by create(): False when the group already existed

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "stream": self.stream,
            "group": self.group,
            "revision": self.revision,
            "config": _config_dict(self.config),
            "assignment": {m: list(p) for m, p in partitioning.assign_partitions(self.config).items()},
        }


@dataclass
class MemberState:
    """One member as the server sees it (from its consumer's info)."""

    member: str
    partitions: list[int]
    consumer_exists: bool
    pinned_id: str | None = None
    pinned_since: str | None = None
    num_pending: int = 0
    num_ack_pending: int = 0
    num_redelivered: int = 0
    num_waiting: int = 0
    consumer: str = ""
    in_membership: bool = True
    filters_current: bool = True  # False: the consumer's filters are stale (transition pending)
    backlog: int = 0  # messages stored in the member's partitions (see GroupStatus.partitions)
    ack_floor: int = 0  # its consumer's acknowledged-through stream sequence

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GroupStatus:
    """Backlog and member state of a group, cheap enough to poll every few seconds.

    ``partitions`` counts the messages stored per partition: for an elastic group that is
    the backlog (the work-queue stream drops acknowledged messages); for a static group it
    is what the origin stream holds, consumed or not. ``backlog`` is the elastic work-queue
    size, or for a static group the sum of the member consumers' pending + ack pending.
    """

    kind: str
    stream: str
    group: str
    max_members: int
    partitions: dict[int, int]
    members: list[MemberState]
    backlog: int
    num_pending: int
    num_ack_pending: int
    num_redelivered: int
    unassigned_partitions: list[int] = field(default_factory=list)
    inactive_members: list[str] = field(default_factory=list)
    buffered_msgs: int | None = None
    buffered_bytes: int | None = None
    max_buffered_msgs: int | None = None
    max_buffered_bytes: int | None = None
    source_lag: int | None = None
    sourcing_stopped: dict | None = None  # a reset or resize stopped sourcing: {"op", "cut", ...}
    revision: int = 0
    ts: float = 0.0

    @property
    def buffer_fill(self) -> float | None:
        """Fraction of the elastic buffer in use (the tighter of msgs and bytes), if limited."""
        fills = []
        if self.max_buffered_msgs and self.max_buffered_msgs > 0 and self.buffered_msgs is not None:
            fills.append(self.buffered_msgs / self.max_buffered_msgs)
        if self.max_buffered_bytes and self.max_buffered_bytes > 0 and self.buffered_bytes is not None:
            fills.append(self.buffered_bytes / self.max_buffered_bytes)
        return max(fills) if fills else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["partitions"] = {str(p): n for p, n in sorted(self.partitions.items())}
        d["buffer_fill"] = self.buffer_fill
        return d


# --- helpers ------------------------------------------------------------------------------


def kind_of(config: GroupConfig) -> str:
    if isinstance(config, ElasticGroupConfig):
        return ELASTIC
    if isinstance(config, StaticGroupConfig):
        return STATIC
    raise ConfigError("config", f"expected a StaticGroupConfig or ElasticGroupConfig, got {type(config).__name__}")


def _config_dict(config: GroupConfig) -> dict[str, Any]:
    import json

    return json.loads(config.to_json())


def consumer_stream_of(kind: str, stream: str, group: str) -> str:
    """The stream member consumers live on: the work-queue stream (elastic) or the origin."""
    return cgconfig.work_queue_stream(stream, group) if kind == ELASTIC else stream


def consumer_name_of(kind: str, group: str, member: str) -> str:
    """Member consumer name: ``<member>`` (elastic) or durable ``<group>-<member>`` (static)."""
    return member if kind == ELASTIC else f"{group}-{member}"


def _filters_of(consumer_config: dict) -> list[str]:
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


def _is_member_consumer(consumer_config: dict) -> bool:
    return priority_group_of(consumer_config) is not None


def _check_pinned(cstream: str, consumer_config: dict) -> None:
    if priority_group_of(consumer_config) is None:
        name = consumer_config.get("name") or consumer_config.get("durable_name")
        raise ConsumerGroupError(
            f"consumer {name!r} on {cstream!r} has the member's filters but no pinned_client priority "
            "group, so instances cannot exclude each other; delete it (or let orbit re-create it)"
        )


def pinned_id(info: dict | None) -> str | None:
    """The pin id of the instance pinned on a member consumer (its info), or None."""
    return _pin_state(info or {})[0]


def _pin_state(info: dict) -> tuple[str | None, str | None]:
    group = priority_group_of(info.get("config") or {}) or PRIORITY_GROUP
    for pg in info.get("priority_groups") or []:
        if pg.get("group") == group:
            pid = pg.get("pinned_client_id") or None
            ts = pg.get("pinned_ts")
            return pid, (ts if pid and ts and ts != _ZERO_TS else None)
    return None, None


def stored_subjects(stream_config: dict) -> list[str]:
    """The subjects as the origin stream stores them: its transform destination or subjects."""
    dest = (stream_config.get("subject_transform") or {}).get("dest")
    return [dest] if dest else list(stream_config.get("subjects") or [])


# --- the API ------------------------------------------------------------------------------


class ConsumerGroups:
    """Async administration of consumer groups on one nats-py connection."""

    def __init__(
        self,
        nc,
        *,
        js_prefix: str = DEFAULT_PREFIX,
        timeout: float = 5.0,
        transition_pause: float = TRANSITION_PAUSE,
        overlap_deadline: float = 30.0,
    ) -> None:
        self.nc = nc
        self.api = JsApi(nc, prefix=js_prefix, timeout=timeout)
        self.js = nc.jetstream(prefix=js_prefix, timeout=timeout)
        self.timeout = timeout
        self.transition_pause = transition_pause
        self.overlap_deadline = overlap_deadline
        self._kvs: dict[str, Any] = {}

    # --- KV ---------------------------------------------------------------------------------

    async def _kv(self, kind: str, *, create_replicas: int | None = None):
        """The kind's KV bucket; created (file storage) when ``create_replicas`` is given."""
        if kind in self._kvs:
            return self._kvs[kind]
        bucket = cgconfig.KV_BUCKETS[kind]
        async with _nats_errors():
            try:
                kv = await self.js.key_value(bucket)
            except nats.js.errors.BucketNotFoundError:
                if create_replicas is None:
                    return None
                try:
                    kv = await self.js.create_key_value(
                        bucket=bucket, replicas=create_replicas, storage=StorageType.FILE, direct=True
                    )
                except nats.js.errors.APIError:
                    kv = await self.js.key_value(bucket)  # created meanwhile by someone else
        self._kvs[kind] = kv
        return kv

    async def _read(self, kind: str, stream: str, group: str) -> GroupInfo | None:
        kv = await self._kv(kind)
        if kv is None:
            return None
        async with _nats_errors():
            try:
                entry = await kv.get(cgconfig.config_key(stream, group))
            except nats.js.errors.KeyNotFoundError:
                return None
        # Validated on read: another tool (or a hand) may have stored anything, and the rules
        # bound what reading it costs (max_members is checked before any per-partition work).
        try:
            if len(entry.value or b"") > MAX_CONFIG_BYTES:
                raise ConfigError("config", f"larger than {MAX_CONFIG_BYTES} bytes")
            cfg = cgconfig.load_config(kind, entry.value).validate()
        except ConfigError as e:
            raise StoredConfigInvalid(stream, group, kind, e) from None
        except RecursionError:
            raise StoredConfigInvalid(stream, group, kind, ConfigError("config", "nested too deeply")) from None
        return GroupInfo(kind, cfg, entry.revision, stream, group)

    # --- create / get / list / delete ------------------------------------------------------

    async def create(self, stream: str, group: str, config: GroupConfig) -> GroupInfo:
        """Create a group (kind from the config type); idempotent for the same immutable config."""
        kind = kind_of(config)
        config.validate(stream, group)
        other = STATIC if kind == ELASTIC else ELASTIC
        try:
            in_other = await self._read(other, stream, group)
        except StoredConfigInvalid:
            in_other = True
        if in_other:
            raise ConfigError("kind", f"group {group!r} on stream {stream!r} already exists as a {other} group")
        origin = await self._origin_info(stream)
        if kind == STATIC:
            await self._check_durable_names(stream, group, config)
        subjects = stored_subjects(origin["config"])
        if subjects:  # a sourcing/mirror stream has none to check against
            cgconfig.validate_against_stream(config, subjects)
        replicas = int(origin["config"].get("num_replicas") or 1)
        kv = await self._kv(kind, create_replicas=replicas)
        key = cgconfig.config_key(stream, group)
        created = False
        async with _nats_errors():
            try:
                revision = await kv.create(key, config.to_json())
                created = True
                info = GroupInfo(kind, config, revision, stream, group, created=True)
            except nats.js.errors.KeyWrongLastSequenceError:
                info = None
        if info is None:
            existing = await self._read(kind, stream, group)
            if existing is None:  # deleted between our create and read: try once more
                return await self.create(stream, group, config)
            cgconfig.check_change(existing.config, config)
            info = existing
        if kind == ELASTIC:
            try:
                await self._ensure_wq_stream(stream, group, info.config, origin["config"])
            except BaseException:
                if created:
                    await self._rollback(kv, key, info.revision)
                raise
        return info

    async def _check_durable_names(self, stream: str, group: str, config: GroupConfig) -> None:
        """A static member's durable is ``<group>-<member>``: group ``a`` member ``b-m1`` and
        group ``a-b`` member ``m1`` would share ``a-b-m1`` on one stream. Refuse that."""
        taken: dict[str, tuple[str, str]] = {}
        for key in await self._keys(STATIC, stream):
            other = key.partition(".")[2]
            if other == group:
                continue
            try:
                info = await self._read(STATIC, stream, other)
            except StoredConfigInvalid:
                continue
            if info is not None:
                for m in _all_members(info.config):
                    taken[consumer_name_of(STATIC, other, m)] = (other, m)
        for i, m in enumerate(_all_members(config)):
            name = consumer_name_of(STATIC, group, m)
            if name in taken:
                g2, m2 = taken[name]
                raise ConfigError(
                    f"members[{i}]",
                    f"member {m!r} would use the durable consumer {name!r}, which is member {m2!r} of static "
                    f"group {g2!r} on stream {stream!r}; choose another member or group name",
                )

    async def _rollback(self, kv, key: str, revision: int) -> None:
        try:
            async with _nats_errors():
                await kv.delete(key, last=revision)
        except ConsumerGroupError:
            pass  # changed by someone else meanwhile: leave their write alone

    async def _origin_info(self, stream: str) -> dict:
        try:
            return await self.api.stream_info(stream)
        except JetStreamApiError as e:
            if e.err_code == ERR_STREAM_NOT_FOUND:
                raise ConfigError("stream", f"stream {stream!r} does not exist") from None
            raise

    def wq_stream_config(self, stream: str, group: str, config: ElasticGroupConfig, origin: dict) -> dict:
        """The elastic group's work-queue stream config (raw JetStream JSON)."""
        n = config.max_members
        if config.partitioning_filters:
            transforms = [
                {"src": pf.filter, "dest": partitioning.transform_destination(pf.filter, pf.partitioning_wildcards, n)}
                for pf in config.partitioning_filters
            ]
        else:
            transforms = [{"src": ">", "dest": partitioning.transform_destination(">", [], n)}]
        return {
            "name": cgconfig.work_queue_stream(stream, group),
            "retention": "workqueue",
            "discard": "new",
            "max_msgs": config.max_buffered_msgs or -1,
            "max_bytes": config.max_buffered_bytes or -1,
            "num_replicas": int(origin.get("num_replicas") or 1),
            "storage": origin.get("storage") or "file",
            "allow_direct": True,
            "sources": [{"name": stream, "subject_transforms": transforms}],
        }

    async def _ensure_wq_stream(self, stream: str, group: str, config: ElasticGroupConfig, origin: dict) -> None:
        want = self.wq_stream_config(stream, group, config, origin)
        try:
            await self.api.add_stream(want)
            return
        except JetStreamApiError as e:
            if e.err_code != ERR_STREAM_NAME_IN_USE:
                raise
        have = (await self.api.stream_info(want["name"]))["config"]
        stopped = sourcing.stopped_state(have)
        sources = [stopped.source] if stopped is not None else have.get("sources") or []  # a reset/resize runs
        same = (
            have.get("retention") == "workqueue"
            and len(sources) == 1
            and sources[0].get("name") == stream
            and (sources[0].get("subject_transforms") or []) == want["sources"][0]["subject_transforms"]
        )
        if not same:
            raise ConfigError(
                "group", f"stream {want['name']!r} exists and is not this group's work-queue stream"
            )

    async def get(self, stream: str, group: str, kind: str | None = None) -> GroupInfo:
        """The stored group (both buckets are searched unless ``kind`` is given)."""
        cgconfig.validate_name("stream", stream, "stream")
        cgconfig.validate_name("group", group, "group")
        if kind is not None and kind not in KINDS:
            raise ConfigError("kind", f"must be one of {', '.join(KINDS)}")
        found = [i for k in ((kind,) if kind else KINDS) if (i := await self._read(k, stream, group))]
        if not found:
            raise GroupNotFound(stream, group)
        if len(found) > 1:
            raise ConfigError("group", f"{group!r} exists as both a static and an elastic group; give the kind")
        return found[0]

    async def list(self, stream: str | None = None) -> list[tuple[str, str, str]]:
        """``(kind, stream, group)`` of every group, optionally of one stream, sorted."""
        if stream is not None:
            cgconfig.validate_name("stream", stream, "stream")
        out: list[tuple[str, str, str]] = []
        for kind in KINDS:
            for key in await self._keys(kind, stream):
                s, _, g = key.partition(".")
                out.append((kind, s, g))
        return sorted(out, key=lambda t: (t[1], t[2], t[0]))

    async def _keys(self, kind: str, stream: str | None = None) -> list[str]:
        """Live keys of a bucket (``<stream>.*`` only, if given).

        From the KV stream's per-subject state, not nats-py's ``kv.keys()``: its watcher can
        signal "no more keys" before it has handed over the ones already delivered.
        """
        bucket = cgconfig.KV_BUCKETS[kind]
        prefix = f"$KV.{bucket}."
        try:
            si = await self.api.stream_info(f"KV_{bucket}", subjects_filter=prefix + (f"{stream}.*" if stream else ">"))
        except JetStreamApiError as e:
            if e.err_code == ERR_STREAM_NOT_FOUND:
                return []
            raise
        keys = sorted(s[len(prefix) :] for s in si["state"].get("subjects") or {})
        kv = await self._kv(kind)
        live = []
        for key in keys:  # a deleted or purged key keeps its subject (the marker): skip it
            if "." not in key:
                continue
            async with _nats_errors():
                try:
                    await kv.get(key)
                except nats.js.errors.KeyNotFoundError:
                    continue
            live.append(key)
        return live

    async def delete(self, stream: str, group: str, kind: str | None = None, *, force: bool = False) -> GroupInfo:
        """Delete the config entry, then the work-queue stream (elastic) or the member
        consumers (static: only the durables of this group's members, never another group's
        whose name shares the prefix, e.g. ``a-b-m1`` of group ``a-b`` when deleting ``a``).

        ``force``: also remove an entry whose stored config is invalid (its work-queue stream
        too; a static group's durables are left, since its members cannot be known)."""
        try:
            info = await self.get(stream, group, kind)
        except StoredConfigInvalid as e:
            if not force:
                raise
            kv = await self._kv(e.kind)
            async with _nats_errors():
                await kv.delete(cgconfig.config_key(stream, group))
            if e.kind == ELASTIC:
                with contextlib.suppress(JetStreamApiError):
                    await self.api.delete_stream(cgconfig.work_queue_stream(stream, group))
            return GroupInfo(e.kind, None, 0, stream, group)  # type: ignore[arg-type]
        kv = await self._kv(info.kind)
        async with _nats_errors():
            await kv.delete(cgconfig.config_key(stream, group))
        if info.kind == ELASTIC:
            try:
                await self.api.delete_stream(cgconfig.work_queue_stream(stream, group))
            except JetStreamApiError as e:
                if e.err_code != ERR_STREAM_NOT_FOUND:
                    raise
        else:
            names = {consumer_name_of(STATIC, group, m) for m in _all_members(info.config)}
            for c in await self.api.list_consumers(stream):
                if c.get("name", "") in names:
                    await self.api.delete_consumer(stream, c["name"])
        return info

    # --- membership -------------------------------------------------------------------------

    async def add_members(self, stream: str, group: str, members: Iterable[str], *,
                          assignment: str = "block") -> GroupInfo:
        """Add members. ``assignment="sticky"`` moves only the partitions the new members
        take (stored as orbit-readable ``member_mappings``); ``"block"`` re-distributes the
        members' contiguous blocks (orbit's own ``members``)."""
        members = parse_members("members", members)
        check_assignment(assignment)

        def change(cfg: GroupConfig) -> GroupConfig:
            if assignment == "sticky":
                return _sticky(cfg, [*current_members(cfg), *members])
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
                return _sticky(cfg, [m for m in current_members(cfg) if m not in set(members)])
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
            cgconfig.validate_name("member", m.member, "member")
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
            info = await self.get(stream, group)
            if info.kind == STATIC:
                raise ConfigError(
                    what, "a static group's membership is fixed at creation; delete and re-create the group"
                )
            new = change(info.config)
            new.validate()
            cgconfig.check_change(info.config, new)
            if new.to_json() == info.config.to_json():
                return info  # nothing to change
            kv = await self._kv(info.kind)
            async with _nats_errors():
                try:
                    revision = await kv.update(cgconfig.config_key(stream, group), new.to_json(), last=info.revision)
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
        kv = await self._kv(ELASTIC)
        async with _nats_errors():
            try:
                return await kv.update(cgconfig.config_key(stream, group), new.to_json(), last=last)
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
        if (await self.get(stream, group)).kind == STATIC:
            raise ConfigError(
                "group", "only elastic groups are reconciled: a static member's durable consumer keeps its "
                "position and is never re-created"
            )
        had: dict[str, dict] = {}  # member -> its consumer's config before we deleted it
        deleted: list[str] = []
        for _ in range(10):
            info = await self.get(stream, group)
            cstream = consumer_stream_of(info.kind, stream, group)
            existing = await self._member_consumers(info, cstream)
            stale = [
                (m, c)
                for m, c in existing.items()
                if sorted(_filters_of(c["config"])) != sorted(self._member_filters(info.config, m))
                and not (leave_pinned and _pin_state(c)[0])
            ]
            for member, c in stale:
                await self.api.delete_consumer(cstream, c["name"])
                had.setdefault(member, c["config"])
                deleted.append(c["name"])
            todo = {m: cfg for m, cfg in had.items() if cgconfig.in_membership(info.config, m)}
            todo = {m: cfg for m, cfg in todo.items() if self._member_filters(info.config, m)}
            if stale and todo:
                await asyncio.sleep(pause)
            for member, old in todo.items():
                filters = self._member_filters(info.config, member)
                await self._create_consumer(cstream, _with_filters(old, filters), info.kind, stream, group, member)
            latest = await self.get(stream, group)
            if latest.revision == info.revision:
                break
        recreated = sorted(consumer_name_of(info.kind, group, m) for m in todo)
        return {"deleted": deleted, "recreated": recreated}

    async def _member_consumers(self, info: GroupInfo, cstream: str) -> dict[str, dict]:
        """member -> consumer info, for every member consumer of the group that exists."""
        out: dict[str, dict] = {}
        try:
            consumers = await self.api.list_consumers(cstream)
        except JetStreamApiError as e:
            if e.err_code == ERR_STREAM_NOT_FOUND:
                return out
            raise
        durables = {consumer_name_of(STATIC, info.group, m): m for m in _all_members(info.config)}
        for c in consumers:
            name, ccfg = c.get("name", ""), c.get("config", {})
            if not _is_member_consumer(ccfg):
                continue
            if info.kind == ELASTIC:
                out[name] = c
            elif name in durables:  # never another group's durable that shares the prefix
                out[durables[name]] = c
        return out

    @staticmethod
    def _member_filters(config: GroupConfig, member: str) -> list[str]:
        if not cgconfig.in_membership(config, member):
            return []
        return list(partitioning.member_filter_subjects(config, member))

    # --- member consumers -------------------------------------------------------------------

    def member_consumer_config(
        self,
        stream: str,
        group: str,
        member: str,
        config: GroupConfig,
        *,
        ack_wait: float = DEFAULT_ACK_WAIT,
        max_ack_pending: int | None = None,
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
        cgconfig.validate_name("member", member, "member")
        if not cgconfig.in_membership(config, member):
            raise ConfigError("member", f"{member!r} is not a member of group {group!r} on stream {stream!r}")
        filters = self._member_filters(config, member)
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
        self, stream: str, group: str, member: str, *, deadline: float | None = None, **opts: Any
    ) -> tuple[str, str]:
        """Create the member's consumer (create-only) unless it exists with the right filters.

        An existing consumer with the member's current filters and a ``pinned_client``
        priority group is used as it is, whoever created it and with whatever ack wait or
        limits (an orbit instance's, say): replacing it would end the instance pinned on it.
        One with stale filters (membership changed) is deleted and re-created, as orbit does;
        an overlap with another member's consumer (10100) is retried until ``deadline``
        seconds. ``opts`` go to :meth:`member_consumer_config`.
        """
        info = await self.get(stream, group)
        cstream, cc = self.member_consumer_config(stream, group, member, info.config, **opts)
        try:
            await self._create_consumer(cstream, cc, info.kind, stream, group, member, deadline=deadline)
        except JetStreamApiError as e:
            if e.err_code != ERR_STREAM_NOT_FOUND:
                raise
            what = "work-queue" if info.kind == ELASTIC else "origin"
            raise GroupBroken(f"the {what} stream {cstream!r} of {info.kind} group {group!r} is missing (deleted?)") from None
        return cstream, cc["name"]

    async def _create_consumer(
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
                    if have is not None and sorted(_filters_of(have["config"])) == sorted(cc["filter_subjects"]):
                        _check_pinned(cstream, have["config"])
                        return  # created by another instance of the member (ours or orbit's): use it
                    # stale filters: make sure ours are the current ones, then replace it
                    info = await self.get(stream, group)
                    want = self._member_filters(info.config, member)
                    if not want:
                        raise ConfigError("member", f"{member!r} is no longer a member of group {group!r}") from None
                    cc = _with_filters(cc, want)
                    if have is not None and sorted(_filters_of(have["config"])) == sorted(want):
                        _check_pinned(cstream, have["config"])
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
                # the membership may have changed while we waited
                info = await self.get(stream, group)
                want = self._member_filters(info.config, member)
                if not want:
                    raise ConfigError("member", f"{member!r} is no longer a member of group {group!r}") from None
                cc = _with_filters(cc, want)

    async def step_down(self, stream: str, group: str, member: str) -> None:
        """Unpin the member's active instance; the server pins another waiting one."""
        info = await self.get(stream, group)
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

    # --- observation ------------------------------------------------------------------------

    async def member_info(self, stream: str, group: str, kind: str | None = None) -> list[MemberState]:
        info = await self.get(stream, group, kind)
        return await self._member_states(info)

    async def _member_states(self, info: GroupInfo) -> list[MemberState]:
        cstream = consumer_stream_of(info.kind, info.stream, info.group)
        consumers = await self._member_consumers(info, cstream)
        assignment = partitioning.assign_partitions(info.config)
        out: list[MemberState] = []
        for member in sorted(set(_all_members(info.config)) | set(consumers)):
            c = consumers.get(member)
            inm = cgconfig.in_membership(info.config, member)
            parts = sorted(assignment.get(member, [])) if inm else []
            st = MemberState(
                member=member,
                partitions=parts,
                consumer_exists=c is not None,
                consumer=consumer_name_of(info.kind, info.group, member),
                in_membership=inm,
            )
            if c is not None:
                st.pinned_id, st.pinned_since = _pin_state(c)
                st.num_pending = int(c.get("num_pending", 0))
                st.num_ack_pending = int(c.get("num_ack_pending", 0))
                st.num_redelivered = int(c.get("num_redelivered", 0))
                st.num_waiting = int(c.get("num_waiting", 0))
                st.ack_floor = int((c.get("ack_floor") or {}).get("stream_seq", 0))
                st.filters_current = sorted(_filters_of(c["config"])) == sorted(
                    self._member_filters(info.config, member)
                )
            out.append(st)
        return out

    async def status(self, stream: str, group: str, kind: str | None = None) -> GroupStatus:
        """Per-partition backlog, per-member state and totals (one KV get, one stream info,
        one consumer list)."""
        info = await self.get(stream, group, kind)
        cfg = info.config
        members = await self._member_states(info)
        partitions = {p: 0 for p in range(cfg.max_members)}
        st = GroupStatus(
            kind=info.kind,
            stream=stream,
            group=group,
            max_members=cfg.max_members,
            partitions=partitions,
            members=members,
            backlog=0,
            num_pending=sum(m.num_pending for m in members),
            num_ack_pending=sum(m.num_ack_pending for m in members),
            num_redelivered=sum(m.num_redelivered for m in members),
            revision=info.revision,
            ts=time.time(),
        )
        if info.kind == ELASTIC:
            wq = cgconfig.work_queue_stream(stream, group)
            try:
                si = await self.api.stream_info(wq, subjects_filter=">")
            except JetStreamApiError as e:
                if e.err_code != ERR_STREAM_NOT_FOUND:
                    raise
                raise GroupBroken(f"the work-queue stream {wq!r} of elastic group {group!r} is missing "
                                  f"(deleted?): create the group again (same config) to restore it, or remove "
                                  f"the group") from None
            _count_partitions(partitions, si["state"].get("subjects") or {})
            st.backlog = int(si["state"].get("messages", 0))
            st.buffered_msgs = st.backlog
            st.buffered_bytes = int(si["state"].get("bytes", 0))
            st.max_buffered_msgs = cfg.max_buffered_msgs or None
            st.max_buffered_bytes = cfg.max_buffered_bytes or None
            sources = si.get("sources") or []
            st.source_lag = int(sources[0].get("lag", 0)) if sources else None
            stopped = sourcing.stopped_state(si.get("config") or {})
            if stopped is not None:
                st.sourcing_stopped = {**stopped.intent, "cut": stopped.cut}
        else:
            for f in cfg.filters or [">"]:
                try:
                    si = await self.api.stream_info(stream, subjects_filter=f if f == ">" else f"*.{f}")
                except JetStreamApiError as e:
                    if e.err_code != ERR_STREAM_NOT_FOUND:
                        raise
                    raise GroupBroken(f"the origin stream {stream!r} of static group {group!r} is missing "
                                      "(deleted?)") from None
                _count_partitions(partitions, si["state"].get("subjects") or {})
            st.backlog = st.num_pending + st.num_ack_pending
        assigned = set()
        for m in members:
            m.backlog = sum(partitions.get(p, 0) for p in m.partitions)
            assigned.update(m.partitions)
            if m.in_membership and m.partitions and not m.consumer_exists:
                st.inactive_members.append(m.member)
        st.unassigned_partitions = [p for p in range(cfg.max_members) if p not in assigned]
        return st


ASSIGNMENTS = ("block", "sticky")


def check_assignment(assignment: str) -> None:
    if assignment not in ASSIGNMENTS:
        raise ConfigError("assignment", f"must be one of {', '.join(ASSIGNMENTS)} (got {assignment!r})")


def current_members(cfg: GroupConfig) -> list[str]:
    """The group's members, from its member list or its mappings."""
    return list(cfg.members) if cfg.members else [mm.member for mm in cfg.member_mappings]


def _sticky(cfg: GroupConfig, members: list[str]) -> GroupConfig:
    """``cfg`` with ``members`` assigned stickily (members left without a partition, when
    there are more members than partitions, are not in the mappings)."""
    members = list(dict.fromkeys(members))
    if not members:
        return cgconfig.with_members(cfg, [])
    assigned = partitioning.sticky_distribute(partitioning.assign_partitions(cfg), members, cfg.max_members)
    return cgconfig.with_mappings(cfg, {m: ps for m, ps in assigned.items() if ps})


# --- module helpers -----------------------------------------------------------------------


class _nats_errors:
    """Turn nats-py errors into the core's errors (async context manager)."""

    async def __aenter__(self):
        return self

    async def __aexit__(self, et, e, tb):
        if e is None or isinstance(e, ConsumerGroupError):
            return False
        if isinstance(e, (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.KeyNotFoundError,
                          nats.js.errors.NoKeysError, nats.js.errors.BucketNotFoundError)):
            return False  # handled by the caller
        if isinstance(e, nats.js.errors.APIError):
            raise JetStreamApiError(e.code or 0, e.err_code or 0, e.description or str(e)) from None
        if isinstance(e, (nats.errors.TimeoutError, nats.errors.NoRespondersError, asyncio.TimeoutError,
                          nats.errors.ConnectionClosedError)):
            raise ServerUnavailable(f"NATS request failed: {type(e).__name__}") from None
        return False


def _count_partitions(partitions: dict[int, int], subjects: dict[str, int]) -> None:
    for subject, n in subjects.items():
        first = subject.split(".", 1)[0]
        if first.isdigit():
            p = int(first)
            partitions[p] = partitions.get(p, 0) + int(n)


def _with_filters(consumer_config: dict, filters: Sequence[str]) -> dict:
    """A consumer config to re-create: the old settings, new filters, no server metadata."""
    cc = {k: v for k, v in consumer_config.items() if k not in ("filter_subject", "filter_subjects")}
    md = {k: v for k, v in (cc.get("metadata") or {}).items() if not k.startswith("_nats.")}
    if md:
        cc["metadata"] = md
    else:
        cc.pop("metadata", None)
    cc["filter_subjects"] = list(filters)
    return cc


def _all_members(config: GroupConfig) -> list[str]:
    if config.member_mappings:
        return [m.member for m in config.member_mappings]
    return list(dict.fromkeys(config.members or []))


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
        cgconfig.validate_name(f"{field}[{i}]", m, "member")
    return out


def parse_mappings(value: Any) -> list:
    """Mappings from JSON text, a list of ``{"member", "partitions"}`` or ``{member: [p...]}``."""
    import json

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
        cgconfig.validate_name(f"{where}.member", item["member"], "member")
        if not all(isinstance(p, int) and not isinstance(p, bool) for p in item["partitions"]):
            raise ConfigError(f"{where}.partitions", "must be a list of integers")
        out.append(cgconfig.MemberMapping(member=item["member"], partitions=list(item["partitions"])))
    return out
