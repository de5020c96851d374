"""Stopping and resuming an elastic group's sourcing, for ``reset`` and ``resize``.

The work-queue stream sources the origin in order; a stop removes its source, a resume adds
one back with ``opt_start_seq`` (checked on nats-server 2.15: a source added to a work queue
holding none of its messages starts there; one holding some resumes after the last).

The *cut* is the last origin sequence sourced before the stop. It is exact when the work queue
still stores its last sourced message; otherwise it is the source's ``seq`` read just before
the stop (the server omits it while nothing was sourced since the source was added: then the
source's start), which can only be lower: resuming from a lower cut sources a few messages
twice, which the sinks drop (they hold them), never skips one. Checked on nats-server 2.15.

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
