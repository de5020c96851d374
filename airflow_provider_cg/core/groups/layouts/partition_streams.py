"""The ``partition-streams`` layout (with its ``filling`` and ``draining`` states), and where its
partitions are stored.

``work-queue`` (orbit ``pcgroups``'): one work-queue stream ``<stream>-<group>`` sources the
origin and puts the partition token first; each member reads its partitions ``<p>.>`` from it.
A filtered read walks the other partitions' messages (nats-server keeps no per-subject index of
sequences; ``msgBlock.firstMatching`` loads and matches each message), so a group's server work
grows with members x stream: measured here, a member of a 256-partition group read its
partition at 0.13x the rate of a member of a 6-partition group.

``partition-streams``: the origin is sourced (partition token first, orbit's transforms) into the
group's *partition log* ``<stream>-<group>-log``, a limits-retention stream with the work
queue's replicas and buffered limits; behind it one stream per partition,
``<stream>-<group>-p<p>``, each a *filtered mirror* of the log through a durable flow-control
consumer ``cg-partition-<p>`` on the log. A member reads each of its partitions unfiltered from
its stream and acknowledges a landed range by purging it from the log (``<p>.>`` below a
sequence) and then from its stream.

The log is the copy of record: a message leaves it only when its member has landed it, so a
partition stream (one replica, see ``check_replicas``) never holds the only copy of a message
not landed. A mirror, by contrast, acknowledges what it stored to what it mirrors (since
nats-server 2.14, ADR-58), and a work queue drops what is acknowledged: when the partition
streams mirrored the work queue, a server whose disk was lost for good took their messages with
it (351 of 20,000 in one run). A partition stream is a read path that can be rebuilt: one whose
first message is past the log's first message of its partition (an empty replacement, a gap)
*lost* messages, and is rebuilt from the log in sequence order (``rebuild_partition_stream``) by
its member's job, before anything newer of the partition lands, or by ``cg layout ...
partition-streams``. A mirror keeps the log's sequence numbers and the message's headers, so
rows name their origin message (``Nats-Stream-Source``: the log sources the origin itself) and a
batch is a range of log sequences, one cut across the partitions.

The member consumer stays on the work queue, named after the member, as the exclusivity token
(priority group ``PCG``, ``pinned_client``). Its filter is the member's *pin subject*
``_cg.pin.<wq>.<member>`` (the work queue captures ``_cg.pin.<wq>.*``; its source is the log's
while the group is in this layout). The server pins a client only when it delivers a message, so
a job that wants the pin publishes one small anchor message there first (``Pin.anchor``).

orbit: its CLI reads and changes the membership of a ``partition-streams`` group (the KV entry is
the same JSON); an orbit *instance* finds nothing in the work queue to consume.

Moves (``moves.py``): into the layout the work queue's source is handed to the log at a cut
(state ``filling``: members land what the work queue holds, new messages gather in the log);
once the work queue is landed the members' partition consumers are replaced by pin consumers.
Back to ``work-queue`` the log's source is handed back to the work queue (state ``draining``:
members land the log, new messages wait in the work queue); once the log is landed it and the
partition streams go. Per-key order holds through both: what is older is landed first.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from airflow_provider_cg.core.errors import (
    ConfigError,
    ConsumerGroupError,
    JetStreamApiError,
    ServerUnavailable,
)
from airflow_provider_cg.core.groups import sourcing
from airflow_provider_cg.core.groups.layouts.base import (
    DRAINING,
    FILLING,
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
    JsApi,
    server_version,
)
from airflow_provider_cg.core.jetstream.direct_gets import PartitionStreamReaders, lost_from

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from nats.aio.client import Client as NATS

    from airflow_provider_cg.core.groups.config import GroupConfig

PARTITION_OF_KEY = "cg.partition_of"  # on a partition stream: its work queue and partition
LOG_OF_KEY = "cg.log_of"  # on a partition log: its work queue
DURABLE_SOURCING_VERSION = (2, 14, 0)  # durable (flow-control) sourcing and mirroring, ADR-58
MIRROR_HEARTBEAT_NS = 1_000_000_000
MIRROR_MAX_ACK_PENDING = 10_000


def partition_stream(wq: str, p: int) -> str:
    return f"{wq}-p{p}"


def partition_log(wq: str) -> str:
    """The group's partition log (the copy of record of what is not landed, in this layout)."""
    return f"{wq}-log"


