"""Raw JetStream API requests, for what nats-py 2.16 cannot say.

nats-py drops priority-group fields from consumer configs and cannot create a consumer with
create-only semantics, so consumers are created, inspected and unpinned here with plain
requests to ``$JS.API.*``. Every reply is JSON; an ``error`` member becomes
:class:`~airflow_provider_cg.core.errors.JetStreamApiError`.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from airflow_provider_cg.core.errors import ConfigError, JetStreamApiError, ServerUnavailable

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

DEFAULT_PREFIX = "$JS.API"

# JetStream error codes used by the core.
ERR_CONSUMER_NOT_FOUND = 10014
ERR_STREAM_NOT_FOUND = 10059
ERR_NO_MESSAGE_FOUND = 10037
ERR_WQ_CONSUMER_NOT_UNIQUE = 10100  # overlapping filters on a work-queue stream
ERR_CONSUMER_EXISTS = 10148  # create-only on a consumer that exists with another config
ERR_STREAM_NAME_IN_USE = 10058

CONSUMER_RESET_VERSION = (2, 14, 0)  # $JS.API.CONSUMER.RESET (nats-server PR 7489)


def server_version(nc: NATS) -> tuple[int, int, int]:
    """The connected server's version as numbers (``(0, 0, 0)`` when it did not say)."""
    v = nc.connected_server_version
    return v.major, v.minor, v.patch


def validate_prefix(field: str, prefix: Any) -> str:
    """A JetStream API prefix (``$JS.API``, or ``$JS.<domain>.API`` / an import's prefix): the
    head of a subject, so tokens that are non-empty and hold no wildcard or white space."""
    if not isinstance(prefix, str) or not prefix:
        raise ConfigError(field, "must be a subject prefix such as $JS.API (got an empty value)")
    tokens = prefix.split(".")
    if any(not t or t in ("*", ">") or any(c.isspace() for c in t) for t in tokens):
        raise ConfigError(field, f"must be a subject prefix such as $JS.API: non-empty tokens without wildcards or "
                                 f"white space (got {prefix!r})")
    return prefix


def stored_ns(msg: dict) -> int:
    """The stored time of a message ``get_msg`` returned (RFC 3339 to the nanosecond), in
    nanoseconds since the epoch, exactly (no float on the way)."""
    text = str(msg["time"])
    head, _, rest = text.partition(".")
    digits = ""
    if rest:
        zone_at = next((i for i, c in enumerate(rest) if not c.isdigit()), len(rest))
        digits, zone = rest[:zone_at], rest[zone_at:]
    else:
        head, zone = (text[:-1], "Z") if text.endswith("Z") else (text[:19], text[19:])
    seconds = datetime.fromisoformat(head + (zone if zone not in ("", "Z") else "+00:00")).timestamp()
    return int(seconds) * 1_000_000_000 + int((digits + "000000000")[:9])


def rfc3339(ns: int) -> str:
    """Nanoseconds since the epoch as the server writes a time (UTC, nine fraction digits)."""
    seconds, frac = divmod(int(ns), 1_000_000_000)
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


