"""Stopping a task that talks to NATS.

A nats-py request that is cancelled while it waits for its answer may turn the cancellation
into an error of its own (measured with nats-py 2.16: 13 of 30 cancellations of a task in a
loop of KV puts). A loop that goes on after such errors (a poll, a keep-alive) then never sees
it was cancelled, and keeps running beside its successor. ``stop`` cancels until the task has
ended."""

from __future__ import annotations

import asyncio


async def stop(task: asyncio.Task | None) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling again while it goes on."""
    while task is not None and not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)