def mirror_subject(wq: str, p: int) -> str:
    return f"_cg.mirror.{wq}.{p}"


def mirror_consumer_config(p: int, wq: str) -> dict:
    """The durable flow-control consumer on the log that moves partition ``p`` into its stream
    (the log keeps what it moved: it is limits-retention, members purge it)."""
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

    A partition stream is a *filtered mirror* of the log, and nats-server 2.14 to 2.15.1 loses
    replicated ones: created on a stream that has moved past sequence 1 the leader jumps its
    own store over the gap and its followers then refuse every write (critical write error, no
    quorum: the group stalls); created otherwise, a leader killed under load comes back having
    dropped messages its mirror had acknowledged (in 2 of 2 runs of
    ``benchmarks/repro_clustered_filtered_mirror.py --scale-up``: 12,000 and 1,000 of 44,000
    lost). R1 partition streams have no Raft group, so neither path exists. Nothing needs them
    replicated: the log, with the work queue's replicas, holds every message until it is landed,
    and a partition stream lost with its server's disk is rebuilt from it."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 5:
        raise ConfigError(field, f"must be 1 to 5 (got {value!r})")
    if value > 1 and server is not None and server <= REPLICATED_MIRRORS_FAIL_THROUGH:
        v = ".".join(map(str, server))
        raise ConfigError(field, f"must be 1 on nats-server {v}: it stalls or loses replicated filtered mirrors "
                                 "(benchmarks/repro_clustered_filtered_mirror.py); the partition log keeps the "
                                 "work queue's replicas and every message until it is landed")
    return value


def partition_log_config(wq_cfg: dict, source: dict) -> dict:
    """The partition log: the work queue's replicas, storage and buffered limits (``discard``
    new: a full log pauses the sourcing, as a full work queue does), limits retention (members
    purge what they landed), sourcing the origin as the work queue did (``source``). No direct
    gets: nats-server lets a mirror of a stream that has them answer direct gets *for* that
    stream (``mirror_direct``, forced to the origin's ``allow_direct``), and a filtered mirror
    answers for its partition only, so a direct get on the log would find nothing of the others
    (seen on 2.15.1). The log is read from its leader (``STREAM.MSG.GET``) and counted by its
    per-subject state."""
    wq = wq_cfg["name"]
    return {
        "name": partition_log(wq),
        "retention": "limits",
        "discard": "new",
        "max_msgs": wq_cfg.get("max_msgs", -1),
        "max_bytes": wq_cfg.get("max_bytes", -1),
        "num_replicas": int(wq_cfg.get("num_replicas") or 1),
        "storage": wq_cfg.get("storage") or "file",
        "allow_direct": False,
        "sources": [source],
        "metadata": {LOG_OF_KEY: wq},
    }


def partition_stream_config(wq_config: dict, p: int) -> dict:
    """Partition ``p``'s stream: a work-queue mirror of the log, filtered by its consumer. No
    limits of its own: a full mirror stalls for good (checked on nats-server 2.15), so the
    group's buffered limits stay on the log."""
    wq = wq_config["name"]
    return {
        "name": partition_stream(wq, p),
        "retention": "workqueue",
        "num_replicas": partition_replicas(wq_config),
        "storage": wq_config.get("storage") or "file",
        "allow_direct": True,
        "mirror": {"name": partition_log(wq),
                   "consumer": {"name": mirror_consumer(p), "deliver_subject": mirror_subject(wq, p)}},
        "metadata": {PARTITION_OF_KEY: f"{wq} {p}"},
    }


async def log_config(api: JsApi, wq: str) -> dict | None:
    """The partition log's config (None: there is none)."""
    try:
        return (await api.stream_info(partition_log(wq)))["config"]
    except JetStreamApiError as e:
        if e.err_code != ERR_STREAM_NOT_FOUND:
            raise
        return None


async def delete_partition_log(api: JsApi, wq: str) -> None:
    """Delete ``wq``'s partition log (with the mirrors' consumers), if it is one: a stream of
    that name made otherwise (another group's work queue) is left alone."""
    cfg = await log_config(api, wq)
    if cfg is not None and (cfg.get("metadata") or {}).get(LOG_OF_KEY) == wq:
        await api.delete_stream(partition_log(wq))


