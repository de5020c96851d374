"""GroupOverflowTrigger: fire when a consumer group (or one member) has too much work waiting.

The thresholds work like JetStream's overflow priority groups: ``min_pending`` (messages not
yet delivered) and ``min_ack_pending`` (delivered, not yet acknowledged); either one reached
(``>=``) satisfies the condition. Figures come from :meth:`ConsumerGroups.status`:

* ``pending``: a member's consumer ``num_pending``; for a member without a consumer (no
  instance ran yet) the messages stored in its partitions, which is what its consumer will
  be handed once created. For the whole group, the sum over its members plus whatever sits
  in partitions no member owns.
* ``ack_pending``: ``num_ack_pending`` of the member's consumer (of all member consumers).
* ``backlog``: messages not yet acknowledged: the work-queue stream's messages in those
  partitions (elastic), or ``pending + ack_pending`` (static; the origin keeps acked ones).

Two modes:

* ``once`` (sensors): yield one event as soon as the condition holds, then stop. With a
  ``deadline`` (epoch seconds) it yields a ``timeout`` event when that passes first. Missing
  groups, members or connections end it with an ``error`` event.
* ``crossing`` (asset watchers, the default): yield when the condition becomes true, not
  again while it stays true, re-arm once it is false, forever. The first poll counts as a
  crossing when the condition already holds, so a (re)started watcher never misses one.

One NATS connection per ``run()``; polls never block the event loop; errors are logged
(without secrets) and retried with capped exponential backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_provider_cg.core.errors import ConfigError, GroupNotFound
from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.lag import GroupLag, group_lag
from airflow_provider_cg.core.groups.problems import describe as describe_problem
from airflow_provider_cg.core.groups.status import GroupStatus, MemberState
from airflow_provider_cg.core.groups.store import ELASTIC
from airflow_provider_cg.hooks.nats import NatsHook

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

__all__ = ["GroupOverflowTrigger"]

ONCE, CROSSING = "once", "crossing"
MODES = (ONCE, CROSSING)
MAX_BACKOFF = 30.0  # seconds between attempts after repeated errors
CLOSE_TIMEOUT = 5.0  # seconds: closing must not hang the triggerer while the server is away
CLASSPATH = "airflow_provider_cg.triggers.overflow.GroupOverflowTrigger"


def check_thresholds(min_pending: Any, min_ack_pending: Any, max_oldest_age: Any = None) -> None:
    """Raise ``ConfigError`` unless at least one threshold is given, the counts ints >= 1 and
    the age a number of seconds > 0."""
    if min_pending is None and min_ack_pending is None and max_oldest_age is None:
        raise ConfigError("min_pending", "give min_pending, min_ack_pending and/or max_oldest_age")
    for name, value in (("min_pending", min_pending), ("min_ack_pending", min_ack_pending)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(name, "must be an integer")
        if value < 1:
            raise ConfigError(name, "must be >= 1")
    if max_oldest_age is not None and (isinstance(max_oldest_age, bool) or not isinstance(max_oldest_age, int | float)
                                       or not max_oldest_age > 0):
        raise ConfigError("max_oldest_age", "must be a number of seconds > 0")


def _member_pending(m: MemberState) -> int:
    return m.num_pending if m.consumer_exists else m.backlog


def measure(status: GroupStatus, member: str | None = None, lag: GroupLag | None = None) -> dict[str, Any]:
    """``pending``, ``ack_pending``, ``backlog`` and per-partition counts of a group or member;
    with ``lag``, also ``oldest_pending_age_s`` (seconds; ``None``: nothing pending).

    Raises ``ConfigError("member", ...)`` when ``member`` is not in the group's membership.
    """
    if member is None:
        members = [m for m in status.members if m.in_membership]
        pending = sum(_member_pending(m) for m in members)
        pending += sum(status.partitions.get(p, 0) for p in status.unassigned_partitions)
        ack_pending = status.num_ack_pending
        parts = sorted(status.partitions)
        backlog = status.backlog if status.kind == ELASTIC else pending + ack_pending
    else:
        found = [m for m in status.members if m.member == member and m.in_membership]
        if not found:
            raise ConfigError(
                "member", f"{member!r} is not a member of group {status.group!r} on stream {status.stream!r}"
            )
        m = found[0]
        pending, ack_pending, parts = _member_pending(m), m.num_ack_pending, m.partitions
        backlog = m.backlog if status.kind == ELASTIC else pending + ack_pending
    figures = {
        "pending": int(pending),
        "ack_pending": int(ack_pending),
        "backlog": int(backlog),
        "partitions": {str(p): int(status.partitions.get(p, 0)) for p in parts},
        # partition streams that are not current: their backlog is not known (``layouts/``)
        "partition_problems": {str(p): why for p, why in sorted(status.partition_problems.items()) if p in parts},
        # the origin's messages the group has not taken yet, whether its source is stalled, and what
        # the group's jobs found that no server state shows (an origin that went back: ``problems.py``)
        "source_lag": status.source_lag,
        "source_stalled": status.source_stalled,
        "problems": dict(status.problems),
    }
    if lag is not None:
        ages = [m.oldest_pending_age_s for m in lag.members
                if (member is None or m.member == member) and m.oldest_pending_age_s is not None]
        figures["oldest_pending_age_s"] = max(ages) if ages else None
    return figures


def exceeds(figures: dict[str, Any], min_pending: int | None, min_ack_pending: int | None,
            max_oldest_age: float | None = None) -> bool:
    """Whether any threshold is reached (OR, as JetStream's overflow pulls): a count, or the
    age of the oldest pending message."""
    age = figures.get("oldest_pending_age_s")
    return (min_pending is not None and figures["pending"] >= min_pending) or (
        min_ack_pending is not None and figures["ack_pending"] >= min_ack_pending
    ) or (max_oldest_age is not None and age is not None and age > max_oldest_age)


async def read_figures(nc: NATS, stream: str, group: str, member: str | None,
                       max_oldest_age: float | None) -> tuple[GroupStatus, dict[str, Any]]:
    """One poll: the group's status and the figures of the group or member (the oldest
    pending message's age only when an age threshold needs it: a direct get per partition)."""
    status = await ConsumerGroups(nc).status(stream, group)
    lag = await group_lag(nc, stream, group, status=status) if max_oldest_age is not None else None
    return status, measure(status, member, lag)


def event_payload(
    status: str,
    stream: str,
    group: str,
    member: str | None,
    min_pending: int | None,
    min_ack_pending: int | None,
    figures: dict[str, Any] | None,
    ts: float,
    **extra: Any,
) -> dict[str, Any]:
    """The JSON-able event payload (also the sensor's XCom value)."""
    figures = figures or {"pending": None, "ack_pending": None, "backlog": None, "partitions": {}}
    return {
        "status": status,
        "stream": stream,
        "group": group,
        "member": member,
        **figures,
        "min_pending": min_pending,
        "min_ack_pending": min_ack_pending,
        "ts": ts,
        **extra,
    }


class GroupOverflowTrigger(BaseEventTrigger):
    """Poll a consumer group's backlog and fire when a threshold is reached (see module doc).

    :param stream: the origin stream of the group.
    :param group: the consumer group.
    :param member: watch one member; ``None`` watches the whole group.
    :param min_pending: fire when at least this many messages wait for delivery.
    :param min_ack_pending: fire when at least this many are delivered but not acknowledged.
    :param max_oldest_age: fire when the oldest pending message is older than this many
        seconds (the freshness users alert on; one direct get per partition a poll).
    :param poke_interval: seconds between polls.
    :param nats_conn_id: Airflow connection of type ``nats``.
    :param mode: ``"crossing"`` (asset watchers, default) or ``"once"`` (sensors).
    :param deadline: ``once`` mode only: epoch seconds after which a ``timeout`` event ends it.
    :param max_failures: ``once`` mode only: after this many polls in a row that cannot reach
        the server (or are refused by it), end with an ``error`` event naming the last failure
        instead of waiting for the deadline (``None``: keep trying until the deadline). Each
        failure is logged. Asset watchers (``crossing``) keep trying and log each failure.

    Event payload: ``status`` (``overflow``, ``timeout`` or ``error``), ``stream``, ``group``,
    ``member``, ``pending``, ``ack_pending``, ``backlog``, ``partitions`` (``{"<p>": n}``),
    ``min_pending``, ``min_ack_pending``, ``max_oldest_age`` (with it, ``oldest_pending_age_s``),
    ``ts`` (epoch seconds of the measurement); an ``error`` event also has ``error``.
    """

    def __init__(
        self,
        *,
        stream: str,
        group: str,
        member: str | None = None,
        min_pending: int | None = None,
        min_ack_pending: int | None = None,
        poke_interval: float = 5.0,
        nats_conn_id: str = NatsHook.default_conn_name,
        mode: str = CROSSING,
        deadline: float | None = None,
        max_failures: int | None = None,
        max_oldest_age: float | None = None,
    ) -> None:
        super().__init__()
        if max_failures is not None and (isinstance(max_failures, bool) or not isinstance(max_failures, int)
                                         or max_failures < 1):
            raise ConfigError("max_failures", "must be an integer >= 1 (or None)")
        check_thresholds(min_pending, min_ack_pending, max_oldest_age)
        if mode not in MODES:
            raise ConfigError("mode", f"must be one of {', '.join(MODES)}")
        if isinstance(poke_interval, bool) or not isinstance(poke_interval, int | float) or poke_interval <= 0:
            raise ConfigError("poke_interval", "must be a number of seconds > 0")
        if deadline is not None and mode != ONCE:
            raise ConfigError("deadline", "only for mode 'once'")
        self.stream = stream
        self.group = group
        self.member = member
        self.min_pending = min_pending
        self.min_ack_pending = min_ack_pending
        self.max_oldest_age = max_oldest_age
        self.poke_interval = float(poke_interval)
        self.nats_conn_id = nats_conn_id
        self.mode = mode
        self.deadline = deadline
        self.max_failures = max_failures

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            CLASSPATH,
            {
                "stream": self.stream,
                "group": self.group,
                "member": self.member,
                "min_pending": self.min_pending,
                "min_ack_pending": self.min_ack_pending,
                "poke_interval": self.poke_interval,
                "nats_conn_id": self.nats_conn_id,
                "mode": self.mode,
                "deadline": self.deadline,
                "max_failures": self.max_failures,
                "max_oldest_age": self.max_oldest_age,
            },
        )

    def _payload(self, status: str, figures: dict[str, Any] | None, ts: float, **extra: Any) -> dict[str, Any]:
        return event_payload(status, self.stream, self.group, self.member, self.min_pending, self.min_ack_pending,
                             figures, ts, max_oldest_age=self.max_oldest_age, **extra)

    def _where(self) -> str:
        who = f"member {self.member!r} of " if self.member else ""
        return f"{who}group {self.group!r} on stream {self.stream!r}"

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow.sdk.exceptions import AirflowNotFoundException

        from airflow_provider_cg.hooks.nats import scrub

        hook = NatsHook(nats_conn_id=self.nats_conn_id)
        settings = None
        nc = None
        armed = True
        failures = 0
        last: dict[str, Any] | None = None
        warned: tuple[dict[str, str], str | None, dict[str, dict]] = ({}, None, {})
        self.log.info(
            "Watching %s (mode %s): min_pending=%s min_ack_pending=%s max_oldest_age=%s every %ss",
            self._where(), self.mode, self.min_pending, self.min_ack_pending, self.max_oldest_age, self.poke_interval,
        )
        try:
            while True:
                if self.deadline is not None and time.time() >= self.deadline:
                    yield TriggerEvent(self._payload("timeout", last, time.time()))
                    return
                try:
                    if nc is None or nc.is_closed:
                        settings = await hook.aget_settings()
                        nc = await settings.connect()
                    status, figures = await read_figures(nc, self.stream, self.group, self.member,
                                                         self.max_oldest_age)
                except (ConfigError, GroupNotFound, AirflowNotFoundException) as e:
                    message = scrub(f"{type(e).__name__}: {e}", settings)
                    if self.mode == ONCE:
                        yield TriggerEvent(self._payload("error", last, time.time(), error=message))
                        return
                    failures += 1
                    self.log.warning("Cannot watch %s: %s", self._where(), message)
                    await self._sleep(self._backoff(failures))
                    continue
                except Exception as e:
                    failures += 1
                    message = scrub(f"{type(e).__name__}: {e}", settings)
                    if nc is not None and nc.is_closed:
                        nc = None
                    if self.mode == ONCE and self.max_failures is not None and failures >= self.max_failures:
                        self.log.error("Polling %s failed %s times in a row; giving up: %s",
                                       self._where(), failures, message)
                        yield TriggerEvent(self._payload(
                            "error", last, time.time(),
                            error=f"{failures} polls in a row failed; the last: {message}"))
                        return
                    delay = self._backoff(failures)
                    self.log.warning(
                        "Polling %s failed (%s attempt(s) in a row), retrying in %.1fs: %s",
                        self._where(), failures, delay, message,
                    )
                    await self._sleep(delay)
                    continue
                failures = 0
                last = figures
                problems = figures.get("partition_problems") or {}
                health = (problems, figures.get("source_stalled"), figures.get("problems") or {})
                if health != warned:
                    if problems:
                        self.log.warning("%s: partition streams not current, their backlog unknown: %s",
                                         self._where(), "; ".join(f"{p}: {why}" for p, why in problems.items()))
                    if health[1]:
                        self.log.warning("%s: its source is stalled: %s", self._where(), health[1])
                    for kind, found in sorted(health[2].items()):
                        self.log.warning("%s: %s", self._where(), describe_problem(kind, found))
                    warned = health
                if exceeds(figures, self.min_pending, self.min_ack_pending, self.max_oldest_age):
                    if armed:
                        self.log.info(
                            "Threshold reached on %s: pending=%s ack_pending=%s backlog=%s oldest pending=%ss",
                            self._where(), figures["pending"], figures["ack_pending"], figures["backlog"],
                            figures.get("oldest_pending_age_s"),
                        )
                        yield TriggerEvent(self._payload("overflow", figures, status.ts))
                        if self.mode == ONCE:
                            return
                        armed = False
                elif not armed and not problems:  # an unknown backlog is not a low one
                    self.log.info("Below the thresholds again on %s: re-armed", self._where())
                    armed = True
                await self._sleep(self.poke_interval)
        finally:
            if nc is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(nc.close(), CLOSE_TIMEOUT)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but not past the deadline."""
        if self.deadline is not None:
            seconds = max(0.0, min(seconds, self.deadline - time.time()))
        await asyncio.sleep(seconds)

    def _backoff(self, failures: int) -> float:
        base = min(MAX_BACKOFF, max(self.poke_interval, 0.5) * 2 ** min(failures - 1, 10))
        return base * random.uniform(0.8, 1.0)
