"""Bulk publishing into a stream with every message acknowledged by JetStream.

Core publishes to a stream subject are dropped when the server cannot keep up, and
nats-py's ``js.publish`` waits for each ack in turn. ``publish_many`` keeps a window of
publishes in flight, each with a reply subject under one wildcard inbox, so a million
messages land quickly and none is lost silently: a publish whose ack does not come back
(or comes back with an error) is sent again, with its ``Nats-Msg-Id`` when one was given.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_cg.core.errors import ConsumerGroupError

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg


@dataclass
class PublishResult:
    published: int
    retried: int
    first_seq: int | None
    last_seq: int | None


async def publish_many(
    nc: NATS,
    messages: Iterable[tuple[str, bytes] | tuple[str, bytes, dict[str, str]]],
    *,
    window: int = 20_000,
    ack_timeout: float = 10.0,
    max_attempts: int = 5,
) -> PublishResult:
    """Publish ``(subject, data[, headers])`` items; return once JetStream acked every one."""
    inbox = nc.new_inbox()
    prefix = inbox + "."
    acks: dict[int, dict | None] = {}
    progress = asyncio.Event()

    async def on_ack(msg: Msg) -> None:
        i = int(msg.subject[len(prefix):])
        try:
            acks[i] = json.loads(msg.data) if msg.data else {"error": {"description": "empty ack"}}
        except ValueError:
            acks[i] = {"error": {"description": "bad ack"}}
        progress.set()

    sub = await nc.subscribe(prefix + "*", cb=on_ack, pending_msgs_limit=1 << 22, pending_bytes_limit=-1)
    result = PublishResult(0, 0, None, None)
    try:
        batch: list[tuple] = []
        for item in messages:
            batch.append(item)
            if len(batch) >= window:
                await _send_window(nc, batch, prefix, acks, progress, ack_timeout, max_attempts, result)
                batch = []
        if batch:
            await _send_window(nc, batch, prefix, acks, progress, ack_timeout, max_attempts, result)
    finally:
        await sub.unsubscribe()
    return result


async def _send_window(nc: NATS, batch: list[tuple], prefix: str, acks: dict[int, dict | None],
                       progress: asyncio.Event,
                       ack_timeout: float, max_attempts: int, result: PublishResult) -> None:
    base = result.published  # reply tokens of this window: base .. base + len(batch) - 1
    todo = list(range(len(batch)))
    for attempt in range(1, max_attempts + 1):
        acks.clear()
        for i in todo:
            item = batch[i]
            headers = item[2] if len(item) > 2 else None
            await nc.publish(item[0], item[1], reply=f"{prefix}{base + i}", headers=headers)
        await nc.flush()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ack_timeout
        while len(acks) < len(todo) and loop.time() < deadline:
            progress.clear()
            try:
                await asyncio.wait_for(progress.wait(), timeout=max(0.05, deadline - loop.time()))
            except TimeoutError:
                break
        failed = []
        for i in todo:
            ack = acks.get(base + i)
            if not ack or "error" in ack:
                failed.append(i)
                continue
            seq = ack.get("seq")
            if seq is not None:
                result.first_seq = seq if result.first_seq is None else min(result.first_seq, seq)
                result.last_seq = seq if result.last_seq is None else max(result.last_seq, seq)
        if not failed:
            result.published += len(batch)
            return
        result.retried += len(failed)
        todo = failed
        await asyncio.sleep(min(0.2 * attempt, 2.0))
    last = acks.get(base + todo[0]) or {}
    why = (last.get("error") or {}).get("description", "no ack")
    raise ConsumerGroupError(f"{len(todo)} messages not acknowledged after {max_attempts} attempts: {why}")