async def ensure_partition_log(api: JsApi, wq_cfg: dict, source: dict) -> dict:
    """Create (or find) the partition log of ``wq_cfg``'s work queue, sourcing with ``source``."""
    want = partition_log_config(wq_cfg, source)
    try:
        return (await api.add_stream(want))["config"]
    except JetStreamApiError as e:
        if e.err_code != ERR_STREAM_NAME_IN_USE:
            raise
    have = await wq_config(api, want["name"])
    if (have.get("metadata") or {}).get(LOG_OF_KEY) != wq_cfg["name"]:
        raise LayoutError(f"stream {want['name']!r} exists and is not the partition log of {wq_cfg['name']!r}; "
                          "rename or remove it")
    return have


async def ensure_partition_streams(api: JsApi, wq_cfg: dict, partitions: Iterable[int] | int) -> None:
    """Create (or find) every partition's mirror consumer on the log and its stream."""
    wq = wq_cfg["name"]
    log_name = partition_log(wq)
    for p in range(partitions) if isinstance(partitions, int) else partitions:
        cc = mirror_consumer_config(p, wq)
        have = await api.consumer_info(log_name, cc["name"])  # made already: left as it is
        try:
            if have is None:
                await api.create_consumer(log_name, cc, action="create")
        except JetStreamApiError as e:
            if e.err_code != ERR_CONSUMER_EXISTS:
                raise
            have = await api.consumer_info(log_name, cc["name"])
        except ServerUnavailable:  # no answer in time (a cluster that lost a node elects its leader): look
            have = await _await_consumer(api, log_name, cc["name"])
        if have is not None and not _ours(have, cc):
            raise LayoutError(f"consumer {cc['name']!r} on {log_name!r} exists with another config; delete it "
                              "(it is not this group's partition mirror)")
        want = partition_stream_config(wq_cfg, p)
        try:
            await api.add_stream(want)
        except JetStreamApiError as e:
            if e.err_code != ERR_STREAM_NAME_IN_USE:
                raise
            have = await wq_config(api, want["name"])
            if (have.get("mirror") or {}).get("name") != log_name or \
                    (have.get("metadata") or {}).get(PARTITION_OF_KEY) != f"{wq} {p}":
                raise LayoutError(f"stream {want['name']!r} exists and is not partition {p} of {wq!r}; "
                                  "rename or remove it") from None


async def rebuild_partition_stream(api: JsApi, wq_cfg: dict, p: int) -> None:
    """Partition ``p``'s stream made again from the log: the stream and its mirror consumer
    deleted and created anew, so the mirror moves the log's messages of ``p`` (every one not
    yet landed) into it in sequence order."""
    wq = wq_cfg["name"]
    name, log_name = partition_stream(wq, p), partition_log(wq)

    async def stream_gone() -> bool:
        await api.delete_stream(name)
        try:
            await api.stream_info(name)
        except JetStreamApiError as e:
            if e.err_code == ERR_STREAM_NOT_FOUND:
                return True
            raise
        return False

    async def consumer_gone() -> bool:
        await api.delete_consumer(log_name, mirror_consumer(p))
        return await api.consumer_info(log_name, mirror_consumer(p)) is None

    await _until_gone(stream_gone)
    await _until_gone(consumer_gone)
    await ensure_partition_streams(api, wq_cfg, [p])


async def _until_gone(gone: Callable[[], Awaitable[bool]], timeout: float = 30.0) -> None:
    """Delete and look again until ``gone()``. A stream or consumer whose only server is gone
    for good (a replacement node under another name) answers nothing, its deletion neither;
    the meta leader removes it all the same (checked on 2.15.1: a stream made again at once,
    on another server)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if await gone():
                return
        except ServerUnavailable:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.5)


async def _await_consumer(api: JsApi, stream: str, name: str, timeout: float = 30.0) -> dict:
    """The consumer a create request made without answering in time, once it answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            have = await api.consumer_info(stream, name)
            if have is not None:
                return have
        except ServerUnavailable:
            pass
        if time.monotonic() > deadline:
            raise LayoutError(f"consumer {name!r} on {stream!r} was asked for and does not answer after "
                              f"{timeout:.0f}s: run the command again")
        await asyncio.sleep(0.5)


