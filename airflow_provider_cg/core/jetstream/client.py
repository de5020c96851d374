"""Pull consumers with priority groups on a nats-py core connection (nats-py 2.16 has none).

A :class:`PriorityClient` sends pull requests (``$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>``)
carrying ``group`` always, ``id`` once pinned, and the overflow/prioritized fields, and reads
the replies on one inbox subscription of its own. It tracks the pin (``Nats-Pin-Id``), handles
the statuses 100/404/408/409/423/503 and pipelines double acks.

Pull outcomes. ``pull()`` returns the messages that arrived when the batch is full, on
404 / 408, on 409 "Batch Completed" / "Message Size Exceeds MaxBytes", or when the local
deadline (``expires`` + 1 s) passes without an answer; ``last_end`` says which (:class:`PullEnd`).
Anything else raises a :class:`PullError` whose ``messages`` holds what was delivered to this
pull before the status (those are pending on the server and must be resolved by the caller):

- :class:`PinLost` (423): the pin moved or the sent ``id`` is stale. The pin is cleared and
  ``on_unpinned(pin_id, reason)`` fired first; the next pull goes out without ``id`` (standby).
- :class:`ConsumerGone`: 409 "Consumer Deleted", or 503 (no responders) and the consumer
  does not exist any more. Terminal.
- :class:`PullTransient`: 409 "Leadership Change" / "Server Shutdown" / "Exceeded MaxWaiting",
  503 while the consumer exists, missed idle heartbeats, connection errors. Pull again.
- :class:`PullRejected`: 400 / 409 "Exceeded MaxRequest..." / "Consumer is push based" / 412:
  the request itself is wrong. Not retryable.

Server facts (nats-server 2.15, ``server/consumer.go``) this relies on:

- Every message delivered on a ``pinned_client`` consumer carries ``Nats-Pin-Id`` (not only
  the first one).
- The pin timer (``priority_timeout``) is reset only by a *new pull request* that carries the
  current ``id``; deliveries and acks do not reset it. A pinned client must therefore issue
  pulls more often than ``priority_timeout``: a single pull whose ``expires`` (or whose
  delivery time) exceeds it loses the pin mid-pull.
- ``423 Nats-Pin-Id mismatch``: a new pull carries an ``id`` other than the current pin.
  ``423 Nats-Wrong-Pin-Id`` (with ``Nats-Pending-Messages``): a *waiting* pull carries an old
  ``id`` when the server picks a new pin; this is only sent when there is a message to deliver.
- Data messages arrive with the original message subject, not the pull's reply subject, so
  they cannot be told apart per pull: this client keeps at most one pull outstanding.
- A double ack is answered with an empty message even when the message was already acked;
  an ack for a sequence the consumer never delivered gets no answer; an ack to a deleted
  consumer gets ``503`` (no responders).

Fast path. The client's two subscriptions (pull replies, ack replies) take raw bytes through
``nats_fastpath.subscribe_raw`` and ``ack_sync_many`` queues its ``PUB`` lines through
``nats_fastpath.publish_raw``: that module is the only one that touches nats-py's private
internals, checks the version, and falls back to the public API. ``fast_path=False`` forces
the public API. Measured by ``benchmarks/bench_pull.py`` (2 cores, local server, pinned
consumer, 200-byte messages, batch 10,000, quiet machine): pull only 207-222k msg/s vs 127-139k
on the public path; pull + ``ack_sync_many`` 92-111k vs 56-61k msg/s; nats-py's ``fetch`` +
``msg.ack()`` 30-32k.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from nats.errors import NoRespondersError

from airflow_provider_cg.core.errors import ConsumerGroupError
from airflow_provider_cg.core.jetstream.api import DEFAULT_PREFIX, JsApi
from airflow_provider_cg.core.jetstream.fastpath import RawSubscription, publish_raw, subscribe_raw
from airflow_provider_cg.core.jetstream.protocol import (
    PIN_HEADER,
    AckOutcome,
    AckResults,
    ConsumerGone,
    PinLost,
    PulledMsg,
    PullEnd,
    PullError,
    PullTransient,
    classify_status,
    parse_status,
    status_text,
)

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

log = logging.getLogger(__name__)

_PIN_KEY = b"\r\nNats-Pin-Id:"
_LOCAL_GRACE = 1.0  # seconds after ``expires`` before a pull ends without a server answer
_NO_EXPIRES_WAIT = 5.0  # local deadline of a no_wait pull without expires
_MAX_TRACKED = 64  # old pulls whose late 423 still tells us about the pin



# --- the client ----------------------------------------------------------------------------


class _Pull:
    __slots__ = (
        "token",
        "batch",
        "msgs",
        "fut",
        "pin_sent",
        "prefetch",
        "bytes_left",
        "seen",
        "hb_mark",
        "end",
        "error",
        "timers",
    )

    def __init__(
        self, token: int, batch: int, fut: asyncio.Future, pin_sent: str | None, prefetch: bool = False
    ) -> None:
        self.token = token
        self.prefetch = prefetch
        self.batch = batch
        self.msgs: list[PulledMsg] = []
        self.fut = fut
        self.pin_sent = pin_sent
        self.bytes_left: int | None = None  # what max_bytes still allows (None: no byte limit)
        self.seen = 0  # messages + heartbeats, for the liveness check
        self.hb_mark = 0
        self.end: PullEnd | None = None
        self.error: PullError | None = None
        self.timers: list[asyncio.TimerHandle] = []


class _AckBatch:
    __slots__ = ("results", "remaining", "fut")

    def __init__(self, results: AckResults, fut: asyncio.Future) -> None:
        self.results = results
        self.remaining = len(results)
        self.fut = fut

    def set(self, i: int, outcome: AckOutcome, detail: str | None) -> None:
        res = self.results
        if 0 <= i < len(res) and res[i] is AckOutcome.TIMEOUT:
            res[i] = outcome
            if detail:
                res.details[i] = detail
            self.remaining -= 1
            if self.remaining <= 0 and not self.fut.done():
                self.fut.set_result(None)


class PriorityClient:
    """Pull client of one priority-group consumer (``pinned_client``, ``overflow`` or
    ``prioritized``) on a nats-py connection.

    ``on_pinned(pin_id)`` fires when a message brings a new ``Nats-Pin-Id``;
    ``on_unpinned(pin_id, reason)`` when that pin is lost (reason: ``"423 <description>"``,
    ``"unpin"``, ``"repinned"``, ``"closed"``). Callbacks may be plain functions or coroutine
    functions. One pull at a time per client; acks may run concurrently with a pull.
    """

    def __init__(
        self,
        nc: NATS,
        stream: str,
        consumer: str,
        group: str = "PCG",
        *,
        js_prefix: str = DEFAULT_PREFIX,
        on_pinned: Callable[[str], Any] | None = None,
        on_unpinned: Callable[[str, str], Any] | None = None,
        fast_path: bool | None = None,
    ) -> None:
        self.nc = nc
        self.stream = stream
        self.consumer = consumer
        self.group = group
        self.on_pinned = on_pinned
        self.on_unpinned = on_unpinned
        self._api = JsApi(nc, prefix=js_prefix)
        self._next_subject = f"{js_prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._want_fast = fast_path
        self._subs: list[RawSubscription] = []
        self._started = False
        self._start_lock = asyncio.Lock()
        self._closed = False
        self._pin_id: str | None = None
        self._pin_line: bytes | None = None
        self._cur: _Pull | None = None
        self._busy = False
        self._stray: list[PulledMsg] = []
        self._deferred: PullError | None = None
        self._pull_seq = 0
        self._sent_ids: dict[int, str | None] = {}
        self._pull_prefix = ""
        self._pull_plen = 0
        self._ack_prefix = ""
        self._ack_plen = 0
        self._ack_gen = 0
        self._ack_batches: dict[int, _AckBatch] = {}
        self.last_end: PullEnd | None = None

    # --- state ---------------------------------------------------------------------------

    @property
    def pin_id(self) -> str | None:
        return self._pin_id

    @property
    def is_pinned(self) -> bool:
        return self._pin_id is not None

    @property
    def fast_path(self) -> bool:
        return bool(self._subs) and self._subs[0].fast

    @property
    def buffered(self) -> int:
        """Delivered messages nobody has seen yet (prefetch, abandoned pulls): the next pull
        returns them first."""
        return len(self._stray)

    async def __aenter__(self) -> PriorityClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Subscribe the pull and ack inboxes (done on first use otherwise)."""
        if self._started:
            return
        async with self._start_lock:
            if self._started:
                return
            if self._closed:
                raise RuntimeError("priority client is closed")
            base = self.nc.new_inbox()
            self._pull_prefix = f"{base}.P."
            self._pull_plen = len(self._pull_prefix)
            self._ack_prefix = f"{base}.A."
            self._ack_plen = len(self._ack_prefix)
            psub = await subscribe_raw(self.nc, self._pull_prefix + "*", self._on_pull_raw, fast=self._want_fast)
            asub = await subscribe_raw(self.nc, self._ack_prefix + "*.*", self._on_ack_raw, fast=self._want_fast)
            self._subs = [psub, asub]
            self._started = True

    async def close(self) -> None:
        """Unsubscribe; end a pull in progress; nak messages nobody received (best effort)."""
        if self._closed:
            return
        self._closed = True
        p = self._cur
        if p is not None:
            self._finish(p, error=PullTransient(0, "client closed", p.msgs))
        for b in list(self._ack_batches.values()):
            if not b.fut.done():
                b.fut.set_result(None)
        stray, self._stray = self._stray, []
        if self._deferred is not None:
            stray += self._deferred.messages
            self._deferred = None
        if stray and self.nc.is_connected:
            for m in stray:
                try:
                    await self.nc.publish(m.reply, b"-NAK")
                except Exception:
                    break
        if self._pin_id:
            self._unpinned("closed")
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs = []

    # --- pin tracking ---------------------------------------------------------------------

    def _call(self, cb: Callable | None, *args: str) -> None:
        if cb is None:
            return
        try:
            res = cb(*args)
            if inspect.isawaitable(res):
                asyncio.ensure_future(res)
        except Exception:
            log.exception("priority client: pin callback failed")

    def _pinned(self, pin: str) -> None:
        old = self._pin_id
        if old == pin:
            return
        if old is not None:
            self._unpinned("repinned")
        self._pin_id = pin
        self._pin_line = f"\r\n{PIN_HEADER}: {pin}\r\n".encode()
        self._call(self.on_pinned, pin)

    def _unpinned(self, reason: str) -> None:
        old = self._pin_id
        if old is None:
            return
        self._pin_id = None
        self._pin_line = None
        self._call(self.on_unpinned, old, reason)

    # --- inbound ----------------------------------------------------------------------------

    def _on_pull_raw(self, subject: bytes, reply: bytes, data: bytes, hdr: bytes | None) -> None:
        if reply:
            pin = None
            if hdr is not None:
                line = self._pin_line
                if line is not None and line in hdr:
                    pin = self._pin_id
                else:
                    i = hdr.find(_PIN_KEY)
                    if i >= 0:
                        i += len(_PIN_KEY)
                        pin = hdr[i : hdr.find(b"\r\n", i)].strip().decode()
                        self._pinned(pin)
            m = PulledMsg(subject.decode(), reply.decode(), data, hdr, None, pin)
            p = self._cur
            if p is not None and p.bytes_left is not None:
                self._count_bytes(p, len(subject) + len(reply) + len(data), len(hdr) if hdr else 0, pin)
            self._deliver(m)
            return
        if hdr is None:
            return
        st = parse_status(hdr)
        if st is not None:
            token = subject[self._pull_plen :]
            self._on_status(int(token) if token.isdigit() else -1, st[0], st[1])

    @staticmethod
    def _count_bytes(p: _Pull, size: int, hdr_len: int, pin: str | None) -> None:
        """Track max_bytes like the server: subject + ack reply + headers + data, where the
        headers are counted before the server added ``Nats-Pin-Id`` (an exact hit of the
        limit ends the pull on the server without any status)."""
        if pin and hdr_len:
            hdr_len -= len(PIN_HEADER) + len(pin) + 4  # "Nats-Pin-Id: <pin>\r\n"
            if hdr_len <= 12:  # only "NATS/1.0\r\n\r\n" left: the message had no headers
                hdr_len = 0
        p.bytes_left = left = (p.bytes_left or 0) - size - hdr_len
        if left <= 0:
            p.batch = len(p.msgs) + 1  # this message is the last one

    def _deliver(self, m: PulledMsg) -> None:
        p = self._cur
        if p is None:
            self._stray.append(m)
            return
        p.msgs.append(m)
        p.seen += 1
        if len(p.msgs) >= p.batch:
            self._sent_ids.pop(p.token, None)
            maxed = p.bytes_left is not None and p.bytes_left <= 0
            self._finish(p, PullEnd.MAX_BYTES if maxed else PullEnd.BATCH_FULL)

    def _on_status(self, token: int, code: int, desc: str) -> None:
        p = self._cur
        if code == 100:
            if p is not None and p.token == token:
                p.seen += 1
            return
        sent = self._sent_ids.pop(token, None)
        if code == 423 and sent is not None and sent == self._pin_id:
            self._unpinned(f"423 {desc}")
        if p is None or p.token != token:
            return  # late status of a pull that already ended
        kind = classify_status(code, desc)
        if isinstance(kind, PullEnd):
            self._finish(p, kind)
        elif kind is PinLost:
            self._finish(p, error=PinLost(code, desc, p.msgs, pin_id=sent))
        elif kind is not None:
            self._finish(p, error=kind(code, desc, p.msgs))

    def _on_ack_raw(self, subject: bytes, reply: bytes, data: bytes, hdr: bytes | None) -> None:
        rest = subject[self._ack_plen :]
        dot = rest.find(b".")
        b = self._ack_batches.get(int(rest[:dot])) if dot > 0 else None
        if b is None:
            return
        if hdr is None and not data:
            b.set(int(rest[dot + 1 :]), AckOutcome.ACKED, None)
            return
        st = parse_status(hdr) if hdr is not None else None
        detail = status_text(*st) if st else (bytes(data[:200]).decode("utf-8", "replace") or "error")
        b.set(int(rest[dot + 1 :]), AckOutcome.ERROR, detail)

    # --- pulls ------------------------------------------------------------------------------

    def _finish(self, p: _Pull, end: PullEnd | None = None, error: PullError | None = None) -> None:
        if self._cur is p:
            self._cur = None
        for t in p.timers:
            t.cancel()
        p.timers.clear()
        if p.end is None and p.error is None:
            p.end, p.error = end, error
            if p.prefetch:  # nobody waits for it yet: park the outcome for the next pull
                if error is not None:
                    self._deferred = error
                elif p.msgs:
                    self._stray.extend(p.msgs)
                    p.msgs = []
        if not p.fut.done():
            p.fut.set_result(None)

    def _abandon(self, p: _Pull) -> None:
        """Nobody will see ``p``'s result: keep what it got (even before an error) for the next pull."""
        if self._cur is p:
            self._finish(p, PullEnd.TIMEOUT)
        if p.msgs:
            self._stray[:0] = p.msgs
            p.msgs = []

    def _check_heartbeat(self, p: _Pull, interval: float, due: float) -> None:
        if self._cur is not p:
            return
        loop = asyncio.get_running_loop()
        # A check that fires late means the loop was blocked: what arrived meanwhile may not be
        # parsed yet, so judge at the next check instead.
        stalled = loop.time() - due > 0.25 * interval
        if p.seen == p.hb_mark and not stalled:
            self._finish(p, error=PullTransient(0, "missed idle heartbeats", p.msgs))
            return
        p.hb_mark = p.seen
        nxt = loop.time() + interval
        p.timers[1:] = [loop.call_at(nxt, self._check_heartbeat, p, interval, nxt)]  # [0]: the deadline

    async def _issue(self, batch: int, opts: dict[str, Any], prefetch: bool = False) -> _Pull:
        expires = opts.get("expires", 5.0)
        idle_heartbeat = opts.get("idle_heartbeat")
        if batch < 1:
            raise ValueError("batch must be >= 1")
        if idle_heartbeat and (not expires or idle_heartbeat * 2 > expires):
            raise ValueError("idle_heartbeat needs expires >= 2 * idle_heartbeat")
        await self.start()
        if self._closed:
            raise RuntimeError("priority client is closed")
        req: dict[str, Any] = {"batch": batch, "group": self.group}
        if expires:
            req["expires"] = int(expires * 1e9)
        if opts.get("max_bytes"):
            req["max_bytes"] = int(opts["max_bytes"])
        if idle_heartbeat:
            req["idle_heartbeat"] = int(idle_heartbeat * 1e9)
        if opts.get("no_wait"):
            req["no_wait"] = True
        for key in ("min_pending", "min_ack_pending", "priority"):
            if opts.get(key) is not None:
                req[key] = int(opts[key])
        pin = self._pin_id
        if pin:
            req["id"] = pin
        self._pull_seq += 1
        loop = asyncio.get_running_loop()
        p = _Pull(self._pull_seq, batch, loop.create_future(), pin, prefetch)
        if opts.get("max_bytes"):
            p.bytes_left = int(opts["max_bytes"])
        self._sent_ids[p.token] = pin
        while len(self._sent_ids) > _MAX_TRACKED:
            del self._sent_ids[next(iter(self._sent_ids))]
        self._cur = p
        wait = (expires + _LOCAL_GRACE) if expires else _NO_EXPIRES_WAIT
        p.timers.append(loop.call_later(wait, self._finish, p, PullEnd.TIMEOUT))
        if idle_heartbeat:
            interval, due = 2 * idle_heartbeat, loop.time() + 2 * idle_heartbeat
            p.timers.append(loop.call_at(due, self._check_heartbeat, p, interval, due))
        try:
            reply = f"{self._pull_prefix}{p.token}"
            await self.nc.publish(self._next_subject, json.dumps(req).encode(), reply=reply)
        except Exception as e:
            self._finish(p, error=PullTransient(0, f"pull request not sent: {type(e).__name__}: {e}", p.msgs))
        return p

    async def _checked(self, err: PullError) -> PullError:
        """A 503 means "consumer gone" only if consumer info agrees."""
        if err.code == 503 and isinstance(err, ConsumerGone):
            try:
                exists = await self._api.consumer_info(self.stream, self.consumer) is not None
            except ConsumerGroupError:
                exists = True  # cannot tell: do not claim it is gone
            cls, why = (
                (PullTransient, "exists but serves no pulls") if exists else (ConsumerGone, "does not exist")
            )
            return cls(503, f"No Responders (consumer {why})", err.messages)
        return err

    def _take_stray(self, want: int) -> list[PulledMsg]:
        got, self._stray = self._stray[:want], self._stray[want:]
        return got

    async def _next_batch(self, want: int, opts: dict[str, Any]) -> list[PulledMsg]:
        """Up to ``want`` messages: a prefetched pull's result first, then one new pull."""
        adopted: PullEnd | None = None
        p = self._cur
        if p is not None and p.prefetch:
            await asyncio.shield(p.fut)  # a cancelled caller leaves it running (parked)
            adopted = p.end
        err = self._deferred
        if err is not None:
            self._deferred = None
            err.messages[:0] = self._take_stray(len(self._stray))
            raise await self._checked(err)
        first = self._take_stray(want)
        if len(first) >= want:
            self.last_end = adopted or PullEnd.BUFFERED
            return first
        p = await self._issue(want - len(first), opts)
        try:
            await p.fut
        except asyncio.CancelledError:
            self._abandon(p)
            self._stray[:0] = first
            raise
        if p.error is not None:
            p.error.messages[:0] = first
            raise await self._checked(p.error)
        self.last_end = p.end
        return first + p.msgs if first else p.msgs

    async def pull(
        self,
        batch: int,
        *,
        expires: float | None = 5.0,
        max_bytes: int | None = None,
        idle_heartbeat: float | None = None,
        min_pending: int | None = None,
        min_ack_pending: int | None = None,
        priority: int | None = None,
        no_wait: bool = False,
    ) -> list[PulledMsg]:
        """One pull request for up to ``batch`` messages (durations in seconds).

        Returns on a full batch, 404, 408, max-bytes 409s or ``expires`` + 1 s without answer
        (``last_end`` says which); raises :class:`PullError` subclasses otherwise. Messages
        left by a prefetch or an abandoned pull come first. A pinned client must pull more
        often than the consumer's ``priority_timeout``. ``min_pending`` is checked per
        message: a pull gets messages while ``num_pending`` (counting the one being
        delivered) is at least ``min_pending`` (or ack pending >= ``min_ack_pending``).
        """
        opts = {
            "expires": expires,
            "max_bytes": max_bytes,
            "idle_heartbeat": idle_heartbeat,
            "min_pending": min_pending,
            "min_ack_pending": min_ack_pending,
            "priority": priority,
            "no_wait": no_wait,
        }
        self._enter()
        try:
            return await self._next_batch(batch, opts)
        finally:
            self._busy = False

    def _enter(self) -> None:
        if self._busy:
            raise RuntimeError("a pull is already in progress on this client (one at a time)")
        self._busy = True

    async def iter_batches(
        self,
        batch: int,
        *,
        max_messages: int | None = None,
        prefetch: bool = True,
        until_empty: bool = True,
        **pull_kwargs: Any,
    ) -> AsyncIterator[list[PulledMsg]]:
        """Yield batches of up to ``batch`` messages (``pull_kwargs`` as for :meth:`pull`).

        With ``prefetch`` the next pull is already out while the caller works on the current
        batch (only when pinned, or on a consumer without pinning); what it brings is parked
        in the client, so leaving the loop early loses nothing: the next pull returns it,
        :meth:`close` naks it. Never asks for more than ``max_messages`` in total. With
        ``until_empty`` it stops after the first batch that comes back short (404/408/timeout).
        """
        opts = {"expires": 5.0, **pull_kwargs}
        remaining = max_messages
        while remaining is None or remaining > 0:
            want = batch if remaining is None else min(batch, remaining)
            self._enter()
            try:
                msgs = await self._next_batch(want, opts)
                if remaining is not None:
                    remaining -= len(msgs)
                short = len(msgs) < want and self.last_end is not PullEnd.MAX_BYTES
                more = (remaining is None or remaining > 0) and not (until_empty and short)
                free = self.is_pinned or (msgs and msgs[-1].pin_id is None)
                if prefetch and more and free and self._cur is None:
                    await self._issue(
                        batch if remaining is None else min(batch, remaining), opts, prefetch=True
                    )
            finally:
                self._busy = False
            if msgs:
                yield msgs
            if not more:
                return

    # --- acks -------------------------------------------------------------------------------

    async def ack_sync_many(self, msgs: Sequence[PulledMsg], timeout: float = 5.0) -> AckResults:
        """Double-ack every message, pipelined, and wait up to ``timeout`` (from the last send)
        for the server's answers. One outcome per message, in order (see :class:`AckOutcome`)."""
        await self.start()
        results = AckResults([AckOutcome.TIMEOUT] * len(msgs))
        if not msgs:
            return results
        self._ack_gen += 1
        gen = self._ack_gen
        batch = _AckBatch(results, asyncio.get_running_loop().create_future())
        self._ack_batches[gen] = batch
        prefix = f"{self._ack_prefix}{gen}."
        try:
            sent = await self._publish_acks_raw(msgs, prefix.encode()) if self.fast_path else 0
            publish = self.nc.publish  # the rest, also while reconnecting: it applies its buffer limit
            for i in range(sent, len(msgs)):
                try:
                    await publish(msgs[i].reply, b"+ACK", reply=f"{prefix}{i}")
                except Exception as e:  # not sent: certainly not applied
                    why = f"not sent: {type(e).__name__}"
                    for j in range(i, len(msgs)):
                        batch.set(j, AckOutcome.ERROR, why)
                    break
            if batch.remaining > 0:
                try:
                    async with asyncio.timeout(timeout):
                        await batch.fut
                except TimeoutError:
                    pass
        finally:
            self._ack_batches.pop(gen, None)
        return results

    async def _publish_acks_raw(self, msgs: Sequence[PulledMsg], reply_prefix: bytes, chunk: int = 4096) -> int:
        """Queue ``PUB <ack subject> <reply_prefix><i> 4 +ACK`` per message, a chunk at a time
        (what ``publish`` does, minus its per-call checks: ack subjects come from the server,
        the prefix is ours). Returns how many were queued; the caller publishes the rest."""
        for start in range(0, len(msgs), chunk):
            part = msgs[start : start + chunk]
            blob = b"".join([b"PUB %b %b%d 4\r\n+ACK\r\n" % (m.reply.encode(), reply_prefix, start + k)
                             for k, m in enumerate(part)])
            if not await publish_raw(self.nc, blob, len(part), 4 * len(part)):
                return start
        return len(msgs)

    async def ack(self, msg: PulledMsg) -> None:
        """Plain ack (no confirmation)."""
        await self.nc.publish(msg.reply, b"+ACK")

    async def ack_many(self, msgs: Sequence[PulledMsg]) -> None:
        """Plain acks for every message, then a flush to the socket (no confirmation)."""
        publish = self.nc.publish
        for m in msgs:
            await publish(m.reply, b"+ACK")
        await self.nc.flush()

    async def nak(self, msg: PulledMsg, delay: float | None = None) -> None:
        """Negative ack: redeliver now, or after ``delay`` seconds."""
        payload = b"-NAK" if delay is None else b'-NAK {"delay": %d}' % int(delay * 1e9)
        await self.nc.publish(msg.reply, payload)

    async def term(self, msg: PulledMsg, reason: str | None = None) -> None:
        """Stop redelivering this message (``+TERM``, with an optional reason)."""
        payload = b"+TERM" if not reason else b"+TERM " + reason.encode()
        await self.nc.publish(msg.reply, payload)

    async def in_progress(self, msg: PulledMsg) -> None:
        """Reset the message's ack wait (``+WPI``)."""
        await self.nc.publish(msg.reply, b"+WPI")

    async def flush(self, timeout: float = 5.0) -> None:
        await self.nc.flush(timeout)  # type: ignore[arg-type]  # nats-py says int; asyncio.wait_for takes a float

    # --- admin ------------------------------------------------------------------------------

    async def unpin(self) -> None:
        """Clear the group's pin on the server (the next waiting pull gets pinned). If this
        client held the pin it drops it now (``on_unpinned(pin, "unpin")``)."""
        await self._api.unpin(self.stream, self.consumer, self.group)
        self._unpinned("unpin")

    async def keep_pin(self, timeout: float = 2.0) -> bool:
        """Reset the pin's ``priority_timeout`` without taking a message, for a pinned client
        that is busy elsewhere (e.g. a long sink write): the server resets the timer on every
        pull that carries the current pin id, and a pull with ``max_bytes`` 1 is answered with
        a status (409 max bytes, 404, 408), never a message. Returns False when the server says
        the pin moved (423); True otherwise, also when it did not answer in time (unknown)."""
        pin = self._pin_id
        if pin is None:
            return False
        req = {"batch": 1, "max_bytes": 1, "no_wait": True, "group": self.group, "id": pin}
        try:
            msg = await self.nc.request(self._next_subject, json.dumps(req).encode(), timeout=timeout)
        except NoRespondersError:  # the consumer is gone, or its stream is moving: ask
            try:
                gone = await self._api.consumer_info(self.stream, self.consumer) is None
            except ConsumerGroupError:
                gone = False
            if gone:
                self._unpinned("consumer deleted")
            return not gone
        except Exception as e:  # timeout, reconnecting: cannot tell
            log.debug("pin keep-alive got no answer: %s", type(e).__name__)
            return True
        status = (msg.headers or {}).get("Status", "")
        if status == "423" and self._pin_id == pin:
            self._unpinned(f"423 {(msg.headers or {}).get('Description', 'pin moved')}")
            return False
        return status != "423"

    async def holds_pin(self) -> bool:
        """Whether the server names this client's pin as the group's current one (a keep-alive
        pull cannot tell when nobody is pinned and nothing is pending)."""
        return self._pin_id is not None and (await self.group_state()).get("pinned_client_id") == self._pin_id

    async def consumer_info(self) -> dict:
        """Raw consumer info. Its ``priority_groups`` is
        ``[{"group": ..., "pinned_client_id": ..., "pinned_ts": ...}]`` (id absent and ts
        ``"0001-01-01T00:00:00Z"`` when nobody is pinned). Raises ConsumerGone if missing."""
        info = await self._api.consumer_info(self.stream, self.consumer)
        if info is None:
            raise ConsumerGone(404, f"consumer {self.consumer!r} on stream {self.stream!r} does not exist")
        return info

    async def group_state(self) -> dict:
        """This group's entry of ``priority_groups`` (``{}`` if the server reports none)."""
        info = await self.consumer_info()
        for g in info.get("priority_groups") or []:
            if g.get("group") == self.group:
                return g
        return {}
