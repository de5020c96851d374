"""The one place that touches nats-py's private internals, for the member job's hot path.

nats-py turns every inbound MSG into a ``Msg`` with a parsed header dict, queues it and runs a
callback task for it; at hundreds of thousands of messages a second that object layer, not the
server, is the limit. ``subscribe_raw`` hands a synchronous handler the raw
``(subject, reply, data, header block)`` of each message instead, by routing the
subscription's sid ahead of ``Client._process_msg``; ``publish_raw`` queues pre-formatted
``PUB`` commands. Both check nats-py's version and the signatures they rely on, and fall back to
nats-py's public API (a normal subscription whose ``Msg`` is turned back into the same raw
form; ``publish`` per message) when anything differs. Tests run both paths.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version

log = logging.getLogger(__name__)

RawHandler = Callable[[bytes, bytes, bytes, "bytes | None"], None]
"""``handler(subject, reply, data, header_block_or_None)``; called on nats-py's read loop."""

TESTED_NATS_PY = ((2, 10), (3, 0))  # [low, high): the versions whose internals were read
_LIMITS = {"pending_msgs_limit": 1 << 24, "pending_bytes_limit": -1}


def _nats_py_version() -> tuple[int, int]:
    try:
        parts = version("nats-py").split(".")
        return int(parts[0]), int(parts[1])
    except (PackageNotFoundError, ValueError, IndexError):
        return (0, 0)


def fast_path_supported(nc) -> bool:
    """Whether this connection's nats-py is a version and shape the fast path was built for."""
    low, high = TESTED_NATS_PY
    if not low <= _nats_py_version() < high:
        return False
    fn = getattr(nc, "_process_msg", None)
    if fn is None or not inspect.iscoroutinefunction(fn) or not hasattr(nc, "__dict__"):
        return False
    if not isinstance(getattr(nc, "stats", None), dict):
        return False
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return names == ["sid", "subject", "reply", "data", "headers"]


def _raw_publish_supported(nc) -> bool:
    fn = getattr(nc, "_send_command", None)
    if fn is None or not inspect.iscoroutinefunction(fn):
        return False
    if not inspect.iscoroutinefunction(getattr(nc, "_flush_pending", None)):
        return False
    if not hasattr(nc, "_flush_queue") or not isinstance(getattr(nc, "stats", None), dict):
        return False
    return list(inspect.signature(fn).parameters)[:1] == ["cmd"]


class _Dispatch:
    """Routes the MSGs of registered sids to raw handlers, ahead of nats-py's
    Msg/header-dict/queue/task path. Installed once per connection; other sids pass through."""

    ATTR = "_cg_raw_dispatch"

    def __init__(self, nc) -> None:
        self.nc = nc
        self.handlers: dict[int, RawHandler] = {}
        self.orig = nc._process_msg
        nc._process_msg = self.process_msg

    @classmethod
    def of(cls, nc) -> _Dispatch | None:
        d = getattr(nc, "__dict__", {}).get(cls.ATTR)
        if d is None and fast_path_supported(nc):
            d = cls(nc)
            setattr(nc, cls.ATTR, d)
        return d

    async def process_msg(self, sid, subject, reply, data, headers) -> None:
        handler = self.handlers.get(sid)
        if handler is None:
            return await self.orig(sid, subject, reply, data, headers)
        stats = self.nc.stats
        stats["in_msgs"] += 1
        stats["in_bytes"] += len(data)
        try:
            handler(subject, reply, data, headers)
        except Exception:  # never break nats-py's read loop
            log.exception("raw message handler failed")

    def remove(self, sid: int) -> None:
        self.handlers.pop(sid, None)
        if not self.handlers and self.nc.__dict__.get("_process_msg") == self.process_msg:
            del self.nc._process_msg
            self.nc.__dict__.pop(self.ATTR, None)


def _header_block(headers: dict | None) -> bytes | None:
    """A ``Msg.headers`` dict back in wire form (nats-py keeps a status line as Status /
    Description entries)."""
    if not headers:
        return None
    status = headers.get("Status")
    # nats-py 2.16 leaks the following header lines into the description of a bare status
    # ("NATS/1.0 503\r\nNats-Subject: ..."): keep its first line only
    desc = headers.get("Description", "").split("\n", 1)[0].strip()
    first = f"NATS/1.0 {status} {desc}".rstrip() if status else "NATS/1.0"
    lines = [first] + [f"{k}: {v}" for k, v in headers.items() if k not in ("Status", "Description")]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class RawSubscription:
    """A subscription whose messages reach a ``RawHandler``; ``fast`` says which path."""

    def __init__(self, sub, dispatch: _Dispatch | None) -> None:
        self.sub, self.dispatch = sub, dispatch

    @property
    def fast(self) -> bool:
        return self.dispatch is not None

    async def unsubscribe(self) -> None:
        if self.dispatch is not None:
            self.dispatch.remove(self.sub._id)
        try:
            await self.sub.unsubscribe()
        except Exception:  # connection already closed
            pass


async def subscribe_raw(nc, subject: str, handler: RawHandler, *, fast: bool | None = None) -> RawSubscription:
    """Subscribe ``handler`` to ``subject``. ``fast``: None = the fast path when supported,
    False = the public API, True = the fast path or RuntimeError."""
    dispatch = _Dispatch.of(nc) if fast is not False else None
    if fast and dispatch is None:
        raise RuntimeError("fast_path: this nats-py has no compatible Client._process_msg")

    async def public_cb(msg) -> None:
        handler(msg.subject.encode(), (msg.reply or "").encode(), msg.data, _header_block(msg.headers))

    sub = await nc.subscribe(subject, cb=public_cb, **_LIMITS)
    if dispatch is not None:
        dispatch.handlers[sub._id] = handler
    return RawSubscription(sub, dispatch)


async def publish_raw(nc, commands: bytes, count: int, payload_bytes: int) -> bool:
    """Queue ``commands`` (complete ``PUB`` lines with payloads, ``count`` messages) into
    nats-py's outbound buffer, as ``publish`` would. Returns False (nothing sent) when this
    nats-py does not allow it or the connection is not up: the caller publishes normally."""
    if not (_raw_publish_supported(nc) and nc.is_connected and fast_path_supported(nc)):
        return False
    nc.stats["out_msgs"] += count
    nc.stats["out_bytes"] += payload_bytes
    await nc._send_command(commands)
    if nc._flush_queue is not None and nc._flush_queue.empty():
        await nc._flush_pending()
    return True