async def drop_unserved_consumers(api: JsApi, wq: str) -> list[str]:
    """Delete the consumers on the work queue that no server answers for (their server gone for
    good): in this layout they are only the members' pin tokens, which the members' next jobs
    make again. Returns their names."""
    out = []
    for c in await api.list_consumers(wq):
        name = c.get("name", "")
        try:
            await api.consumer_info(wq, name)
        except ServerUnavailable:
            async def gone(name: str = name) -> bool:
                await api.delete_consumer(wq, name)
                return await api.consumer_info(wq, name) is None
            await _until_gone(gone)
            out.append(name)
    return out


def _ours(info: dict | None, want: dict) -> bool:
    """Whether an existing consumer is this partition's mirror consumer."""
    cfg = (info or {}).get("config") or {}
    return all(cfg.get(k) == want[k] for k in ("filter_subject", "deliver_subject", "ack_policy"))


async def stop_mirrors(api: JsApi, wq: str) -> int:
    """Delete the mirror consumers a group made by an earlier version left on its work queue
    (its partition streams mirrored the work queue then)."""
    n = 0
    for c in await api.list_consumers(wq):
        if is_mirror_consumer(c.get("name", "")):
            n += await api.delete_consumer(wq, c["name"])
    return n


async def _stored(api: JsApi, stream: str) -> int | None:
    """Messages stored in ``stream`` (None: it does not exist)."""
    try:
        return int((await api.stream_info(stream))["state"]["messages"])
    except JetStreamApiError as e:
        if e.err_code != ERR_STREAM_NOT_FOUND:
            raise
        return None


async def partition_streams_left(api: JsApi, wq: str, partitions: int) -> dict[int, int]:
    """Messages still stored in each partition stream that exists."""
    out = {p: await _stored(api, partition_stream(wq, p)) for p in range(partitions)}
    return {p: n for p, n in out.items() if n is not None}


async def counts_of(api: JsApi, stream: str, partitions: Iterable[int]) -> dict[int, int]:
    """Per partition, its messages in ``stream`` ({} when the stream is empty or missing), from
    the stream's per-subject counts (``<p>.<subject>``)."""
    if not await _stored(api, stream):
        return {}
    info = await api.stream_info(stream, subjects_filter=">")
    return count_partitions(dict.fromkeys(partitions, 0), info["state"].get("subjects") or {})


async def log_left(api: JsApi, wq: str, partitions: Iterable[int]) -> dict[int, int]:
    """Per partition, the messages the log holds (not yet landed); {} when there is none."""
    return await counts_of(api, partition_log(wq), partitions)


async def work_queue_left(api: JsApi, wq: str, partitions: Iterable[int]) -> dict[int, int]:
    """Per partition, the messages the work queue holds (pin anchors are not partitions')."""
    return await counts_of(api, wq, partitions)


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
    """The partition streams, the log (with the mirrors' consumers) and an earlier version's
    mirror consumers on the work queue."""
    await stop_mirrors(api, wq)
    for name in await partition_streams_of(api, wq):
        await api.delete_stream(name)
    await delete_partition_log(api, wq)


async def partition_backlog(api: JsApi, wq: str, partitions: Iterable[int],
                            problems: dict[int, str] | None = None,
                            mirrored: bool = True) -> dict[int, int]:
    """Per partition, what the log holds of it: every message not yet landed, whether its
    stream holds it yet or not (a partition stream is only a read path). With ``problems``,
    each partition stream's health is looked at too (``partition_stream_problem``)."""
    partitions = list(partitions)
    if problems is not None:
        problems.update(await partition_stream_problems(api, wq, partitions, mirrored=mirrored))
    try:
        left = await log_left(api, wq, partitions)
        if not left and await log_config(api, wq) is None:  # an earlier version's streams: what they hold
            left = await partition_streams_left(api, wq, len(partitions) and max(partitions) + 1)
        return {p: left.get(p, 0) for p in partitions}
    except ConsumerGroupError as e:
        if problems is None:
            raise
        for p in partitions:
            problems.setdefault(p, f"its log {partition_log(wq)} is unavailable ({e})")
        return dict.fromkeys(partitions, 0)


#: a mirror with messages to move that has not heard from the log for this long is stalled
MIRROR_STALLED_NS = 15_000_000_000

LOST = "lost messages"  # how a partition stream behind its log is named (``Lost.of``)


