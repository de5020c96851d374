"""Where a consumer group is stored, compatible with orbit ``pcgroups``: its config in the KV
buckets ``static-consumer-groups`` / ``elastic-consumer-groups`` (key ``<stream>.<group>``), an
elastic group's work-queue stream sourcing the origin, and the names of its member consumers.
:class:`GroupStore` creates, reads, lists and deletes groups."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

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
from airflow_provider_cg.core.groups import codec as groupcodec
from airflow_provider_cg.core.groups import config as cgconfig
from airflow_provider_cg.core.groups import layouts, partitioning, sourcing
from airflow_provider_cg.core.groups import names as groupnames
from airflow_provider_cg.core.groups import rules as grouprules
from airflow_provider_cg.core.groups.codec import dump_config
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, GroupConfig, StaticGroupConfig
from airflow_provider_cg.core.jetstream.api import ERR_STREAM_NAME_IN_USE, ERR_STREAM_NOT_FOUND, JsApi

if TYPE_CHECKING:
    from types import TracebackType

    from nats.js.kv import KeyValue

STATIC, ELASTIC = "static", "elastic"
KINDS = (STATIC, ELASTIC)
MAX_CONFIG_BYTES = 1024 * 1024  # a stored config larger than this is refused on read


class GroupBroken(ConsumerGroupError):
    """A group's config exists but a stream it needs does not (deleted behind its back)."""


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
            "config": config_dict(self.config),
            "assignment": {m: list(p) for m, p in partitioning.assign_partitions(self.config).items()},
        }



def kind_of(config: GroupConfig) -> str:
    if isinstance(config, ElasticGroupConfig):
        return ELASTIC
    if isinstance(config, StaticGroupConfig):
        return STATIC
    raise ConfigError("config", f"expected a StaticGroupConfig or ElasticGroupConfig, got {type(config).__name__}")


def config_dict(config: GroupConfig) -> dict[str, Any]:
    return json.loads(dump_config(config))



def consumer_stream_of(kind: str, stream: str, group: str) -> str:
    """The stream member consumers live on: the work-queue stream (elastic) or the origin."""
    return groupnames.work_queue_stream(stream, group) if kind == ELASTIC else stream


def consumer_name_of(kind: str, group: str, member: str) -> str:
    """Member consumer name: ``<member>`` (elastic) or durable ``<group>-<member>`` (static)."""
    return member if kind == ELASTIC else groupnames.static_consumer_name(group, member)



def stored_subjects(stream_config: dict) -> list[str]:
    """The subjects as the origin stream stores them: its transform destination or subjects."""
    dest = (stream_config.get("subject_transform") or {}).get("dest")
    return [dest] if dest else list(stream_config.get("subjects") or [])




class nats_errors:
    """Turn nats-py errors into the core's errors (async context manager)."""

    async def __aenter__(self) -> nats_errors:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
                        ) -> Literal[False]:
        if e is None or isinstance(e, ConsumerGroupError):
            return False
        if isinstance(e, (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.KeyNotFoundError,
                          nats.js.errors.NoKeysError, nats.js.errors.BucketNotFoundError)):
            return False  # handled by the caller
        if isinstance(e, nats.js.errors.APIError):
            raise JetStreamApiError(e.code or 0, e.err_code or 0, e.description or str(e)) from None
        if isinstance(e, (nats.errors.TimeoutError, nats.errors.NoRespondersError, asyncio.TimeoutError,
                          nats.errors.ConnectionClosedError, nats.js.errors.NoStreamResponseError)):
            raise ServerUnavailable(f"NATS request failed: {type(e).__name__}") from None
        return False



