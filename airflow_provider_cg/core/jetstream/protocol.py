"""The JetStream pull protocol as bytes: ack subjects, status lines, pulled messages, the
outcomes of pulls and acks, and the classification of statuses into those outcomes.

Pure parsing (no connection): the client (``client.py``) and the row builders use it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

from airflow_provider_cg.core.errors import ConsumerGroupError

PIN_HEADER = "Nats-Pin-Id"
_STATUS_MARK = b" "  # b"NATS/1.0 404 ..." has a space where a plain header block has CRLF


# --- messages ---------------------------------------------------------------------------


class AckMetadata(NamedTuple):
    """The fields of a JetStream ack subject (v1 or v2 form)."""

    stream: str
    consumer: str
    num_delivered: int
    stream_seq: int
    consumer_seq: int
    timestamp_ns: int
    num_pending: int
    domain: str | None = None
    account_hash: str | None = None


def parse_ack_subject(reply: str) -> AckMetadata:
    """Parse ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>`` (v1) or
    ``$JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>[.<token>...]``
    (v2; domain ``_`` means none)."""
    t = reply.split(".")
    n = len(t)
    if n < 9 or t[0] != "$JS" or t[1] != "ACK":
        raise ValueError(f"not a JetStream ack subject: {reply!r}")
    try:  # (built as a plain tuple: a NamedTuple's own constructor costs ~3 us, and rows parse one per message)
        if n == 9:
            return _new_tuple(AckMetadata, (t[2], t[3], int(t[4]), int(t[5]), int(t[6]), int(t[7]), int(t[8]),
                                            None, None))
        if n >= 11:
            return _new_tuple(AckMetadata, (t[4], t[5], int(t[6]), int(t[7]), int(t[8]), int(t[9]), int(t[10]),
                                            None if t[2] == "_" else t[2], t[3]))
    except ValueError:
        pass
    raise ValueError(f"not a JetStream ack subject: {reply!r}")


_new_tuple = tuple.__new__


def parse_headers(raw: bytes) -> dict[str, str]:
    """A ``NATS/1.0`` header block as a dict (last value wins, like nats-py)."""
    out: dict[str, str] = {}
    for line in raw.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name:
            out[name.strip().decode("ascii", "replace")] = value.strip().decode("utf-8", "replace")
    return out


def parse_status(raw: bytes) -> tuple[int, str] | None:
    """``(code, description)`` of a status block (``NATS/1.0 408 Request Timeout``), else None."""
    if raw[8:9] != _STATUS_MARK:
        return None
    end = raw.find(b"\r\n")
    line = raw[9:end] if end >= 0 else raw[9:]
    code, _, desc = line.strip().partition(b" ")
    try:
        return int(code), desc.strip().decode("utf-8", "replace")
    except ValueError:
        return None


def status_text(code: int, desc: str) -> str:
    if not desc and code == 503:
        desc = "No Responders"
    return f"{code} {desc}".strip()


class PulledMsg:
    """A message delivered to a pull. Headers and ack metadata are parsed on first access.

    ``pin_id`` is the ``Nats-Pin-Id`` the message was delivered under (None on consumers
    without pinning).
    """

    __slots__ = ("subject", "reply", "data", "pin_id", "_hdr", "_headers", "_meta")

    def __init__(
        self,
        subject: str,
        reply: str,
        data: bytes,
        raw_headers: bytes | None = None,
        headers: dict[str, str] | None = None,
        pin_id: str | None = None,
    ) -> None:
        self.subject = subject
        self.reply = reply
        self.data = data
        self.pin_id = pin_id
        self._hdr = raw_headers
        self._headers = headers
        self._meta: AckMetadata | None = None

    @property
    def headers(self) -> dict[str, str] | None:
        if self._headers is None and self._hdr is not None:
            self._headers = parse_headers(self._hdr)
        return self._headers

    @property
    def metadata(self) -> AckMetadata:
        m = self._meta
        if m is None:
            m = self._meta = parse_ack_subject(self.reply)
        return m

    @property
    def stream(self) -> str:
        return self.metadata.stream

    @property
    def consumer(self) -> str:
        return self.metadata.consumer

    @property
    def num_delivered(self) -> int:
        return self.metadata.num_delivered

    @property
    def stream_seq(self) -> int:
        return self.metadata.stream_seq

    @property
    def consumer_seq(self) -> int:
        return self.metadata.consumer_seq

    @property
    def timestamp_ns(self) -> int:
        return self.metadata.timestamp_ns

    @property
    def num_pending(self) -> int:
        return self.metadata.num_pending

    def __repr__(self) -> str:
        return f"PulledMsg(subject={self.subject!r}, reply={self.reply!r}, size={len(self.data)})"


# --- outcomes and errors ----------------------------------------------------------------


class AckOutcome(enum.Enum):
    """Result of one double ack: ACKED (the server answered), TIMEOUT (unknown: the ack may
    or may not have been applied), ERROR (the answer was a status, e.g. 503: consumer gone;
    or the ack could not be sent)."""

    ACKED = "acked"
    TIMEOUT = "timeout"
    ERROR = "error"

    @property
    def acked(self) -> bool:
        return self is AckOutcome.ACKED


class AckResults(list):
    """``list[AckOutcome]`` in the order of the messages, plus ``details``: index -> error text."""

    def __init__(self, outcomes: Sequence[AckOutcome] = ()) -> None:
        super().__init__(outcomes)
        self.details: dict[int, str] = {}

    @property
    def all_acked(self) -> bool:
        return all(o is AckOutcome.ACKED for o in self)

    def counts(self) -> dict[AckOutcome, int]:
        return {o: self.count(o) for o in AckOutcome}


class PullEnd(enum.Enum):
    """Why the last successful ``pull()`` returned."""

    BATCH_FULL = "batch_full"
    NO_MESSAGES = "no_messages"  # 404
    EXPIRED = "expired"  # 408 (Request Timeout, Interest Expired, Requests Pending)
    MAX_BYTES = "max_bytes"  # 409 Batch Completed / Message Size Exceeds MaxBytes
    TIMEOUT = "timeout"  # no server answer by expires + grace
    BUFFERED = "buffered"  # served from what a prefetched or abandoned pull brought


class PullError(ConsumerGroupError):
    """A pull ended with a status other than data/404/408. ``messages`` were delivered to it
    before the status (they are pending ack on the server)."""

    retryable = True

    def __init__(self, code: int, description: str, messages: list[PulledMsg] | None = None) -> None:
        self.code = code
        self.description = description
        self.messages: list[PulledMsg] = messages if messages is not None else []
        super().__init__(f"{code} {description}" if code else description)


class PinLost(PullError):
    """423: this client is not (or no longer) the pinned one. ``pin_id`` is the id it held."""

    def __init__(self, code: int, description: str, messages: list[PulledMsg] | None = None,
                 pin_id: str | None = None) -> None:
        super().__init__(code, description, messages)
        self.pin_id = pin_id


class ConsumerGone(PullError):
    """The consumer was deleted (409 Consumer Deleted) or does not exist (503 + info check)."""

    retryable = False


class PullTransient(PullError):
    """Leadership change, server shutdown, max waiting, missed heartbeats, connection trouble."""


class PullRejected(PullError):
    """The server refused the request itself (400, 409 limits, 412): fix the request."""

    retryable = False


def classify_status(code: int, description: str) -> PullEnd | type[PullError] | None:
    """Map a pull status to how the pull ends (a PullEnd or an error class); None for 100."""
    d = description.lower()
    if code == 100:
        return None
    if code == 404:
        return PullEnd.NO_MESSAGES
    if code == 408:
        return PullEnd.EXPIRED
    if code == 409:
        if d.startswith("batch completed") or d.startswith("message size exceeds maxbytes"):
            return PullEnd.MAX_BYTES
        if d.startswith("consumer deleted"):
            return ConsumerGone
        if d.startswith("exceeded maxrequest") or "push based" in d:
            return PullRejected
        return PullTransient  # leadership change, server shutdown, exceeded maxwaiting, ...
    if code == 423:
        return PinLost
    if code == 503:
        return ConsumerGone  # confirmed with consumer info before it is raised
    if 400 <= code < 500:
        return PullRejected
    return PullTransient