async def partition_stream_problem(api: JsApi, wq: str, p: int, mirror_info: dict | None = None,
                                   timeout: float = 5.0, mirrored: bool = True) -> str | None:
    """Why partition ``p``'s stream is not current, or None when it is: it does not answer, has
    no leader (a cluster lost its quorum), its mirror reports an error or has stalled, or it
    lost messages its log holds (its server's disk lost, a replacement node). (A replica
    catching up is no problem: the leader serves; a rebuilt stream filling up neither.)"""
    name = partition_stream(wq, p)
    try:
        info = await api.request(f"STREAM.INFO.{name}", timeout=timeout)
    except JetStreamApiError as e:
        if e.err_code == ERR_STREAM_NOT_FOUND:
            return f"{MISSING} (its member's next job makes it again from the log, or: cg layout ... partition-streams)"
        return f"unavailable ({e.description})"
    except ConsumerGroupError as e:  # no answer: no server holds it, or none can answer
        return f"unavailable ({e})"
    cluster = info.get("cluster") or {}
    if cluster and not cluster.get("leader"):
        offline = [r.get("name") for r in cluster.get("replicas") or () if r.get("offline")]
        return "no leader" + (f" (replicas offline: {', '.join(offline)})" if offline else " (no quorum)")
    mirror = info.get("mirror") or {}
    if not mirrored or mirror.get("name") != partition_log(wq):  # or an earlier version's, mirroring the work queue
        return None
    if mirror.get("error"):
        return f"its mirror failed ({(mirror['error'] or {}).get('description') or mirror['error']})"
    try:
        if mirror_info is None:
            mirror_info = await api.consumer_info(partition_log(wq), mirror_consumer(p))
    except ServerUnavailable as e:  # the log answers (or the problem is the log's): its mirror consumer's server is away
        return f"unavailable: its mirror consumer {mirror_consumer(p)!r} on {partition_log(wq)!r} does not answer ({e})"
    except ConsumerGroupError as e:
        return f"its log {partition_log(wq)} is unavailable ({e})"
    try:
        if mirror_info is None:
            return f"{MIRROR_MISSING} ({mirror_consumer(p)!r} on {partition_log(wq)!r})"
        state = info.get("state") or {}
        first = int(state.get("first_seq") or 0) if int(state.get("messages") or 0) else None
        lost = await lost_from(api, partition_log(wq), mirror_consumer(p), p, 1, first, mirror_info)
    except ConsumerGroupError as e:
        return f"its log {partition_log(wq)} is unavailable ({e})"
    if lost is not None:
        return (f"{LOST}: the log {partition_log(wq)} holds sequence {lost} not landed and the stream does not "
                "(its server's store was lost?); its member's next job rebuilds it from the log, or: cg layout "
                "... partition-streams")
    pending = int(mirror_info.get("num_pending") or 0)
    active = int(mirror.get("active") or 0)
    if pending and active > MIRROR_STALLED_NS:
        return f"its mirror stalled ({pending} messages to move, none for {active / 1e9:.0f} s)"
    return None


async def partition_stream_problems(api: JsApi, wq: str, partitions: Iterable[int],
                                    mirrored: bool = True) -> dict[int, str]:
    """``partition_stream_problem`` of each partition (only those that have one)."""
    out: dict[int, str] = {}
    for p in partitions:
        why = await partition_stream_problem(api, wq, p, mirrored=mirrored)
        if why is not None:
            out[p] = why
    return out


MISSING = "missing"  # a partition stream that does not exist
MIRROR_MISSING = "its mirror consumer is missing"
UNSERVED = ("unavailable", "no leader")  # a partition stream no server serves now


def rebuilds(why: str) -> bool:
    """Whether a partition stream's problem (``partition_stream_problem``) is one a rebuild
    from the log heals: it or its mirror consumer missing, or lost messages."""
    return why.startswith((LOST, MISSING, MIRROR_MISSING))


async def rebuild_lost(api: JsApi, wq: str, partitions: Iterable[int], unavailable: bool = False) -> list[int]:
    """Rebuild from the log every partition stream of ``partitions`` that is missing or lost
    messages (``rebuilds``), and with ``unavailable`` also those no server serves (an operator's
    word that their server is not coming back: made again on one that is); the partitions
    rebuilt."""
    cfg = await wq_config(api, wq)
    out = []
    for p in partitions:
        why = await partition_stream_problem(api, wq, p)
        if why is not None and (rebuilds(why) or unavailable and why.startswith(UNSERVED)):
            await rebuild_partition_stream(api, cfg, p)
            out.append(p)
    return out