async def _once_the_bucket_answers(write: Any, within: float = 10.0) -> Any:
    """``write()``, made again while the server answers that no stream took it: in a cluster a
    bucket just created is known to the other servers' routes a moment later (seen on three
    servers: the first create after the bucket's). A 503 means nothing was stored, so it is safe."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await write()
        except nats.js.errors.NoStreamResponseError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)



class GroupStore:
    """Create, read, list and delete groups (the KV entry and the streams it needs)."""

    def __init__(self, nc: Any, *, js_prefix: str, timeout: float) -> None:
        self.nc = nc
        self.api = JsApi(nc, prefix=js_prefix, timeout=timeout)
        self.js = nc.jetstream(prefix=js_prefix, timeout=timeout)
        self._kvs: dict[str, Any] = {}

    async def kv(self, kind: str, *, create_replicas: int | None = None) -> KeyValue | None:
        """The kind's KV bucket; created (file storage) when ``create_replicas`` is given."""
        if kind in self._kvs:
            return self._kvs[kind]
        bucket = groupnames.KV_BUCKETS[kind]
        async with nats_errors():
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

    async def existing_kv(self, kind: str, *, create_replicas: int | None = None) -> KeyValue:
        """``kv`` where the bucket exists (a group was just read from it, or it was just made)."""
        kv = await self.kv(kind, create_replicas=create_replicas)
        if kv is None:  # deleted meanwhile, by hand
            raise ConsumerGroupError(f"the KV bucket {groupnames.KV_BUCKETS[kind]} is gone")
        return kv

    async def _read(self, kind: str, stream: str, group: str) -> GroupInfo | None:
        kv = await self.kv(kind)
        if kv is None:
            return None
        async with nats_errors():
            try:
                entry = await kv.get(groupnames.config_key(stream, group))
            except nats.js.errors.KeyNotFoundError:
                return None
        # Validated on read: another tool (or a hand) may have stored anything, and the rules
        # bound what reading it costs (max_members is checked before any per-partition work).
        try:
            if len(entry.value or b"") > MAX_CONFIG_BYTES:
                raise ConfigError("config", f"larger than {MAX_CONFIG_BYTES} bytes")
            cfg = groupcodec.load_config(kind, entry.value or b"").validate()
        except ConfigError as e:
            raise StoredConfigInvalid(stream, group, kind, e) from None
        except RecursionError:
            raise StoredConfigInvalid(stream, group, kind, ConfigError("config", "nested too deeply")) from None
        return GroupInfo(kind, cfg, entry.revision or 0, stream, group)

    # --- create / get / list / delete ------------------------------------------------------

    async def create(self, stream: str, group: str, config: GroupConfig,
                     layout: str = layouts.DEFAULT) -> GroupInfo:
        """Create a group (kind from the config type) in ``layout`` (``layouts/``; elastic
        groups only); idempotent for the same immutable config and layout."""
        kind = kind_of(config)
        config.validate(stream, group)
        target = layouts.named(layouts.check("layout", layout))
        if kind != ELASTIC and target.elastic_only:
            raise ConfigError("layout", "only an elastic group has a layout (a static group's members read the origin)")
        target.check_server(self.nc)
        other = STATIC if kind == ELASTIC else ELASTIC
        try:
            in_other = await self._read(other, stream, group) is not None
        except StoredConfigInvalid:
            in_other = True
        if in_other:
            raise ConfigError("kind", f"group {group!r} on stream {stream!r} already exists as a {other} group")
        origin = await self._origin_info(stream)
        if kind == STATIC:
            await self._check_durable_names(stream, group, config)
        subjects = stored_subjects(origin["config"])
        if subjects:  # a sourcing/mirror stream has none to check against
            grouprules.validate_against_stream(config, subjects)
        replicas = int(origin["config"].get("num_replicas") or 1)
        kv = await self.existing_kv(kind, create_replicas=replicas)
        key = groupnames.config_key(stream, group)
        created = False
        async with nats_errors():
            try:
                revision = await _once_the_bucket_answers(lambda: kv.create(key, dump_config(config)))
                created = True
                info = GroupInfo(kind, config, revision, stream, group, created=True)
            except nats.js.errors.KeyWrongLastSequenceError:
                info = None
        if info is None:
            existing = await self._read(kind, stream, group)
            if existing is None:  # deleted between our create and read: try once more
                return await self.create(stream, group, config)
            grouprules.check_change(existing.config, config)
            info = existing
        if isinstance(info.config, ElasticGroupConfig):
            try:
                source = await self._ensure_wq_stream(stream, group, info.config, origin["config"], target)
                await self._ensure_layout(info, target, created, source)
            except BaseException:
                if created:
                    await self._rollback(kv, key, info.revision)
                raise
        return info

    async def _ensure_layout(self, info: GroupInfo, target: layouts.Layout, created: bool, source: dict) -> None:
        """``source``: the origin's source as the group's config makes it (a partition log that
        is missing is made with it)."""
        have = await self.layout(info)
        if have is not target and not (created and have is layouts.named(layouts.DEFAULT)):
            raise ConfigError("layout", f"group {info.group!r} on stream {info.stream!r} exists in the {have.name} "
                                        f"layout; move it with: cg layout {info.stream} {info.group} {target.name}")
        await target.prepare(self.api, groupnames.work_queue_stream(info.stream, info.group), info.config.max_members,
                             deadline=time.monotonic() + 5.0, source=source)

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
                for m in cgconfig.current_members(info.config):
                    taken[consumer_name_of(STATIC, other, m)] = (other, m)
        for i, m in enumerate(cgconfig.current_members(config)):
            name = consumer_name_of(STATIC, group, m)
            if name in taken:
                g2, m2 = taken[name]
                raise ConfigError(
                    f"members[{i}]",
                    f"member {m!r} would use the durable consumer {name!r}, which is member {m2!r} of static "
                    f"group {g2!r} on stream {stream!r}; choose another member or group name",
                )

    async def _rollback(self, kv: KeyValue, key: str, revision: int) -> None:
        try:
            async with nats_errors():
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
            "name": groupnames.work_queue_stream(stream, group),
            "retention": "workqueue",
            "discard": "new",
            "max_msgs": config.max_buffered_msgs or -1,
            "max_bytes": config.max_buffered_bytes or -1,
            "num_replicas": int(origin.get("num_replicas") or 1),
            "storage": origin.get("storage") or "file",
            "allow_direct": True,
            "sources": [{"name": stream, "subject_transforms": transforms}],
        }

    async def _ensure_wq_stream(self, stream: str, group: str, config: ElasticGroupConfig, origin: dict,
                                target: layouts.Layout) -> dict:
        """Create the work-queue stream (in ``target``'s shape), or check that the existing one
        is this group's; returns the origin's source as the config makes it."""
        want = self.wq_stream_config(stream, group, config, origin)
        source = want["sources"][0]
        created, _ = target.creation_source(want)
        try:
            await self.api.add_stream(created)
            return source
        except JetStreamApiError as e:
            if e.err_code != ERR_STREAM_NAME_IN_USE:
                raise
        have = (await self.api.stream_info(want["name"]))["config"]
        stopped = sourcing.stopped_state(have)
        sources = [stopped.source] if stopped is not None else have.get("sources") or []  # a reset/resize runs
        if not sources and layouts.of(have).has_partition_streams:  # the partition log sources the origin
            sources = await layouts.log_sources(self.api, want["name"])
        same = (
            have.get("retention") == "workqueue"
            and len(sources) == 1
            and sources[0].get("name") == stream
            and (sources[0].get("subject_transforms") or []) == source["subject_transforms"]
        )
        if not same:
            raise ConfigError(
                "group", f"stream {want['name']!r} exists and is not this group's work-queue stream"
            )
        return source

    async def layout(self, info: GroupInfo) -> layouts.Layout:
        """Where the group's partitions are stored (``layouts/``): recorded on an elastic
        group's work-queue stream; a static group's members read the origin (``ORIGIN``)."""
        if info.kind != ELASTIC:
            return layouts.ORIGIN
        try:
            return layouts.of(await layouts.wq_config(self.api, groupnames.work_queue_stream(info.stream, info.group)))
        except JetStreamApiError as e:
            if e.err_code != ERR_STREAM_NOT_FOUND:
                raise
            raise GroupBroken(f"the work-queue stream of elastic group {info.group!r} is missing (deleted?): create "
                              "the group again (same config) to restore it, or remove the group") from None

    async def get(self, stream: str, group: str, kind: str | None = None) -> GroupInfo:
        """The stored group (both buckets are searched unless ``kind`` is given)."""
        groupnames.validate_name("stream", stream, "stream")
        groupnames.validate_name("group", group, "group")
        if kind is not None and kind not in KINDS:
            raise ConfigError("kind", f"must be one of {', '.join(KINDS)}")
        found = [i for k in ((kind,) if kind else KINDS) if (i := await self._read(k, stream, group))]
        if not found:
            raise GroupNotFound(stream, group)
        if len(found) > 1:
            raise ConfigError("group", f"{group!r} exists as both a static and an elastic group; give the kind")
        return found[0]

    async def list(self, stream: str | None = None) -> builtins.list[tuple[str, str, str]]:
        """``(kind, stream, group)`` of every group, optionally of one stream, sorted."""
        if stream is not None:
            groupnames.validate_name("stream", stream, "stream")
        out: builtins.list[tuple[str, str, str]] = []
        for kind in KINDS:
            for key in await self._keys(kind, stream):
                s, _, g = key.partition(".")
                out.append((kind, s, g))
        return sorted(out, key=lambda t: (t[1], t[2], t[0]))

    async def _keys(self, kind: str, stream: str | None = None) -> builtins.list[str]:
        """Live keys of a bucket (``<stream>.*`` only, if given).

        From the KV stream's per-subject state, not nats-py's ``kv.keys()``: its watcher can
        signal "no more keys" before it has handed over the ones already delivered.
        """
        bucket = groupnames.KV_BUCKETS[kind]
        prefix = f"$KV.{bucket}."
        try:
            si = await self.api.stream_info(f"KV_{bucket}", subjects_filter=prefix + (f"{stream}.*" if stream else ">"))
        except JetStreamApiError as e:
            if e.err_code == ERR_STREAM_NOT_FOUND:
                return []
            raise
        keys = sorted(s[len(prefix) :] for s in si["state"].get("subjects") or {})
        kv = await self.existing_kv(kind)
        live = []
        for key in keys:  # a deleted or purged key keeps its subject (the marker): skip it
            if "." not in key:
                continue
            async with nats_errors():
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
            kv = await self.existing_kv(e.kind)
            async with nats_errors():
                await kv.delete(groupnames.config_key(stream, group))
            if e.kind == ELASTIC:
                with contextlib.suppress(JetStreamApiError):
                    await self._delete_wq_streams(groupnames.work_queue_stream(stream, group))
            return GroupInfo(e.kind, None, 0, stream, group)  # type: ignore[arg-type]
        kv = await self.existing_kv(info.kind)
        async with nats_errors():
            await kv.delete(groupnames.config_key(stream, group))
        if info.kind == ELASTIC:
            await self._delete_wq_streams(groupnames.work_queue_stream(stream, group))
        else:
            names = {consumer_name_of(STATIC, group, m) for m in cgconfig.current_members(info.config)}
            for c in await self.api.list_consumers(stream):
                if c.get("name", "") in names:
                    await self.api.delete_consumer(stream, c["name"])
        return info

    async def _delete_wq_streams(self, wq: str) -> None:
        """The work-queue stream and the partition streams mirroring it (any layout)."""
        await layouts.delete_partition_streams(self.api, wq)
        try:
            await self.api.delete_stream(wq)
        except JetStreamApiError as e:
            if e.err_code != ERR_STREAM_NOT_FOUND:
                raise
