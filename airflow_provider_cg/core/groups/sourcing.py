"""Stopping and resuming an elastic group's sourcing (``reset``, ``resize``), and its health.

The work-queue stream sources the origin in order; a stop removes its source, a resume adds
one back with ``opt_start_seq`` (checked on nats-server 2.15: a source added to a work queue
holding none of its messages starts there; one holding some resumes after the last).

The *cut* is the last origin sequence sourced before the stop. It is exact when the work queue
still stores its last sourced message; otherwise it is the source's ``seq`` read just before
the stop (the server omits it while nothing was sourced since the source was added: then the
source's start), which can only be lower: resuming from a lower cut sources a few messages
twice, which the sinks drop (they hold them), never skips one. Checked on nats-server 2.15.

Health. The server's own ``lag`` of a source is what its consumer last reported: after the
origin's server was lost, nats-server re-creates that consumer with a back-off of up to two
minutes, and meanwhile the reported lag can read 0 while the origin holds messages the group
has not taken. So the true source lag (``not_taken``) counts the origin's messages on the
group's filters after the last one sourced (the source's ``seq``), and a source that has them
but has been silent for longer than the server's own health check (``stalled``) is restarted
at once (``restart``: a stop and a resume after the exact cut) rather than waited out.

The stop and what it was for are recorded in the work queue's ``metadata`` in the same update
(``cg.sourcing.stopped``), so a tool killed part way leaves a state the next run (or ``cg
reset/resize --execute`` again) can finish, and ``create`` recognises the stopped stream as
the group's own.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from dataclasses import dataclass
from typing import Any

from airflow_provider_cg.core.errors import ConsumerGroupError
from airflow_provider_cg.core.jetstream.api import JsApi

STOPPED_KEY = "cg.sourcing.stopped"
#: seconds a source with messages to take may stay silent (nats-server's source health check interval)
STALLED_AFTER_S = 10.0
RESTART = "restart"
_SOURCE = re.compile(rb"Nats-Stream-Source: *[^ \r]+ (\d+)")


class SourcingError(ConsumerGroupError):
    """Sourcing could not be stopped or resumed as asked (the message says how to go on)."""


def origin_seq(msg: dict) -> int:
    """The origin sequence of a stored work-queue message (its ``Nats-Stream-Source``)."""
    m = _SOURCE.search(base64.b64decode(msg.get("hdrs") or b""))
    if m is None:
        raise SourcingError(f"work-queue message {msg.get('seq')} has no Nats-Stream-Source header")
    return int(m.group(1))


@dataclass(frozen=True)
class Stopped:
    """A stopped work queue: its config without the source, the source as it was, the cut and
    what the stop is for (``intent``: JSON-able, e.g. the resize's new partition count)."""

    config: dict
    source: dict
    cut: int
    intent: dict

    def to_metadata(self) -> str:
        return json.dumps({"source": self.source, "cut": self.cut, "intent": self.intent}, separators=(",", ":"))


def stopped_state(stream_config: dict) -> Stopped | None:
    """The stop recorded on a work-queue stream's config, if any."""
    raw = (stream_config.get("metadata") or {}).get(STOPPED_KEY)
    if not raw:
        return None
    data = json.loads(raw)
    return Stopped(stream_config, data["source"], int(data["cut"]), data.get("intent") or {})


async def last_sourced(api: JsApi, wq: str) -> int | None:
    """The last origin sequence the running source reports (``sources[0].seq``), or None."""
    sources = (await api.stream_info(wq)).get("sources") or []
    return int(sources[0]["seq"]) if sources and "seq" in sources[0] else None


async def stop(api: JsApi, wq: str, intent: dict) -> Stopped:
    """Remove the work queue's source, recording the stop; returns it with its cut."""
    info = await api.stream_info(wq)
    config = info["config"]
    if stopped_state(config) is not None:
        raise SourcingError(f"sourcing of {wq!r} is already stopped by another reset or resize; run that one "
                            "again to finish it")
    sources = config.get("sources") or []
    if len(sources) != 1:
        raise SourcingError(f"the work-queue stream {wq!r} has {len(sources)} sources, not one")
    before = await last_sourced(api, wq)
    if before is None:  # omitted while nothing was sourced since the source was (re)added
        before = max(int(sources[0].get("opt_start_seq") or 1) - 1, 0)
    lower = before
    pending = Stopped(config, sources[0], lower, intent)
    updated = {**config, "sources": [], "metadata": {**(config.get("metadata") or {}),
                                                     STOPPED_KEY: pending.to_metadata()}}
    await api.request(f"STREAM.UPDATE.{wq}", updated)
    cut = await _exact_cut(api, wq, lower)
    stopped = Stopped(updated, sources[0], cut, intent)
    if cut != lower:
        await api.request(f"STREAM.UPDATE.{wq}", {**updated, "metadata": {
            **updated["metadata"], STOPPED_KEY: stopped.to_metadata()}})
    return stopped


async def _exact_cut(api: JsApi, wq: str, lower: int) -> int:
    """With the source gone: the origin sequence of the queue's last sourced message when it is
    still stored (exact), else ``lower``."""
    state = (await api.stream_info(wq))["state"]
    last = int(state.get("last_seq", 0))
    if int(state.get("messages", 0)) and last:
        msg = await api.get_msg(wq, last)
        if msg is not None:
            return max(origin_seq(msg), lower)
    return lower


async def resume(api: JsApi, wq: str, stopped: Stopped, from_seq: int,
                 subject_transforms: list[dict] | None = None) -> None:
    """Add the source back, starting at origin ``from_seq`` (with new transforms for a resize),
    and clear the record of the stop."""
    source: dict[str, Any] = {k: v for k, v in stopped.source.items() if k not in ("opt_start_time", "opt_start_seq")}
    if subject_transforms is not None:
        source["subject_transforms"] = subject_transforms
    source["opt_start_seq"] = max(int(from_seq), 1)
    metadata = {k: v for k, v in (stopped.config.get("metadata") or {}).items() if k != STOPPED_KEY}
    config = {**stopped.config, "sources": [source], "metadata": metadata}
    if not metadata:
        config.pop("metadata")
    await api.request(f"STREAM.UPDATE.{wq}", config)


async def await_sourced(api: JsApi, wq: str, through: int, timeout: float = 120.0) -> None:
    """Wait until the resumed source reports origin ``through`` sourced."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (await last_sourced(api, wq) or 0) < through:
        if loop.time() > deadline:
            raise SourcingError(f"{wq!r} did not source through origin sequence {through} within {timeout:.0f}s")
        await asyncio.sleep(0.05)


async def record(api: JsApi, wq: str, stopped: Stopped, **intent: Any) -> Stopped:
    """Add to the stop's record (e.g. where to resume) before a step that needs it."""
    now = Stopped(stopped.config, stopped.source, stopped.cut, {**stopped.intent, **intent})
    config = {**stopped.config, "metadata": {**(stopped.config.get("metadata") or {}), STOPPED_KEY: now.to_metadata()}}
    await api.request(f"STREAM.UPDATE.{wq}", config)
    return Stopped(config, now.source, now.cut, now.intent)


async def current_stop(api: JsApi, wq: str) -> Stopped | None:
    return stopped_state((await api.stream_info(wq))["config"])


async def await_caught_up(api: JsApi, wq: str, timeout: float = 60.0) -> None:
    """Wait until the running source reports no lag (what the origin holds is in the queue)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        sources = (await api.stream_info(wq)).get("sources") or []
        if not sources or int(sources[0].get("lag", 0)) == 0:
            return
        if loop.time() > deadline:
            raise SourcingError(f"{wq!r} is still {sources[0].get('lag')} message(s) behind its origin after "
                                f"{timeout:.0f}s; nothing was skipped: run the reset again")
        await asyncio.sleep(0.05)


async def not_taken(api: JsApi, origin: str, taken: int, filters: list[str], last_seq: int) -> int:
    """The origin's messages on the group's ``filters`` (its partitioning filters; none: all of
    them) after origin sequence ``taken``: what its sourcing stream has not taken yet. Counted by
    the server where the origin serves direct gets, else bounded by its ``last_seq``."""
    if last_seq <= taken:
        return 0
    total = 0
    for f in filters or [">"]:
        first = await api.next_msg(origin, taken + 1, f)
        if first is None:
            continue
        counted = await api.count_from(origin, int(first["seq"]), f)
        total += counted if counted is not None else last_seq - int(first["seq"]) + 1
    return total


def source_taken(source: dict) -> int:
    """The last origin sequence a running source reports sourced (0 before the first)."""
    seq = source.get("seq")
    return int(seq) if seq is not None else max(int(source.get("opt_start_seq") or 1) - 1, 0)


def stalled(source: dict, lag: int, still_for: float = 0.0) -> str | None:
    """Why a source with ``lag`` messages to take is stalled (None: it is not): it reports an
    error, nothing was heard from it for longer than ``STALLED_AFTER_S``, or (``still_for``,
    as its watcher saw) its stream stored nothing for that long: a source the server hears from
    can still deliver nothing (seen after a restart while the server's own retry was pending)."""
    if lag <= 0:
        return None
    error = source.get("error")
    if error:
        return f"its source reports {error.get('description') or error} while the origin holds {lag:,} messages for it"
    active = int(source.get("active", 0))  # nanoseconds since it was last heard from; -1: never
    if active < 0 or active > STALLED_AFTER_S * 1e9:
        silent = "never heard from" if active < 0 else f"silent for {active / 1e9:.0f}s"
    elif still_for > STALLED_AFTER_S:
        silent = f"storing nothing for {still_for:.0f}s"
    else:
        return None
    return (f"the origin holds {lag:,} messages its source has not taken, and the source is {silent} (nats-server "
            "retries with a back-off of up to 2 minutes)")


async def restart(api: JsApi, name: str) -> int:
    """Start the source of ``name`` (the work queue, or the partition log) again: removed and
    added back after the exact cut, so it resumes at once with nothing skipped. A restart that
    was cut short (its stop recorded) is finished. Returns the origin sequence it resumes after."""
    stopped = await current_stop(api, name)
    if stopped is None:
        stopped = await stop(api, name, {"op": RESTART})
    elif stopped.intent.get("op") != RESTART:
        raise SourcingError(f"sourcing of {name!r} is stopped by an unfinished {stopped.intent.get('op')}: run it again")
    await resume(api, name, stopped, stopped.cut + 1)
    return stopped.cut


async def holds_origin_seq(api: JsApi, name: str, seq: int, subject: str, scan: int = 10_000) -> bool:
    """Whether the sourcing stream ``name`` holds origin message ``seq`` (stored on ``subject``),
    looked up among its messages of that subject (any partition token) in order."""
    at = 1
    for _ in range(scan):
        msg = await api.next_msg(name, at, f"*.{subject}")
        if msg is None:
            return False
        found = origin_seq(msg)
        if found >= seq:
            return found == seq
        at = int(msg["seq"]) + 1
    return False


async def passed_without(api: JsApi, name: str, origin: str, after: int, filters: list[str]) -> int | None:
    """Whether the sourcing stream ``name`` went past origin sequence ``after`` without the
    origin's messages there now (an origin restored older than what it had sourced: nats-server
    resumes a source after the last sequence it took, so it would never take them). Returns the
    last sequence it took then; None when it takes them (it did not get that far, or holds the
    first of them)."""
    info = await api.stream_info(name)
    stop = stopped_state(info.get("config") or {})
    sources = info.get("sources") or []
    if stop is not None:
        taken = stop.cut
    elif sources:
        taken = source_taken({**((info.get("config") or {}).get("sources") or [{}])[0], **sources[0]})
    else:
        return None
    if taken <= after:
        return None
    firsts = [m for m in [await api.next_msg(origin, after + 1, f) for f in filters or [">"]] if m is not None]
    if firsts:
        first = min(firsts, key=lambda m: int(m["seq"]))
        if int(first["seq"]) <= taken and await holds_origin_seq(api, name, int(first["seq"]), first["subject"]):
            return None
    return taken