def check_server(nc: NATS) -> None:
    if server_version(nc) < DURABLE_SOURCING_VERSION:
        v = ".".join(map(str, server_version(nc)))
        raise ConfigError("layout", f"{PARTITION_STREAMS} needs nats-server 2.14 or later (durable mirroring); "
                                    f"the server is {v}")


# --- handing the source between the work queue and the log ------------------------------------


def _plain_source(source: dict) -> dict:
    return {k: v for k, v in source.items() if k not in ("opt_start_seq", "opt_start_time")}


async def hand_source_to_log(api: JsApi, wq_cfg: dict) -> dict:
    """The work queue's source moved to the partition log at a cut: the work queue stops
    sourcing (the stop recorded on it, ``sourcing.py``), the log starts after the cut, then the
    record goes. Every step can be run again after a kill. Returns the work queue's config."""
    wq = wq_cfg["name"]
    have = await log_config(api, wq)
    if have is not None and have.get("sources"):
        return wq_cfg  # handed over already (the record cleared below, unless killed before)
    stopped = sourcing.stopped_state(wq_cfg)
    if stopped is None:
        stopped = await sourcing.stop(api, wq, intent={"layout": PARTITION_STREAMS})
    elif stopped.intent.get("layout") != PARTITION_STREAMS:
        raise LayoutError(f"a reset or resize of {wq!r} is under way (its sourcing is stopped): finish it first")
    source = {**_plain_source(stopped.source), "opt_start_seq": stopped.cut + 1}
    if have is None:
        await ensure_partition_log(api, stopped.config, source)
    else:  # the log made by an earlier try, or left by a move back: source from the cut
        await api.request(f"STREAM.UPDATE.{partition_log(wq)}", {**have, "sources": [source]})
    cfg = await wq_config(api, wq)
    md = {k: v for k, v in (cfg.get("metadata") or {}).items() if k != sourcing.STOPPED_KEY}
    return (await api.request(f"STREAM.UPDATE.{wq}", {**cfg, "metadata": md}))["config"]


async def hand_source_to_work_queue(api: JsApi, wq_cfg: dict, *, undo: bool = False) -> None:
    """The log's source moved back to the work queue: the log stops sourcing at a cut (recorded
    on the log), the work queue sources from after it. ``undo``: from where the log started (a
    move into the layout taken back before the log's messages were landed: the work queue
    sources them again, after what it holds). Can be run again after a kill."""
    wq = wq_cfg["name"]
    if wq_cfg.get("sources"):
        return
    log_cfg = await log_config(api, wq)
    if log_cfg is None:
        raise LayoutError(f"{wq!r} has no source and its partition log {partition_log(wq)!r} is missing: create "
                          "the group again (same config) to restore its source")
    stopped = sourcing.stopped_state(log_cfg)
    if stopped is None:
        if not log_cfg.get("sources"):
            raise LayoutError(f"neither {wq!r} nor its partition log sources the origin: create the group again "
                              "(same config) to restore it")
        stopped = await sourcing.stop(api, partition_log(wq), intent={"layout": WORK_QUEUE})
    start = int(stopped.source.get("opt_start_seq") or 1) if undo else stopped.cut + 1
    await sourcing.resume(api, wq, sourcing.Stopped(wq_cfg, _plain_source(stopped.source), stopped.cut, {}), start)


async def _wait_empty(count: Callable[[], Awaitable[dict[int, int]]], deadline: float) -> dict[int, int]:
    """Poll ``count()`` (per partition) until nothing is left or ``deadline`` (monotonic)."""
    while True:
        left = {p: n for p, n in (await count()).items() if n}
        if not left or time.monotonic() >= deadline:
            return left
        await asyncio.sleep(min(1.0, max(0.05, deadline - time.monotonic())))


