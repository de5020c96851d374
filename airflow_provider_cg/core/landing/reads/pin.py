"""The member consumer's pin, for one assignment of a member run: acquired, anchored, kept,
confirmed before every batch's acks, handed on, released.

A member has one active instance: the client the server pins in the consumer's priority group
``PCG`` (``pinned_client``). The server pins a client only when it delivers a message to it, and
moves the pin when the pinned client stops pulling for the priority timeout, so a run pulls as a
standby until pinned (``acquire``), and keeps pulling while it reads around the consumer
(``keep_until_lost``, ``await_landing``). Before a batch is acknowledged, ``confirm`` asks the
server whether no other instance can have been handed its messages.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from airflow_provider_cg.core.errors import ConsumerGroupError
from airflow_provider_cg.core.groups import layouts
from airflow_provider_cg.core.groups.consumers import pinned_id
from airflow_provider_cg.core.jetstream.client import PriorityClient
from airflow_provider_cg.core.jetstream.protocol import PinLost, PullTransient

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

log = logging.getLogger("airflow_provider_cg.landing")


class Pin:
    """The pin of ``client`` on the member's consumer (see the module docstring). ``anchored``:
    the consumer holds only the member's pin subject (partition streams), so a standby
    publishes one small anchor there for the server to deliver; ``owner`` names this run in
    the anchor's header."""

    def __init__(self, nc: NATS, client: PriorityClient, *, member: str, owner: str, anchored: bool,
                 ack_wait: float) -> None:
        self.nc, self.client, self.member, self.owner, self.anchored = nc, client, member, owner, anchored
        self.created: str | None = None  # the consumer's creation time as this run was pinned on it
        self.adopt_timings({}, ack_wait)

    @property
    def pin_id(self) -> str | None:
        return self.client.pin_id

    def adopt_timings(self, consumer_config: dict, ack_wait: float) -> None:
        """The consumer's own ack wait and priority timeout (it may predate this run): how often
        the pin is renewed, and how long a pull may stay open without losing it. (The server
        resets the pin timer only on a new pull that carries the pin id, so a pull open longer
        than that loses the pin mid-pull.)"""
        self.consumer_ack_wait = int(consumer_config.get("ack_wait") or 0) / 1e9 or ack_wait
        self.priority_timeout = int(consumer_config.get("priority_timeout") or 0) / 1e9 or self.consumer_ack_wait
        self.pull_expires_max = max(0.5, min(self.consumer_ack_wait, self.priority_timeout) / 2)

    async def acquire(self, deadline: float, want: int, stop: Callable[[], bool]) -> list | None:
        """Pull as a standby until the server pins this client (messages arrive: returned), the
        monotonic ``deadline`` passes or ``stop()`` says so (None)."""
        log.info("cg member=%s: waiting up to %.0fs for the pin", self.member, max(0.0, deadline - time.monotonic()))
        while time.monotonic() < deadline and not stop():
            expires = max(0.5, min(5.0, self.pull_expires_max, deadline - time.monotonic()))
            if self.anchored:
                await self.anchor()
            try:
                msgs = await self.client.pull(want, expires=expires)
            except PinLost as e:
                if e.messages:
                    return e.messages
                continue
            except PullTransient:
                await asyncio.sleep(0.5)
                continue
            if msgs:
                return msgs
        return None

    async def anchor(self) -> None:
        """Make sure one small anchor waits on the member's pin subject (a standby's stays there
        until the pinned instance's pin lapses; the pinned instance acks its own)."""
        try:
            info = await self.client.consumer_info()
            if int(info.get("num_pending") or 0) + int(info.get("num_ack_pending") or 0) == 0:
                await self.nc.request(layouts.pin_subject(self.client.stream, self.member),
                                      b"", timeout=5.0, headers={"Cg-Pin-Anchor": self.owner})
        except Exception as e:  # noqa: BLE001 - the next round tries again
            log.debug("cg member=%s: pin anchor not published (%s)", self.member, e)

    async def pinned(self) -> dict:
        """Record the consumer as this run was pinned on it; its info."""
        info = await self.client.consumer_info()
        self.created = info.get("created")
        return info

    async def confirm(self) -> bool:
        """Whether no other instance can have been handed this run's messages: the member
        consumer is the one this run was pinned on (not deleted, not re-created, as an orbit
        instance does with a consumer of another config) and no other pin is set. (A pin that
        lapsed with nobody taking it, e.g. after a step-down, is no other instance's.) Asked
        before every batch's acks; when the answer cannot be had (server unreachable) it is no:
        the batch is rolled back, which is always safe before an ack."""
        try:
            info = await self.client.consumer_info()
        except Exception as e:  # noqa: BLE001 - any doubt (gone included) means: do not ack
            log.warning("cg member=%s: could not confirm the pin before the ack (%s)", self.member, e)
            return False
        if info.get("created") != self.created:
            return False
        holder = pinned_id(info)
        return holder is None or holder == self.client.pin_id

    async def keep_until_lost(self) -> None:
        """Keep the pin while reading around the consumer; returns when it is lost."""
        interval = max(0.25, min(self.consumer_ack_wait, self.priority_timeout) / 3)
        while True:
            await asyncio.sleep(interval)
            if not await self.client.keep_pin():
                log.warning("cg member=%s: the pin moved to another instance", self.member)
                return

    async def await_landing(self, landing: asyncio.Task, in_progress: Callable[[], Sequence] = tuple) -> None:
        """Wait for a batch to land, keeping the pin alive meanwhile (a sink write can take
        longer than the consumer's priority timeout, e.g. behind row locks), and the messages
        ``in_progress()`` names at each renewal (+WPI; asked each time: the landing batch names
        its messages once it starts): an adopted consumer's ack wait may be short (orbit's 5 s),
        and they must not be redelivered."""
        interval = max(0.25, self.consumer_ack_wait / 3)
        while True:
            done, _ = await asyncio.wait({landing}, timeout=interval)
            if done:
                return landing.result()
            if not await self.client.keep_pin():
                log.warning("cg member=%s: pin moved while a batch was landing", self.member)
                continue
            for m in in_progress():
                await self.client.in_progress(m)

    async def holds(self) -> bool:
        return await self.client.holds_pin()

    async def release(self) -> None:
        """Hand the pin back at once (a standby, or the next scheduled run, gets it now instead
        of after the consumer's priority timeout), unless another instance holds it by now.
        Best effort: the timeout frees it anyway."""
        try:
            if not await self.client.holds_pin():
                return
            await self.client.unpin()
        except ConsumerGroupError as e:
            log.info("cg member=%s: pin not released (%s); it expires with the priority timeout", self.member, e)

    async def close(self) -> None:
        await self.client.close()
