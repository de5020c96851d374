"""The closed sets of words the member job's contract speaks (``contract.py``): how a run
reads (``ReadMode``), how Spark decodes payloads (``PayloadFormat``) and why a run stopped
(``StopReason``). Each is a ``StrEnum``: its members are the very strings of the command line
and the summary (``"executors"``, ``"pin lost"``), so what crosses the boundary is unchanged,
and the code compares members, never spelled strings (``tests/unit/test_one_place.py``)."""

from __future__ import annotations

import enum

__all__ = ["PayloadFormat", "ReadMode", "StopReason"]


class ReadMode(enum.StrEnum):
    """``--read``: which reader lands the member's messages (``reads/registry.py``)."""

    AUTO = "auto"  # the driver reads by batched direct gets where the stream allows them
    CONSUMER = "consumer"  # pulls through the member consumer, a double ack per message
    EXECUTORS = "executors"  # direct gets by the batch's Spark tasks


class PayloadFormat(enum.StrEnum):
    """``--payload-format``: how a batch's payloads are decoded before the sink."""

    RAW = "raw"
    TEXT = "text"
    JSON = "json"
    AVRO = "avro"

    @property
    def needs_spark(self) -> bool:
        """Decoded by Spark (``from_json``, ``from_avro``): a plain driver cannot."""
        return self in (PayloadFormat.JSON, PayloadFormat.AVRO)

    @property
    def schema_field(self) -> str | None:
        """The option that gives this format's schema, if it needs one."""
        return {PayloadFormat.JSON: "json_schema", PayloadFormat.AVRO: "avro_schema"}.get(self)


class StopReason(enum.StrEnum):
    """The summary's ``stop_reason`` when it needs no detail; a reason with details (which
    partitions a membership change moved, what a consumer's deletion said) is a sentence
    that starts as one of these would not."""

    TARGET_REACHED = "target reached"  # the backlog found at the start (``Trigger.AvailableNow``)
    MAX_MESSAGES = "max_messages"
    MAX_BYTES = "max_bytes"
    MAX_SECONDS = "max_seconds"
    FOLLOW_ENDED = "follow ended"
    HANDED_OVER = "handed over to its successor"  # a follower relieved by the member's next one, warm
    BACKLOG_DRAINED = "backlog drained"
    EMPTY_BACKLOG = "empty backlog"
    NO_MESSAGE_ARRIVED = "no message arrived"
    PIN_LOST = "pin lost"
    PIN_LOST_WAITING = "pin lost while waiting for an earlier instance's messages"
    TAKEN_OVER = "taken over by another instance"
    CONSUMER_DELETED = "consumer deleted"
    ANOTHER_HOLDS_PIN = "another instance holds the pin"
    GROUP_DELETED = "group deleted"
    # a backfill's
    WINDOW_END = "window end"
    LAST_SEQUENCE_AT_START = "last sequence at start"
    NO_MORE_MESSAGES = "no more messages"
    ORIGIN_EMPTY = "origin stream empty"
    # the operator's, when it starts no Spark job
    NO_BACKLOG = "no backlog: Spark not started"