class PartitionStreams(Layout):
    """Members read a stream per partition, fed by its mirror of the log; the member consumer on
    the work queue holds only the member's pin subject."""

    name = PARTITION_STREAMS
    reads_partition_streams = True
    has_partition_streams = True
    mirrored = True
    elastic_only = True

    def member_filters(self, config: GroupConfig, member: str, wq: str | None = None) -> list[str]:
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

    def check_server(self, nc: NATS) -> None:
        check_server(nc)

    def creation_source(self, wq_cfg: dict) -> tuple[dict, dict | None]:
        """A group created in this layout: its log sources the origin, its work queue nothing."""
        source = (wq_cfg.get("sources") or [None])[0]
        return self.work_queue_config({**wq_cfg, "sources": []}), source

    async def prepare(self, api: JsApi, wq: str, partitions: int, deadline: float, source: dict | None = None) -> None:
        cfg = await self.record(api, wq)
        if source is not None:
            await ensure_partition_log(api, cfg, source)
        await ensure_partition_streams(api, cfg, partitions)
        await rebuild_lost(api, wq, range(partitions))

    def check_repartition(self, what: str, stream: str, group: str) -> None:
        """``reset`` and ``resize`` move work-queue positions and partition tokens; they are not
        built for partition streams: say how to get there."""
        raise ConfigError("layout", f"a {what} needs the work-queue layout and group {group!r} is in the {self.name} "
                                    f"layout: cg layout {stream} {group} {WORK_QUEUE} first (it waits until the "
                                    f"partition streams are landed), then {what}, then move it back")

    def partition_readers(self, nc: NATS, wq: str, partitions: tuple[int, ...], js_prefix: str
                          ) -> PartitionStreamReaders | None:
        return PartitionStreamReaders(nc, {p: partition_stream(wq, p) for p in partitions}, log=partition_log(wq),
                                      mirrors={p: mirror_consumer(p) for p in partitions}, js_prefix=js_prefix)

    def partition_store(self, wq: str, partition: int) -> str:
        return partition_stream(wq, partition)

    def sourcing_stream(self, wq: str) -> str:
        return partition_log(wq)

    async def rebuild(self, api: JsApi, wq: str, partition: int) -> None:
        await rebuild_partition_stream(api, await wq_config(api, wq), partition)

    def rebuilds(self, why: str) -> bool:
        return rebuilds(why)

    async def backlog(self, api: JsApi, wq: str, wq_subjects: dict[str, int], partitions: Iterable[int],
                      problems: dict[int, str] | None = None) -> dict[int, int]:
        partitions = list(partitions)
        counts = dict.fromkeys(partitions, 0)
        counts.update(await partition_backlog(api, wq, partitions, problems=problems, mirrored=self.mirrored))
        return counts

    async def problems(self, api: JsApi, wq: str, partitions: tuple[int, ...]) -> dict[int, str]:
        return await partition_stream_problems(api, wq, partitions, mirrored=self.mirrored)

    async def oldest(self, api: JsApi, wq: str, partition: int, problems: dict[int, str]) -> Any:
        """The log's first message of the partition (the oldest not landed, wherever its stream is)."""
        try:
            return await api.next_msg(partition_log(wq), 1, f"{partition}.>")
        except ConsumerGroupError:
            return None

    async def enter(self, moves: Mover, stream: str, group: str, have: Layout, wq_cfg: dict, partitions: int,
                    deadline: float, replicas: int | None) -> LayoutMove:
        """From ``work-queue``: record ``filling``, hand the source to the log at a cut, make the
        partition streams, then wait (until ``deadline``) for the members to land the work
        queue; once it is landed, record this layout and drop the members' partition consumers
        (their jobs' next runs read the partition streams). Already in the layout: rebuild what
        is missing or lost (``rebuild_lost``). From ``draining``: take the move back."""
        self.check_server(moves.nc)
        api, wq = moves.api, wq_cfg["name"]
        if replicas is not None and have.has_partition_streams and partition_replicas(wq_cfg) != replicas:
            raise ConfigError("partition_replicas", f"the partition streams exist with {partition_replicas(wq_cfg)} "
                                                    "replicas: move the group to work-queue first to change them")
        if have.name == PARTITION_STREAMS:  # again: what is missing, lost or unserved is made again from the log
            await rebuild_lost(api, wq, range(partitions), unavailable=True)
            await ensure_partition_streams(api, wq_cfg, partitions)
            await drop_unserved_consumers(api, wq)
            return LayoutMove(stream, group, self.name, True)
        if have.name == DRAINING:
            return await self._resume(moves, stream, group, wq_cfg, partitions)
        if have.name != FILLING or replicas is not None:
            wq_cfg = await FILLING_LAYOUT.record(api, wq, replicas)
        wq_cfg = await hand_source_to_log(api, wq_cfg)
        await ensure_partition_streams(api, wq_cfg, partitions)
        left = await _wait_empty(lambda: work_queue_left(api, wq, range(partitions)), deadline)
        if left:
            return LayoutMove(stream, group, FILLING, False, left)
        await self.record(api, wq)
        await moves.drop_member_consumers(wq, partition_filters=True)
        return LayoutMove(stream, group, self.name, True)

    async def _resume(self, moves: Mover, stream: str, group: str, wq_cfg: dict, partitions: int) -> LayoutMove:
        """A move back to ``work-queue`` taken back while draining: what the work queue sourced
        since is purged (none of it was landed: members read the log) and the log sources it
        again, after what it holds."""
        api, wq = moves.api, wq_cfg["name"]
        log_cfg = await log_config(api, wq)
        stopped = sourcing.stopped_state(log_cfg or {})
        if log_cfg is None or stopped is None:
            raise LayoutError(f"the partition log of {wq!r} is missing or sources: move the group to "
                              f"{WORK_QUEUE} first")
        if wq_cfg.get("sources"):
            wq_cfg = (await api.request(f"STREAM.UPDATE.{wq}", {**wq_cfg, "sources": []}))["config"]
        for p in range(partitions):
            await api.request(f"STREAM.PURGE.{wq}", {"filter": f"{p}.>"})
        await sourcing.resume(api, partition_log(wq), stopped, stopped.cut + 1)
        await ensure_partition_streams(api, wq_cfg, partitions)
        await self.record(api, wq)
        return LayoutMove(stream, group, self.name, True)

    async def drain(self, api: JsApi, wq: str, partitions: int, deadline: float) -> dict[int, int]:
        """Hand the source back to the work queue (state ``draining``) and wait until members
        landed everything the log holds, or ``deadline`` (monotonic): what is left per
        partition ({} once all is landed)."""
        cfg = await wq_config(api, wq)
        if self.name != DRAINING:
            cfg = await DRAINING_LAYOUT.record(api, wq)
        if await log_config(api, wq) is None:  # an earlier version's: the partition streams mirror the work queue
            await stop_mirrors(api, wq)
            return await _wait_empty(lambda: partition_streams_left(api, wq, partitions), deadline)
        await hand_source_to_work_queue(api, cfg)
        return await _wait_empty(lambda: log_left(api, wq, range(partitions)), deadline)