class JsApi:
    """Thin request/reply client of the JetStream API on a nats-py connection."""

    def __init__(self, nc: NATS, prefix: str = DEFAULT_PREFIX, timeout: float = 5.0) -> None:
        self.nc = nc
        self.prefix = validate_prefix("js_prefix", prefix)
        self.timeout = timeout

    async def request(self, suffix: str, body: dict[str, Any] | None = None, timeout: float | None = None) -> dict:
        subject = f"{self.prefix}.{suffix}"
        payload = json.dumps(body).encode() if body is not None else b""
        try:
            msg = await self.nc.request(subject, payload, timeout=timeout or self.timeout)
        except NoRespondersError:
            raise ServerUnavailable(f"JetStream is not enabled or not reachable ({subject})") from None
        except (NatsTimeoutError, TimeoutError):
            raise ServerUnavailable(f"no JetStream API answer within {timeout or self.timeout}s ({subject})") from None
        reply = json.loads(msg.data) if msg.data else {}
        err = reply.get("error")
        if err:
            raise JetStreamApiError(err.get("code", 0), err.get("err_code", 0), err.get("description", ""), subject)
        return reply

    # --- streams -------------------------------------------------------------------------

    async def stream_info(self, stream: str, subjects_filter: str | None = None) -> dict:
        """Stream info; with ``subjects_filter`` the per-subject counts of every page are merged."""
        if subjects_filter is None:
            return await self.request(f"STREAM.INFO.{stream}")
        info: dict | None = None
        subjects: dict[str, int] = {}
        offset = 0
        while True:
            page = await self.request(f"STREAM.INFO.{stream}", {"subjects_filter": subjects_filter, "offset": offset})
            info = info or page
            got = page.get("state", {}).get("subjects") or {}
            subjects.update(got)
            total = page.get("total", 0)
            offset += len(got)
            if not got or offset >= total:
                break
        assert info is not None
        info.setdefault("state", {})["subjects"] = subjects
        return info

    async def add_stream(self, config: dict) -> dict:
        return await self.request(f"STREAM.CREATE.{config['name']}", config)

    async def delete_stream(self, stream: str) -> bool:
        try:
            await self.request(f"STREAM.DELETE.{stream}")
            return True
        except JetStreamApiError as e:
            if e.err_code == ERR_STREAM_NOT_FOUND:
                return False
            raise

    async def get_msg(self, stream: str, seq: int) -> dict | None:
        """The stored message at ``seq`` (base64 ``data``/``hdrs``), or None if it is gone."""
        try:
            reply = await self.request(f"STREAM.MSG.GET.{stream}", {"seq": seq})
        except JetStreamApiError as e:
            if e.err_code == ERR_NO_MESSAGE_FOUND or e.code == 404:
                return None
            raise
        return reply.get("message")

    async def msg_after_time(self, stream: str, ns: int) -> dict | None:
        """The first stored message with a stored time at or after ``ns`` (nanoseconds since the
        epoch), or None (the server finds it by time, not by reading the stream)."""
        try:
            reply = await self.request(f"STREAM.MSG.GET.{stream}", {"start_time": rfc3339(ns)})
        except JetStreamApiError as e:
            if e.err_code == ERR_NO_MESSAGE_FOUND or e.code == 404:
                return None
            raise
        return reply.get("message")

    async def count_from(self, stream: str, seq: int, subject: str) -> int | None:
        """How many messages of ``subject`` (wildcards allowed) the stream stores from ``seq`` on,
        counted by the server (a direct get of one message, its ``Nats-Num-Pending``); None when
        the stream serves no direct gets."""
        body = json.dumps({"seq": max(int(seq), 1), "next_by_subj": subject, "batch": 1}).encode()
        try:
            msg = await self.nc.request(f"{self.prefix}.DIRECT.GET.{stream}", body, timeout=self.timeout)
        except (NoRespondersError, NatsTimeoutError, TimeoutError):
            return None
        headers = msg.headers or {}
        if "Nats-Num-Pending" in headers:
            return int(headers["Nats-Num-Pending"]) + 1
        return 0  # a 404 status: none there

    async def next_msg(self, stream: str, seq: int, subject: str) -> dict | None:
        """The first stored message at or after ``seq`` on ``subject`` (wildcards allowed), or None."""
        try:
            reply = await self.request(f"STREAM.MSG.GET.{stream}", {"seq": seq, "next_by_subj": subject})
        except JetStreamApiError as e:
            if e.err_code == ERR_NO_MESSAGE_FOUND or e.code == 404:
                return None
            raise
        return reply.get("message")

    # --- consumers -----------------------------------------------------------------------

    async def create_consumer(self, stream: str, config: dict, action: str | None = "create") -> dict:
        """Create a named consumer. ``action="create"`` fails if it exists with another config."""
        name = config.get("name") or config.get("durable_name")
        body: dict[str, Any] = {"stream_name": stream, "config": config}
        if action:
            body["action"] = action
        return await self.request(f"CONSUMER.CREATE.{stream}.{name}", body)

    async def consumer_info(self, stream: str, consumer: str) -> dict | None:
        """Consumer info (with ``priority_groups`` state), or None if it does not exist."""
        try:
            return await self.request(f"CONSUMER.INFO.{stream}.{consumer}")
        except JetStreamApiError as e:
            if e.err_code == ERR_CONSUMER_NOT_FOUND:
                return None
            raise

    async def delete_consumer(self, stream: str, consumer: str) -> bool:
        try:
            await self.request(f"CONSUMER.DELETE.{stream}.{consumer}")
            return True
        except JetStreamApiError as e:
            if e.err_code == ERR_CONSUMER_NOT_FOUND:
                return False
            raise

    async def list_consumers(self, stream: str) -> list[dict]:
        out: list[dict] = []
        while True:
            page = await self.request(f"CONSUMER.LIST.{stream}", {"offset": len(out)})
            got = page.get("consumers") or []
            out.extend(got)
            if not got or len(out) >= page.get("total", 0):
                return out

    async def unpin(self, stream: str, consumer: str, group: str) -> None:
        """Clear the pin of ``group``; the server then picks another waiting instance."""
        await self.request(f"CONSUMER.UNPIN.{stream}.{consumer}", {"group": group})

    def can_reset_consumers(self) -> bool:
        """Whether the connected server has ``$JS.API.CONSUMER.RESET`` (2.14+)."""
        return server_version(self.nc) >= CONSUMER_RESET_VERSION

    async def reset_consumer(self, stream: str, consumer: str, seq: int, timeout: float | None = None) -> dict:
        """Move a consumer so that its next message is the first at or after stream sequence
        ``seq``: everything below counts as acknowledged, nothing is pending or redelivered
        (the server forgets its deliveries). A pin is left as it is."""
        return await self.request(f"CONSUMER.RESET.{stream}.{consumer}", {"seq": seq}, timeout=timeout)
