"""A member run's progress where others can read it while the run goes on: the progress board.

A follower keeps its pin for minutes and its task's asset event comes at its end, so the page
(``ui/app.py``) could not show what it lands meanwhile. Each pinned run writes its figures into
a JetStream KV bucket of its own, ``cg-member-progress`` (not one of orbit's buckets: orbit's
tools never see it), one key per member: when it is pinned, at each progress line
(``--progress-interval``) and at its end, before it releases the pin. Each write carries the
member's backlog as the server counts it then (``backlog``, ``backlog_at``): a follower
reports its own lag every interval, and its Airflow task sends it on as metrics
(``metrics.FollowerReports``), so a burst that drains between two of the API server's
samples still shows. Entries expire an hour
after their last write (the bucket's TTL), so a run that died leaves nothing for long.

A follower that starts while the member's pin is held (the member's next run, come to relieve
the running one) says so under the member's key with ``.=next`` after it: ``warming up`` while
its Spark session and warm-up run, then ``waiting for the pin``. The pinned follower, once its
follow time is over, reads it (``successor``) and hands the pin over to a successor that waits
warm (``stop_rule.py``); the page shows both.

One run owns a member's entry at a time: the first write of a pinned run replaces whatever is
there, later writes are conditional on the revision the run wrote last, so a predecessor
that lost its pin (stalled, or ending after its successor began) never overwrites its
successor's figures. Best effort: a server that refuses (permissions, a full account) costs one
warning, never the run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from airflow_provider_cg.core.landing.contract import Summary

log = logging.getLogger("airflow_provider_cg.landing")

BUCKET = "cg-member-progress"
TTL_S = 3600.0
#: how long a write may take before the run goes on without it
WRITE_TIMEOUT = 2.0
_KEY_SAFE = re.compile(r"[-_a-zA-Z0-9]+")

LANDING, ENDED, HANDING_OVER = "landing", "ended", "handing over"
WARMING_UP, WAITING_FOR_PIN = "warming up", "waiting for the pin"  # a successor's states
#: the key part of the member's waiting successor (``=`` and no hex: no member's own)
SUCCESSOR = "=next"
#: a successor's entry older than this is not waiting any more (it writes every second)
SUCCESSOR_FRESH_S = 5.0


def board_key(stream: str, group: str, member: str) -> str:
    """``<stream>.<group>.<member>``; a name with other characters than letters, digits, ``-``
    and ``_`` (a KV key cannot hold most) is written as ``=`` and its UTF-8 hex."""
    return ".".join(p if _KEY_SAFE.fullmatch(p) else "=" + p.encode().hex() for p in (stream, group, member))


def successor_key(stream: str, group: str, member: str) -> str:
    return f"{board_key(stream, group, member)}.{SUCCESSOR}"


def _iso(wall: float | None) -> str | None:
    return None if wall is None else datetime.fromtimestamp(wall, UTC).isoformat(timespec="seconds")


def _holder() -> dict[str, Any]:
    """What holds the pin, as the page names it: this host and process, and the Airflow task
    that started the job when there is one (its ``AIRFLOW_CTX_*`` environment)."""
    dag, task = os.environ.get("AIRFLOW_CTX_DAG_ID"), os.environ.get("AIRFLOW_CTX_TASK_ID")
    return {"host": socket.gethostname(), "pid": os.getpid(), "task": f"{dag}.{task}" if dag and task else None}


HOLDER = _holder()


class ProgressBoard:
    """One run's entry on the board (see the module docstring)."""

    def __init__(self, nc: Any, js_prefix: str, summary: Summary, *, owner: str, interval: float) -> None:
        self.js = nc.jetstream(prefix=js_prefix, timeout=WRITE_TIMEOUT)
        self.summary, self.owner, self.interval = summary, owner, interval
        self.key = board_key(summary.stream, summary.group, summary.member or "")
        self.started = time.time()
        self.follow_until: float | None = None  # wall clock
        self.state = LANDING  # what a progress line's write says (``HANDING_OVER`` past its follow time)
        self._kv: Any = None
        self._revision: int | None = None  # of this run's last write; None: not written yet
        self._pending: asyncio.Task | None = None
        self._off = False  # the server refused once, or another run owns the entry now
        #: the member's backlog as the server counts it now (``MemberRun``): read with each
        #: progress line's write, so the run reports its own lag every interval
        self.backlog_of: Callable[[], Awaitable[int]] | None = None
        self.backlog: int | None = None  # as last read
        self.backlog_read_at: float | None = None  # wall clock

    def report(self, state: str) -> dict:
        s = self.summary
        now = time.time()
        return {"v": 1, "stream": s.stream, "group": s.group, "member": s.member, "owner": self.owner,
                "pin_id": s.pin_id, "state": state, "started_at": _iso(self.started), "updated_at": _iso(now),
                "follow_until": _iso(self.follow_until), "messages_read": s.messages_read,
                "rows_written": s.rows_written, "batches": s.batches,
                "rate_msg_s": round(s.messages_read / max(now - self.started, 1e-9)),
                "backlog": self.backlog, "backlog_at": _iso(self.backlog_read_at),
                "interval_s": self.interval, "stop_reason": s.stop_reason or None, "holder": HOLDER}

    def post(self) -> None:
        """Write the entry in the background (a progress line's): skipped while the last write
        is still under way, never waited for."""
        if self._off or self.summary.pin_id is None or (self._pending and not self._pending.done()):
            return
        self._pending = asyncio.get_running_loop().create_task(self._post())

    async def _post(self) -> None:
        await self.read_backlog()
        await self._write(self.report(self.state))

    async def read_backlog(self) -> None:
        """``backlog`` now (one request or so: never on the batch path); kept as it was when
        the server does not answer in time."""
        if self.backlog_of is None:
            return
        try:
            self.backlog = await asyncio.wait_for(self.backlog_of(), WRITE_TIMEOUT)
            self.backlog_read_at = time.time()
        except Exception as e:  # noqa: BLE001 - a figure of the report, never the run's failure
            log.debug("cg member=%s: backlog unread (%s)", self.summary.member, e)

    async def close(self) -> None:
        """The run's last write (``ended``), before it releases the pin."""
        if self._pending and not self._pending.done():
            await asyncio.wait([self._pending], timeout=WRITE_TIMEOUT)
        if self._off or self.summary.pin_id is None:
            return
        try:
            await asyncio.wait_for(self._write(self.report(ENDED)), WRITE_TIMEOUT)
        except TimeoutError:
            pass  # the entry goes stale on its own: the page stops showing it
        self._off = True  # written once

    async def announce(self, state: str) -> None:
        """As the member's waiting successor: ``state`` (``WARMING_UP``, ``WAITING_FOR_PIN``),
        rewritten every second by the caller while it waits. Best effort, as every write here."""
        if self._kv is None and self._off:
            return
        try:
            if self._kv is None:
                self._kv = await self._bucket()
            entry = {"v": 1, "owner": self.owner, "state": state, "updated_at": _iso(time.time()),
                     "holder": HOLDER}
            await self._kv.put(self._successor_key, json.dumps(entry, separators=(",", ":")).encode())
        except Exception as e:  # noqa: BLE001 - the predecessor then ends at its follow time plus its hand-over wait
            log.debug("cg member=%s: successor entry not written (%s)", self.summary.member, e)

    async def withdraw(self) -> None:
        """This run waits no more (pinned, or gone): its successor entry, if still its own, goes."""
        try:
            if self._kv is not None and (mine := await self._successor()) and mine.get("owner") == self.owner:
                await self._kv.delete(self._successor_key)
        except Exception as e:  # noqa: BLE001 - the entry goes stale on its own
            log.debug("cg member=%s: successor entry not removed (%s)", self.summary.member, e)

    async def successor(self) -> dict | None:
        """The member's successor that waits warm for the pin (another run, written within
        ``SUCCESSOR_FRESH_S``), or None."""
        try:
            if self._kv is None:
                self._kv = await self._bucket()
            entry = await self._successor()
        except Exception:  # noqa: BLE001 - none known: the follower goes on
            return None
        if not entry or entry.get("owner") == self.owner or entry.get("state") != WAITING_FOR_PIN:
            return None
        try:
            age = time.time() - datetime.fromisoformat(entry["updated_at"]).timestamp()
        except (KeyError, TypeError, ValueError):
            return None
        return entry if age <= SUCCESSOR_FRESH_S else None

    async def _successor(self) -> dict | None:
        import nats.js.errors

        try:
            entry = await self._kv.get(self._successor_key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        value = json.loads(entry.value or b"null")
        return value if isinstance(value, dict) else None

    @property
    def _successor_key(self) -> str:
        return successor_key(self.summary.stream, self.summary.group, self.summary.member or "")

    async def _write(self, report: dict) -> None:
        import nats.js.errors

        try:
            if self._kv is None:
                self._kv = await self._bucket()
            value = json.dumps(report, separators=(",", ":")).encode()
            if self._revision is None:
                self._revision = await self._kv.put(self.key, value)
            else:
                self._revision = await self._kv.update(self.key, value, last=self._revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            self._off = True  # another run of the member writes it now
        except Exception as e:  # noqa: BLE001 - best effort: the board never fails a run
            self._off = True
            log.warning("cg member=%s: progress board %s not written (%s); the page shows this run at its end",
                        self.summary.member, BUCKET, str(e)[:160] or type(e).__name__)

    async def _bucket(self) -> Any:
        import nats.js.errors
        from nats.js.api import StorageType

        try:
            return await self.js.key_value(BUCKET)
        except nats.js.errors.BucketNotFoundError:
            try:
                return await self.js.create_key_value(bucket=BUCKET, history=1, ttl=TTL_S,
                                                      storage=StorageType.MEMORY, direct=True)
            except nats.js.errors.APIError:
                return await self.js.key_value(BUCKET)  # created meanwhile by another run


def _now_showing(entry: Any, now: float) -> dict | None:
    """A pinned run's entry as it shows now (with ``age_s``): landing or handing over, written
    within three progress intervals; else None. Anyone who may write the bucket wrote it: only
    well-formed entries count."""
    if not isinstance(entry, dict) or entry.get("state") not in (LANDING, HANDING_OVER):
        return None
    try:
        age = now - datetime.fromisoformat(entry["updated_at"]).timestamp()
        counts: dict[str, int | None] = {k: int(entry.get(k) or 0)
                                         for k in ("messages_read", "rows_written", "batches", "rate_msg_s")}
        backlog = entry.get("backlog")
        counts["backlog"] = None if backlog is None else int(backlog)
        fresh = age <= 3 * float(entry.get("interval_s") or 5) + 2
    except (KeyError, TypeError, ValueError):
        return None
    return {**entry, **counts, "age_s": round(max(age, 0.0), 1)} if fresh else None


async def _entries(nc: Any, js_prefix: str, keys: list[str]) -> list[Any] | None:
    """The board's entries under ``keys`` (None each where there is none); None: no board."""
    import nats.js.errors

    js = nc.jetstream(prefix=js_prefix, timeout=WRITE_TIMEOUT)
    try:
        kv = await js.key_value(BUCKET)
    except nats.js.errors.BucketNotFoundError:
        return None

    async def entry(key: str) -> Any:
        try:
            return json.loads((await kv.get(key)).value)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError, ValueError):
            return None

    return list(await asyncio.gather(*(entry(k) for k in keys)))


async def landing_now(nc: Any, js_prefix: str, groups: list[dict]) -> None:
    """Add ``landing_now`` to each member of ``groups`` (``GroupLag.to_dict()``) whose pinned run
    reports on the board (``_now_showing``), and ``successor`` where the member's next follower
    waits (warming up, or warm: ``SUCCESSOR_FRESH_S``). Nothing is added when there is no board."""
    members = [m for g in groups for m in (g.get("members") or [])]
    keys = [k for g in groups for m in (g.get("members") or [])
            for k in (board_key(g["stream"], g["group"], m["member"]), successor_key(g["stream"], g["group"],
                                                                                    m["member"]))]
    found = await _entries(nc, js_prefix, keys)
    if found is None:
        return
    now = time.time()
    for i, m in enumerate(members):
        pinned, waiting = found[2 * i], found[2 * i + 1]
        if (shown := _now_showing(pinned, now)) is not None:
            m["landing_now"] = shown
        if isinstance(waiting, dict) and waiting.get("state") in (WARMING_UP, WAITING_FOR_PIN):
            try:
                age = now - datetime.fromisoformat(waiting["updated_at"]).timestamp()
            except (KeyError, TypeError, ValueError):
                continue
            if age <= SUCCESSOR_FRESH_S:
                m["successor"] = {"state": waiting["state"], "holder": waiting.get("holder")}


async def pinned_run(nc: Any, js_prefix: str, stream: str, group: str, member: str) -> dict | None:
    """The entry of the run that holds ``member``'s pin and reports on the board, as the page
    shows it (``_now_showing``), or None: when a follower's successor should start
    (``follow_until``)."""
    found = await _entries(nc, js_prefix, [board_key(stream, group, member)])
    return None if found is None else _now_showing(found[0], time.time())