class Filling(PartitionStreams):
    """On the way into partition streams: members land what the work queue holds (they read it
    as in ``work-queue``) while new messages gather in the log."""

    name = FILLING
    chosen = False
    reads_partition_streams = False

    def member_filters(self, config: GroupConfig, member: str, wq: str | None = None) -> list[str]:
        return Layout.member_filters(self, config, member, wq)

    def partition_readers(self, nc: NATS, wq: str, partitions: tuple[int, ...], js_prefix: str) -> None:
        return None

    async def backlog(self, api: JsApi, wq: str, wq_subjects: dict[str, int], partitions: Iterable[int],
                      problems: dict[int, str] | None = None) -> dict[int, int]:
        return count_partitions(await super().backlog(api, wq, wq_subjects, partitions, problems), wq_subjects)

    async def oldest(self, api: JsApi, wq: str, partition: int, problems: dict[int, str]) -> Any:
        return await Layout.oldest(self, api, wq, partition, problems) or \
            await super().oldest(api, wq, partition, problems)


class Draining(PartitionStreams):
    """On the way back to the work queue: members land what the log holds (through the partition
    streams) while new messages wait in the work queue."""

    name = DRAINING
    chosen = False

    def sourcing_stream(self, wq: str) -> str:
        return wq  # handed back

    async def backlog(self, api: JsApi, wq: str, wq_subjects: dict[str, int], partitions: Iterable[int],
                      problems: dict[int, str] | None = None) -> dict[int, int]:
        return count_partitions(await super().backlog(api, wq, wq_subjects, partitions, problems), wq_subjects)

    async def oldest(self, api: JsApi, wq: str, partition: int, problems: dict[int, str]) -> Any:
        return await super().oldest(api, wq, partition, problems) or \
            await Layout.oldest(self, api, wq, partition, problems)


PARTITION_STREAMS_LAYOUT = PartitionStreams()
FILLING_LAYOUT = Filling()
DRAINING_LAYOUT = Draining()
