"""The one place that touches nats-py's private internals, for the member job's hot path.

nats-py turns every inbound MSG into a ``Msg`` with a parsed header dict, queues it and runs a
callback task for it; at hundreds of thousands of messages a second that object layer, not the
server, is the limit. ``subscribe_raw`` hands a synchronous handler the raw
``(subject, reply, data, header block)`` of each message instead, by routing the
subscription's sid ahead of ``Client._process_msg``; ``publish_raw`` queues pre-formatted
``PUB`` commands. Both check nats-py's version and the signatures they rely on, and fall back to
nats-py's public API (a normal subscription whose ``Msg`` is turned back into the same raw
form; ``publish`` per message) when anything differs. Tests run both paths.

Ahead of nats-py's protocol parser, ``RawFrames`` takes the complete ``MSG``/``HMSG`` frames of
raw sids at the front of each chunk read (one slice and split per frame, no regular expression,
no coroutine per message: half of what nats-py's parser and dispatch cost a direct-get reply)
and leaves every other frame, and any frame it is unsure of, to nats-py's own parser.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nats.aio.msg import Msg

log = logging.getLogger(__name__)

RawHandler = Callable[[bytes, bytes, bytes, "bytes | None"], None]
"""``handler(subject, reply, data, header_block_or_None)``; called on nats-py's read loop."""

#: a nats-py ``Client`` (or its ``Parser``, a ``Subscription``) as this module reaches into it: its
#: private attributes are checked at run time (``fast_path_supported``), not by the type checker
Internals = Any

TESTED_NATS_PY = ((2, 10), (3, 0))  # [low, high): the versions whose internals were read
_LIMITS = {"pending_msgs_limit": 1 << 24, "pending_bytes_limit": -1}


def _nats_py_version() -> tuple[int, int]:
    try:
        parts = version("nats-py").split(".")
        return int(parts[0]), int(parts[1])
    except (PackageNotFoundError, ValueError, IndexError):
        return (0, 0)


def fast_path_supported(nc: Internals) -> bool:
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


def _raw_publish_supported(nc: Internals) -> bool:
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

    def __init__(self, nc: Internals) -> None:
        self.nc = nc
        self.handlers: dict[int, RawHandler] = {}
        self.orig = nc._process_msg
        nc._process_msg = self.process_msg
        self.frames = RawFrames.install(nc, self.handlers)

    @classmethod
    def of(cls, nc: Internals) -> _Dispatch | None:
        d = getattr(nc, "__dict__", {}).get(cls.ATTR)
        if d is None and fast_path_supported(nc):
            d = cls(nc)
            setattr(nc, cls.ATTR, d)
        return d

    async def process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes,
                          headers: bytes | None) -> None:
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
            if self.frames is not None:
                self.frames.uninstall()


