"""A member run's progress where others can read it while the run goes on: the progress board.

A follower keeps its pin for minutes and its task's asset event comes at its end, so the page
(``ui/app.py``) could not show what it lands meanwhile. Each pinned run writes its figures into
a JetStream KV bucket of its own, ``cg-member-progress`` (not one of orbit's buckets: orbit's
tools never see it), one key per member: when it is pinned, at each progress line
(``--progress-interval``) and at its end, before it releases the pin. Entries expire an hour
after their last write (the bucket's TTL), so a run that died leaves nothing for long.

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
from datetime import UTC, datetime
from typing import Any

from airflow_provider_cg.core.landing.contract import Summary

log = logging.getLogger("airflow_provider_cg.landing")

BUCKET = "cg-member-progress"
TTL_S = 3600.0
#: how long a write may take before the run goes on without it
WRITE_TIMEOUT = 2.0
_KEY_SAFE = re.compile(r"[-_a-zA-Z0-9]+")

LANDING, ENDED = "landing", "ended"


def board_key(stream: str, group: str, member: str) -> str:
    """``<stream>.<group>.<member>``; a name with other characters than letters, digits, ``-``
    and ``_`` (a KV key cannot hold most) is written as ``=`` and its UTF-8 hex."""
    return ".".join(p if _KEY_SAFE.fullmatch(p) else "=" + p.encode().hex() for p in (stream, group, member))


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
        self._kv: Any = None
        self._revision: int | None = None  # of this run's last write; None: not written yet
        self._pending: asyncio.Task | None = None
        self._off = False  # the server refused once, or another run owns the entry now

    def report(self, state: str) -> dict:
        s = self.summary
        now = time.time()
        return {"v": 1, "stream": s.stream, "group": s.group, "member": s.member, "owner": self.owner,
                "pin_id": s.pin_id, "state": state, "started_at": _iso(self.started), "updated_at": _iso(now),
                "follow_until": _iso(self.follow_until), "messages_read": s.messages_read,
                "rows_written": s.rows_written, "batches": s.batches,
                "rate_msg_s": round(s.messages_read / max(now - self.started, 1e-9)),
                "interval_s": self.interval, "stop_reason": s.stop_reason or None, "holder": HOLDER}

    def post(self, state: str = LANDING) -> None:
        """Write the entry in the background (a progress line's): skipped while the last write
        is still under way, never waited for."""
        if self._off or self.summary.pin_id is None or (self._pending and not self._pending.done()):
            return
        self._pending = asyncio.get_running_loop().create_task(self._write(self.report(state)))

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


async def landing_now(nc: Any, js_prefix: str, groups: list[dict]) -> None:
    """Add ``landing_now`` to each member of ``groups`` (``GroupLag.to_dict()``) whose pinned run
    reports on the board: its entry, with ``age_s``, while its state is ``landing`` and it was
    written within three progress intervals. Nothing is added when the board does not exist."""
    import nats.js.errors

    js = nc.jetstream(prefix=js_prefix, timeout=WRITE_TIMEOUT)
    try:
        kv = await js.key_value(BUCKET)
    except nats.js.errors.BucketNotFoundError:
        return
    members = [(g, m) for g in groups for m in (g.get("members") or [])]

    async def entry(g: dict, m: dict) -> dict | None:
        try:
            return json.loads((await kv.get(board_key(g["stream"], g["group"], m["member"]))).value)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError, ValueError):
            return None

    now = time.time()
    for (_, m), e in zip(members, await asyncio.gather(*(entry(g, m) for g, m in members)), strict=True):
        if not isinstance(e, dict) or e.get("state") != LANDING:
            continue
        try:  # anyone who may write the bucket wrote it: only well-formed entries are shown
            age = now - datetime.fromisoformat(e["updated_at"]).timestamp()
            counts = {k: int(e.get(k) or 0) for k in ("messages_read", "rows_written", "batches", "rate_msg_s")}
            fresh = age <= 3 * float(e.get("interval_s") or 5) + 2
        except (KeyError, TypeError, ValueError):
            continue
        if fresh:
            m["landing_now"] = {**e, **counts, "age_s": round(max(age, 0.0), 1)}
