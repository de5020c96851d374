"""When a member run stops reading: one rule every reader asks before each batch.

A run of today is "available now" (like Spark's ``Trigger.AvailableNow``): its target is the
backlog it found when it was pinned, capped by ``max_messages``; it stops there, at
``max_seconds`` or ``max_bytes``, or when a membership change revokes its partitions. A run
that keeps following new messages is another rule, not another branch in each reader.
"""

from __future__ import annotations

import time

from airflow_provider_cg.core.landing.contract import BatchOptions, Summary


class StopRule:
    """The messages a run has taken (pulled or read, not handed back) and why it stops."""

    def __init__(self, options: BatchOptions, summary: Summary, started: float) -> None:
        self.options, self.summary, self.started = options, summary, started
        self.taken = 0
        self.revoked: str | None = None  # why a membership change ends the current assignment

    def aim(self, backlog: int) -> None:
        """Set the target: what is taken already plus the ``backlog`` found, at most ``max_messages``."""
        target = self.taken + backlog
        if self.options.max_messages:
            target = min(target, self.options.max_messages)
        self.summary.target = target

    def took(self, n: int) -> None:
        self.taken += n

    def gave_back(self, n: int = 1) -> None:
        """Messages handed back to the server (a nak): they come back and are counted again."""
        self.taken -= n

    def wanted(self, batch_size: int) -> int:
        """How many messages the next batch may take."""
        return min(batch_size, self.summary.target - self.taken)

    def revoke(self, why: str) -> None:
        self.revoked = why

    def reason(self) -> str | None:
        """Why the run stops before its next batch (None: it goes on)."""
        o, s = self.options, self.summary
        if o.max_seconds and time.monotonic() - self.started >= o.max_seconds:
            return "max_seconds"
        if o.max_bytes and s.bytes >= o.max_bytes:
            return "max_bytes"
        if self.taken >= s.target:
            return "target reached"
        return self.revoked