class RawFrames:
    """The complete ``MSG``/``HMSG`` frames of raw sids at the front of nats-py's read buffer,
    parsed and handed to their handlers in order; the rest of the buffer (another sid's
    message, ``PING``, ``INFO``, ``-ERR``, a frame it cannot read) goes to nats-py's parser as
    it is. A raw frame not yet whole waits for the next chunk, as nats-py's own parse would."""

    def __init__(self, nc: Internals, parser: Internals, handlers: dict[int, RawHandler],
                 control_line: int) -> None:
        self.nc, self.parser, self.handlers = nc, parser, handlers
        self.control_line = control_line  # nats-py's state between frames
        self.orig = parser.parse
        # the buffer whose front raw frame is not whole yet, and the length it needs then
        # (nats-py's ``reset`` on a reconnect gives the parser a new buffer: that one starts over)
        self.waiting: tuple[bytearray, int] | None = None

    @classmethod
    def install(cls, nc: Internals, handlers: dict[int, RawHandler]) -> RawFrames | None:
        parser = getattr(nc, "_ps", None)
        if parser is None or (control_line := _raw_frames_supported(parser)) is None:
            return None
        frames = cls(nc, parser, handlers, control_line)
        parser.parse = frames.parse  # an instance attribute: nats-py's read loop calls ``self._ps.parse``
        return frames

    def uninstall(self) -> None:
        if self.parser.__dict__.get("parse") == self.parse:
            del self.parser.parse

    async def parse(self, data: bytes = b"") -> None:
        ps = self.parser
        if ps.state != self.control_line:  # nats-py is inside a frame of its own
            await self.orig(data)
            return
        ps.buf.extend(data)
        if self.waiting is not None:
            buf, need = self.waiting
            if buf is ps.buf and len(buf) < need:
                return
            self.waiting = None
        if self._take() and ps.buf:
            await self.orig()

    def _take(self) -> bool:
        """Hand the whole raw frames at the buffer's front to their handlers; True when what is
        left is for nats-py's parser, False when a raw frame is waiting for its last bytes.

        ``MSG <subject> <sid> [reply] <total>`` / ``HMSG <subject> <sid> [reply] <header> <total>``."""
        buf = self.parser.buf
        if not buf.startswith(_MESSAGE_OPS):
            return True
        view = bytes(buf)
        size, pos, count, nbytes = len(view), 0, 0, 0
        leftover = True
        while pos < size:
            if view.startswith(b"HMSG ", pos):
                skip, headed = 5, True
            elif view.startswith(b"MSG ", pos):
                skip, headed = 4, False
            else:
                break
            fixed = 4 if headed else 3  # subject, sid, [header size,] total
            eol = view.find(b"\r\n", pos)
            parts = view[pos + skip:eol].split() if eol > 0 else []
            reply = parts.pop(2) if len(parts) == fixed + 1 else b""
            if len(parts) != fixed or not (parts[1].isdigit() and parts[-1].isdigit() and parts[-2].isdigit()):
                break  # not whole, or malformed: nats-py waits for it or says what is wrong
            handler = self.handlers.get(int(parts[1]))
            if handler is None:
                break
            start = eol + 2
            stop = start + int(parts[-1])
            if stop + 2 > size:
                self.waiting = (buf, stop + 2 - pos)
                leftover = False
                break
            split = start + int(parts[2]) if headed else start
            if split > stop:
                break
            hdr = view[start:split] if headed else None
            payload = view[split:stop]
            pos = stop + 2
            count += 1
            nbytes += len(payload)
            try:
                handler(parts[0], reply, payload, hdr)
            except Exception:  # never break nats-py's read loop
                log.exception("raw message handler failed")
        if pos:
            del buf[:pos]
        if count:
            stats = self.nc.stats
            stats["in_msgs"] += count
            stats["in_bytes"] += nbytes
        return leftover


_MESSAGE_OPS = (b"HMSG ", b"MSG ")


def _raw_frames_supported(parser: Internals) -> int | None:
    """nats-py's ``Parser`` as read for ``RawFrames`` (a bytearray ``buf``, a ``state``, a
    coroutine ``parse(data)``): its control-line state's value, or None when it differs."""
    try:
        from nats.protocol import parser as nats_parser
    except ImportError:
        return None
    state = getattr(nats_parser, "AWAITING_CONTROL_LINE", None)
    fn = getattr(parser, "parse", None)
    if not isinstance(state, int) or fn is None or not inspect.iscoroutinefunction(fn) \
            or not hasattr(parser, "__dict__"):
        return None
    if not isinstance(getattr(parser, "buf", None), bytearray) or not hasattr(parser, "state"):
        return None
    try:
        if list(inspect.signature(fn).parameters) != ["data"]:
            return None
    except (TypeError, ValueError):
        return None
    return state


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

    def __init__(self, sub: Internals, dispatch: _Dispatch | None) -> None:
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


async def subscribe_raw(nc: Internals, subject: str, handler: RawHandler, *,
                        fast: bool | None = None) -> RawSubscription:
    """Subscribe ``handler`` to ``subject``. ``fast``: None = the fast path when supported,
    False = the public API, True = the fast path or RuntimeError."""
    dispatch = _Dispatch.of(nc) if fast is not False else None
    if fast and dispatch is None:
        raise RuntimeError("fast_path: this nats-py has no compatible Client._process_msg")

    async def public_cb(msg: Msg) -> None:
        handler(msg.subject.encode(), (msg.reply or "").encode(), msg.data, _header_block(msg.headers))

    sub = await nc.subscribe(subject, cb=public_cb, **_LIMITS)
    if dispatch is not None:
        dispatch.handlers[sub._id] = handler
    return RawSubscription(sub, dispatch)


async def publish_raw(nc: Internals, commands: bytes, count: int, payload_bytes: int) -> bool:
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
