"""The ``partition-streams`` layout (and its ``draining`` state), and where its partitions are stored.

``work-queue`` (orbit ``pcgroups``'): one work-queue stream ``<stream>-<group>`` sources the
origin and puts the partition token first; each member reads its partitions ``<p>.>`` from it.
A filtered read walks the other partitions' messages (nats-server keeps no per-subject index of
sequences; ``msgBlock.firstMatching`` loads and matches each message), so a group's server work
grows with members x stream: measured here, a member of a 256-partition group read its
partition at 0.13x the rate of a member of a 6-partition group.

``partition-streams``: the same work-queue stream, and behind it one stream per partition,
``<stream>-<group>-p<p>``, each a *filtered mirror* of the work queue through a durable
flow-control consumer ``cg-partition-<p>`` (nats-server 2.14+, ADR-58: the work queue drops a
message only once its partition stream stored it). A mirror keeps the work queue's sequence
numbers and the message's own headers, so rows still name their origin message
(``Nats-Stream-Source``) and a batch is still acknowledged as a range of work-queue sequences:
both layouts are the same positions to the sinks, and a group can move between them with
nothing lost or landed twice. (A *source* would not do: sourcing a sourced stream replaces the
``Nats-Stream-Source`` header, nats-server ``stream.go``.) A member reads each of its
partitions unfiltered from its own stream and purges it by sequence; a cluster places the
partition streams on different servers.

The member consumer stays on the work queue, named after the member, as the exclusivity token
(priority group ``PCG``, ``pinned_client``). Its filter is the member's *pin subject*
``_cg.pin.<wq>.<member>`` (the work queue captures ``_cg.pin.<wq>.*``): the mirrors' consumers
hold the partition subjects, and a work queue allows no overlapping filters. The server pins a
client only when it delivers a message, so a job that wants the pin publishes one small anchor
message there first (``Pin.anchor``, ``landing/pin.py``).

orbit: its CLI reads and changes the membership of a ``partition-streams`` group (the KV entry is
the same JSON), but an orbit *instance* cannot consume one: its consumer's ``<p>.>`` filters
overlap the mirrors' and the server refuses it (10100).

Moving back to ``work-queue`` first stops the mirrors (state
``draining``: members keep landing the partition streams while new messages wait in the work
queue), and finishes once every partition stream is empty.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from airflow_provider_cg.core.errors import ConfigError, ConsumerGroupError, JetStreamApiError
from airflow_provider_cg.core.groups.layouts.base import (
    DRAINING,
    LAYOUT_KEY,
    PARTITION_STREAMS,
    REPLICAS_KEY,
    WORK_QUEUE,
    Layout,
    LayoutError,
    LayoutMove,
    Mover,
    count_partitions,
    pin_subject,
    pin_subjects,
    wq_config,
)
from airflow_provider_cg.core.groups.names import is_mirror_consumer, mirror_consumer
from airflow_provider_cg.core.jetstream.api import (
    ERR_CONSUMER_EXISTS,
    ERR_STREAM_NAME_IN_USE,
    ERR_STREAM_NOT_FOUND,
    ERR_WQ_CONSUMER_NOT_UNIQUE,
    JsApi,
    server_version,
)

PARTITION_OF_KEY = "cg.partition_of"  # on a partition stream: its work queue and partition
DURABLE_SOURCING_VERSION = (2, 14, 0)  # durable (flow-control) sourcing and mirroring, ADR-58
MIRROR_HEARTBEAT_NS = 1_000_000_000
MIRROR_MAX_ACK_PENDING = 10_000


def partition_stream(wq: str, p: int) -> str:
    return f"{wq}-p{p}"


def mirror_subject(wq: str, p: int) -> str:
    return f"_cg.mirror.{wq}.{p}"


def mirror_consumer_config(p: int, wq: str) -> dict:
    """The durable flow-control consumer that moves partition ``p`` of the work queue into its
    stream (the server acks each message once the partition stream stored it). A work queue
    takes only ``deliver_policy: all``."""
    return {
        "name": mirror_consumer(p),
        "durable_name": mirror_consumer(p),
        "filter_subject": f"{p}.>",
        "deliver_policy": "all",
        "ack_policy": "flow_control",
        "flow_control": True,
        "idle_heartbeat": MIRROR_HEARTBEAT_NS,
        "deliver_subject": mirror_subject(wq, p),
        "max_deliver": -1,
        "max_ack_pending": MIRROR_MAX_ACK_PENDING,
    }


def partition_replicas(wq_config: dict) -> int:
    """The partition streams' replicas: as recorded on the work queue when the group moved to
    ``partition-streams``, else 1 (see ``check_replicas``)."""
    recorded = (wq_config.get("metadata") or {}).get(REPLICAS_KEY)
    return int(recorded) if recorded and str(recorded).isdigit() else 1


#: the newest nats-server on which replicated filtered mirrors were seen to fail (and none after)
REPLICATED_MIRRORS_FAIL_THROUGH = (2, 15, 1)


def check_replicas(field: str, value: Any, server: tuple[int, ...] | None = None) -> int | None:
    """The partition streams' replicas: 1 by default, and on the servers checked here, 1 only.

    A partition stream is a *filtered mirror* of the work queue, and nats-server 2.14 to 2.15.1
    loses replicated ones: created on a work queue that has moved past sequence 1 the leader
    jumps its own store over the gap and its followers then refuse every write (critical write
    error, no quorum: the group stalls); created otherwise, a leader killed under load comes
    back having dropped messages its mirror had acknowledged to the work queue (in 2 of 2 runs
    of ``benchmarks/repro_clustered_filtered_mirror.py --scale-up``: 12,000 and 1,000 of 44,000
    lost). R1 partition streams have no Raft group, so neither path exists (44,000 of 44,000 in
    3 of 3 runs, each SIGKILLing the server that holds the stream 4 times). The work queue and
    the origin keep their replicas; what a partition stream holds is on one server until landed
    (after a server's disk is lost for good, ``cg reset`` replays it from the origin)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 5:
        raise ConfigError(field, f"must be 1 to 5 (got {value!r})")
    if value > 1 and server is not None and server <= REPLICATED_MIRRORS_FAIL_THROUGH:
        v = ".".join(map(str, server))
        raise ConfigError(field, f"must be 1 on nats-server {v}: it stalls or loses replicated filtered mirrors "
                                 "(benchmarks/repro_clustered_filtered_mirror.py); the work queue and the origin "
                                 "keep their replicas")
    return value


def partition_stream_config(wq_config: dict, p: int) -> dict:
    """Partition ``p``'s stream: a work-queue mirror of the work queue, filtered by its
    consumer. No limits of its own: a full mirror stalls for good (checked on nats-server
    2.15), so the group's buffered limits stay on the work queue."""
    wq = wq_config["name"]
    return {
        "name": partition_stream(wq, p),
        "retention": "workqueue",
        "num_replicas": partition_replicas(wq_config),
        "storage": wq_config.get("storage") or "file",
        "allow_direct": True,
        "mirror": {"name": wq, "consumer": {"name": mirror_consumer(p), "deliver_subject": mirror_subject(wq, p)}},
        "metadata": {PARTITION_OF_KEY: f"{wq} {p}"},
    }


async def ensure_partition_streams(api: JsApi, wq_cfg: dict, partitions: int, deadline: float) -> None:
    """Create (or find) every partition's mirror consumer and stream. A consumer whose filter
    a member consumer still holds (10100, a job of the old layout not yet gone) is retried
    until ``deadline`` (monotonic)."""
    wq = wq_cfg["name"]
    for p in range(partitions):
        cc = mirror_consumer_config(p, wq)
        while True:
            try:
                await api.create_consumer(wq, cc, action="create")
                break
            except JetStreamApiError as e:
                if e.err_code == ERR_CONSUMER_EXISTS:
                    have = await api.consumer_info(wq, cc["name"])
                    if _ours(have, cc):  # made by an earlier version (deliver_policy all): it is this mirror
                        break
                    raise LayoutError(f"consumer {cc['name']!r} on {wq!r} exists with another config; delete it "
                                      "(it is not this group's partition mirror)") from None
                if e.err_code != ERR_WQ_CONSUMER_NOT_UNIQUE:
                    raise
                if time.monotonic() > deadline:
                    raise LayoutError(f"partition {p} of {wq!r} is still held by a member consumer with filter "
                                      f"'{p}.>' (a job of the work-queue layout): stop it, or run again") from None
                await asyncio.sleep(0.2)
        want = partition_stream_config(wq_cfg, p)
        try:
            await api.add_stream(want)
        except JetStreamApiError as e:
            if e.err_code != ERR_STREAM_NAME_IN_USE:
                raise
            have = await wq_config(api, want["name"])
            if (have.get("mirror") or {}).get("name") != wq or \
                    (have.get("metadata") or {}).get(PARTITION_OF_KEY) != f"{wq} {p}":
                raise LayoutError(f"stream {want['name']!r} exists and is not partition {p} of {wq!r}; "
                                  "rename or remove it") from None


def _ours(info: dict | None, want: dict) -> bool:
    """Whether an existing consumer is this partition's mirror consumer, whatever deliver policy
    it was made with."""
    cfg = (info or {}).get("config") or {}
    return all(cfg.get(k) == want[k] for k in ("filter_subject", "deliver_subject", "ack_policy"))


async def stop_mirrors(api: JsApi, wq: str) -> int:
    """Delete the partitions' mirror consumers (what they had not moved stays in the work queue)."""
    n = 0
    for c in await api.list_consumers(wq):
        if is_mirror_consumer(c.get("name", "")):
            n += await api.delete_consumer(wq, c["name"])
    return n


async def _stored(api: JsApi, wq: str, p: int) -> int | None:
    """Messages stored in partition ``p``'s stream (None: it does not exist)."""
    try:
        return int((await api.stream_info(partition_stream(wq, p)))["state"]["messages"])
    except JetStreamApiError as e:
        if e.err_code != ERR_STREAM_NOT_FOUND:
            raise
        return None


async def partition_streams_left(api: JsApi, wq: str, partitions: int) -> dict[int, int]:
    """Messages still stored in each partition stream that exists."""
    out = {p: await _stored(api, wq, p) for p in range(partitions)}
    return {p: n for p, n in out.items() if n is not None}


async def partition_streams_of(api: JsApi, wq: str) -> list[str]:
    """Names of the streams that are partitions of ``wq`` (by their metadata), whatever the
    group's partition count is now."""
    out: list[str] = []
    offset = 0
    while True:
        page = await api.request("STREAM.LIST", {"offset": offset})
        got = page.get("streams") or []
        for si in got:
            cfg = si.get("config") or {}
            if ((cfg.get("metadata") or {}).get(PARTITION_OF_KEY) or "").rpartition(" ")[0] == wq:
                out.append(cfg["name"])
        offset += len(got)
        if not got or offset >= int(page.get("total") or 0):
            return sorted(out)


async def remove_partition_streams(api: JsApi, wq: str) -> None:
    await stop_mirrors(api, wq)
    for name in await partition_streams_of(api, wq):
        await api.delete_stream(name)


async def partition_backlog(api: JsApi, wq: str, partitions, problems: dict[int, str] | None = None,
                            mirrored: bool = True) -> dict[int, int]:
    """Per partition: what its stream holds plus what its mirror has not yet delivered. (The
    work queue drops a moved message only at the mirror's next flow-control reply, so its own
    count would count a moved message twice meanwhile.) With ``problems``, each partition
    stream's health is looked at too (``partition_stream_problem``), and a stream that does not
    answer counts only what its mirror has to move, instead of failing the whole count."""
    out: dict[int, int] = {}
    for p in partitions:
        info = await api.consumer_info(wq, mirror_consumer(p))
        pending = int(info.get("num_pending") or 0) if info else 0
        if problems is None:
            out[p] = (await _stored(api, wq, p) or 0) + pending
            continue
        why = await partition_stream_problem(api, wq, p, mirror_info=info, mirrored=mirrored)
        if why is not None:
            problems[p] = why
        try:
            out[p] = (await _stored(api, wq, p) or 0) + pending
        except ConsumerGroupError:
            out[p] = pending
    return out


#: a mirror with messages to move that has not heard from the work queue for this long is stalled
MIRROR_STALLED_NS = 15_000_000_000


async def partition_stream_problem(api: JsApi, wq: str, p: int, mirror_info: dict | None = None,
                                   timeout: float = 5.0, mirrored: bool = True) -> str | None:
    """Why partition ``p``'s stream is not current, or None when it is: it does not answer, has
    no leader (a cluster lost its quorum), its mirror reports an error, or its mirror has
    messages to move and has stalled. (A replica catching up is no problem: the leader serves.)
    ``mirrored`` False: the mirrors are stopped (draining back to the work queue)."""
    name = partition_stream(wq, p)
    try:
        info = await api.request(f"STREAM.INFO.{name}", timeout=timeout)
    except JetStreamApiError as e:
        if e.err_code == ERR_STREAM_NOT_FOUND:
            return "missing (the layout is partition-streams: run cg layout again to create it)"
        return f"unavailable ({e.description})"
    except ConsumerGroupError as e:  # no answer: no server holds it, or none can answer
        return f"unavailable ({e})"
    cluster = info.get("cluster") or {}
    if cluster and not cluster.get("leader"):
        offline = [r.get("name") for r in cluster.get("replicas") or () if r.get("offline")]
        return "no leader" + (f" (replicas offline: {', '.join(offline)})" if offline else " (no quorum)")
    if not mirrored:
        return None
    mirror = info.get("mirror") or {}
    if mirror.get("error"):
        return f"its mirror failed ({(mirror['error'] or {}).get('description') or mirror['error']})"
    if mirror_info is None:
        mirror_info = await api.consumer_info(wq, mirror_consumer(p))
    if mirror_info is None:
        return f"its mirror consumer {mirror_consumer(p)!r} on {wq!r} is missing"
    pending = int(mirror_info.get("num_pending") or 0)
    active = int(mirror.get("active") or 0)
    if pending and active > MIRROR_STALLED_NS:
        return f"its mirror stalled ({pending} messages to move, none for {active / 1e9:.0f} s)"
    return None


async def partition_stream_problems(api: JsApi, wq: str, partitions, mirrored: bool = True) -> dict[int, str]:
    """``partition_stream_problem`` of each partition (only those that have one)."""
    out: dict[int, str] = {}
    for p in partitions:
        why = await partition_stream_problem(api, wq, p, mirrored=mirrored)
        if why is not None:
            out[p] = why
    return out


def check_server(nc) -> None:
    if server_version(nc) < DURABLE_SOURCING_VERSION:
        v = ".".join(map(str, server_version(nc)))
        raise ConfigError("layout", f"{PARTITION_STREAMS} needs nats-server 2.14 or later (durable mirroring of a "
                                    f"work-queue stream); the server is {v}")


class PartitionStreams(Layout):
    """Members read a stream per partition, fed by its mirror of the work queue; the member
    consumer on the work queue holds only the member's pin subject."""

    name = PARTITION_STREAMS
    reads_partition_streams = True
    mirrored = True
    elastic_only = True

    def member_filters(self, config, member: str, wq: str | None = None) -> list[str]:
        if not super().member_filters(config, member):
            return []
        if wq is None:
            raise ValueError("the work-queue stream is needed for a member's pin subject")
        return [pin_subject(wq, member)]

    def work_queue_config(self, wq_config: dict, replicas: int | None = None) -> dict:
        """Also capturing the pin subjects, and recording the partition streams' replicas
        (``replicas``; None keeps what is recorded)."""
        cfg = {k: v for k, v in wq_config.items() if k not in ("subjects", "metadata")}
        md = {k: v for k, v in (wq_config.get("metadata") or {}).items() if not k.startswith("_nats.") and k != LAYOUT_KEY}
        if replicas is not None:
            md[REPLICAS_KEY] = str(replicas)
        md[LAYOUT_KEY] = self.name
        cfg["subjects"] = [pin_subjects(wq_config["name"])]
        cfg["metadata"] = md
        return cfg

    def check_server(self, nc) -> None:
        check_server(nc)

    async def prepare(self, api: JsApi, wq: str, partitions: int, deadline: float) -> None:
        cfg = await self.record(api, wq)
        await ensure_partition_streams(api, cfg, partitions, deadline=deadline)

    def check_repartition(self, what: str, stream: str, group: str) -> None:
        """``reset`` and ``resize`` move work-queue positions and partition tokens; they are not
        built for partition streams: say how to get there."""
        raise ConfigError("layout", f"a {what} needs the work-queue layout and group {group!r} is in the {self.name} "
                                    f"layout: cg layout {stream} {group} {WORK_QUEUE} first (it waits until the "
                                    f"partition streams are landed), then {what}, then move it back")

    def partition_readers(self, nc, wq: str, partitions: tuple[int, ...], js_prefix: str):
        from airflow_provider_cg.core.jetstream.direct import PartitionStreamReaders

        return PartitionStreamReaders(nc, {p: partition_stream(wq, p) for p in partitions}, js_prefix=js_prefix)

    def partition_store(self, wq: str, partition: int) -> str:
        return partition_stream(wq, partition)

    async def backlog(self, api: JsApi, wq: str, wq_subjects: dict[str, int], partitions: Iterable[int],
                      problems: dict[int, str] | None = None) -> dict[int, int]:
        partitions = list(partitions)
        counts = dict.fromkeys(partitions, 0)
        counts.update(await partition_backlog(api, wq, partitions, problems=problems, mirrored=self.mirrored))
        return counts

    async def problems(self, api: JsApi, wq: str, partitions: tuple[int, ...]) -> dict[int, str]:
        return await partition_stream_problems(api, wq, partitions, mirrored=self.mirrored)

    async def oldest(self, api: JsApi, wq: str, partition: int, problems: dict[int, str]) -> Any:
        msg = None
        if partition not in problems:
            msg = await api.next_msg(partition_stream(wq, partition), 1, ">")
        return msg or await super().oldest(api, wq, partition, problems)

    async def enter(self, moves: Mover, stream: str, group: str, have: Layout, wq_cfg: dict, partitions: int,
                    deadline: float, replicas: int | None):
        """Record the layout first (a member job that joins from then on makes its consumer on
        its pin subject), delete the member consumers that hold partition filters, then create
        the mirrors and partition streams (``moves.py``)."""
        self.check_server(moves.nc)
        wq = wq_cfg["name"]
        if replicas is not None and have.reads_partition_streams and partition_replicas(wq_cfg) != replicas:
            raise ConfigError("partition_replicas", f"the partition streams exist with {partition_replicas(wq_cfg)} "
                                                    "replicas: move the group to work-queue first to change them")
        if not have.mirrored or replicas is not None:
            wq_cfg = await self.record(moves.api, wq, replicas)
        await moves.drop_member_consumers(wq, partition_filters=True)
        await ensure_partition_streams(moves.api, wq_cfg, partitions, deadline=max(deadline, time.monotonic() + 5))
        return LayoutMove(stream, group, self.name, True)

    async def drain(self, api: JsApi, wq: str, partitions: int, deadline: float) -> dict[int, int]:
        """Stop the mirrors (state ``draining``) and wait until members landed every partition
        stream, or ``deadline`` (monotonic): what is left per partition ({} once all are empty)."""
        if self.mirrored:
            await DRAINING_LAYOUT.record(api, wq)
        await stop_mirrors(api, wq)
        while True:
            left = await partition_streams_left(api, wq, partitions)
            if not any(left.values()):
                return {}
            if time.monotonic() >= deadline:
                return left
            await asyncio.sleep(min(1.0, max(0.05, deadline - time.monotonic())))


class Draining(PartitionStreams):
    """On the way back to the work queue: the mirrors are stopped, members land what the
    partition streams hold, and new messages wait in the work queue meanwhile."""

    name = DRAINING
    chosen = False
    mirrored = False

    async def backlog(self, api: JsApi, wq: str, wq_subjects: dict[str, int], partitions: Iterable[int],
                      problems: dict[int, str] | None = None) -> dict[int, int]:
        return count_partitions(await super().backlog(api, wq, wq_subjects, partitions, problems), wq_subjects)


PARTITION_STREAMS_LAYOUT = PartitionStreams()
DRAINING_LAYOUT = Draining()
