"""When a member run stops reading: one rule every reader asks before each batch.

A run of today is "available now" (like Spark's ``Trigger.AvailableNow``): its target is the
backlog it found when it was pinned, capped by ``max_messages``; it stops there, at
``max_seconds`` or ``max_bytes``, or when a membership change revokes its partitions.

A follower (``--follow SECONDS``) is the other rule, not another branch in each reader: it has
no target but ``max_messages``, keeps reading what arrives until its follow time has passed,
and cuts its batches at ``batch_size`` or every ``commit_interval`` seconds (``pace``), like
Spark's processing-time trigger and Flink's checkpoint interval. A reader that finds nothing
asks ``waits_for_more``: a follower waits and reads again, a bounded run ends.

A follower's end is a hand-over, not a gap: when its follow time is over it goes on landing
(``handing_over``) until the member's next follower is warm and waiting for the pin
(``relieve``: then it stops after the batch in flight and releases the pin, which goes to that
waiting successor at once), at most ``handover_wait`` seconds.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable

from airflow_provider_cg.core.landing.contract import BatchOptions, Summary
from airflow_provider_cg.core.landing.modes import StopReason

#: with a byte budget, the most the first batch reads before payloads are measured
FIRST_SIZED = 1_000
#: a follower waits at most this long between looks for new messages, and at least this
#: often re-checks its pin and its deadline
IDLE_LOOK = 0.25


class StopRule:
    """The messages a run has taken (pulled or read, not handed back) and why it stops."""

    def __init__(self, options: BatchOptions, summary: Summary, started: float) -> None:
        self.options, self.summary, self.started = options, summary, started
        self.taken = 0
        self.revoked: StopReason | str | None = None  # why a membership change ends the current assignment
        #: a follower's end (monotonic), counted from the run's start
        self.follow_until = started + options.follow if options.follow else None
        self._last_read = 0.0  # when a follower's last read began
        self._last_short = False  # whether it found less than a full batch
        self.relieved = False  # a warm successor waits for the pin (``relieve``)
        self._sized_messages = self._sized_bytes = 0  # what was taken with its payloads' size known

    @property
    def following(self) -> bool:
        return self.follow_until is not None

    def aim(self, backlog: int) -> None:
        """Set the target: what is taken already plus the ``backlog`` found, at most
        ``max_messages``. A follower's limit is ``max_messages`` alone (what arrives is its
        backlog); its target is what it has seen, for the progress line."""
        target = self.taken + backlog
        if self.options.max_messages:
            target = min(target, self.options.max_messages)
        self.summary.target = target

    def _target(self) -> int:
        if self.following:
            return self.options.max_messages or sys.maxsize
        return self.summary.target

    def took(self, n: int, payload_bytes: Callable[[], int | None] | None = None) -> None:
        """``n`` messages taken; ``payload_bytes`` says their payloads' size when the reader
        holds them (asked only under a ``batch_bytes`` budget: the read loop pays nothing else)."""
        self.taken += n
        if self.options.batch_bytes and payload_bytes is not None and (size := payload_bytes()) is not None:
            self._sized_messages += n
            self._sized_bytes += size
        if self.following:  # the progress line's "backlog left": what it has seen so far
            self.summary.target = max(self.summary.target, self.taken)

    def gave_back(self, n: int = 1) -> None:
        """Messages handed back to the server (a nak): they come back and are counted again."""
        self.taken -= n

    def wanted(self, batch_size: int) -> int:
        """How many messages the next batch may take: ``batch_size``, or fewer to keep its
        payloads within ``batch_bytes`` (admission control: a follower that is behind takes a
        full budget, one that is caught up what arrived within its commit interval)."""
        return min(batch_size, self._within_budget(), self._target() - self.taken)

    def _within_budget(self) -> int:
        """Messages that fit ``batch_bytes`` at the average payload seen so far (what was read,
        else what landed: the executor path reads in its tasks); unmeasured: ``FIRST_SIZED``."""
        budget = self.options.batch_bytes
        if not budget:
            return sys.maxsize
        messages, size = self._sized_messages, self._sized_bytes
        if not messages:
            messages, size = self.summary.messages_read, self.summary.bytes
        if not messages:
            return FIRST_SIZED
        return max(1, int(budget // max(size / messages, 1.0)))

    def revoke(self, why: StopReason | str) -> None:
        self.revoked = why

    def relieve(self) -> None:
        """The member's next follower is warm and waiting for the pin: hand over."""
        self.relieved = True

    @property
    def handing_over(self) -> bool:
        """A follower past its follow time, landing until its successor is ready."""
        return self.follow_until is not None and time.monotonic() >= self.follow_until and not self.relieved

    def follow_left(self) -> float:
        """Seconds a follower has left of its follow time (0 for a bounded run)."""
        return max(0.0, self.follow_until - time.monotonic()) if self.follow_until is not None else 0.0

    def _left(self) -> float:
        """Seconds until a follower ends at the latest, its hand-over included."""
        if self.follow_until is None:
            return 0.0
        end = self.follow_until + (0.0 if self.relieved else self.options.handover_wait)
        return max(0.0, end - time.monotonic())

    def reason(self) -> StopReason | str | None:
        """Why the run stops before its next batch (None: it goes on)."""
        o, s = self.options, self.summary
        now = time.monotonic()
        if o.max_seconds and now - self.started >= o.max_seconds:
            return StopReason.MAX_SECONDS
        if o.max_bytes and s.bytes >= o.max_bytes:
            return StopReason.MAX_BYTES
        if self.taken >= self._target():
            return StopReason.MAX_MESSAGES if self.following else StopReason.TARGET_REACHED
        if self.follow_until is not None and now >= self.follow_until:
            if self.relieved:
                return StopReason.HANDED_OVER
            if now >= self.follow_until + self.options.handover_wait:
                return StopReason.FOLLOW_ENDED
        return self.revoked

    async def waits_for_more(self) -> bool:
        """A read found nothing: a follower waits a moment (True: read again, after checking
        the pin and this rule); a bounded run has drained its backlog (False)."""
        if not self.following:
            return False
        await asyncio.sleep(min(IDLE_LOOK, self.options.commit_interval, max(self._left(), 0.01)))
        return True

    async def pace(self) -> None:
        """A follower's batches when messages trickle: a read after a short one (less than a
        full batch) waits until ``commit_interval`` has passed since that one began, so what
        arrives meanwhile is one batch, not one each; after a full read it goes on at once. Call
        before each read, and ``read_found`` after it; a bounded run never waits."""
        if not self.following:
            return
        if self._last_short:
            wait = self._last_read + self.options.commit_interval - time.monotonic()
            if wait > 0:
                await asyncio.sleep(min(wait, self._left()))
        self._last_read = time.monotonic()

    def read_found(self, read: int, wanted: int) -> None:
        """What the read begun at ``pace`` found."""
        self._last_short = self.following and read < wanted
