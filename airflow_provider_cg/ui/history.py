"""The last hour of each member, for the consumer-groups page's charts.

- **Landed messages** come from the landing tasks' asset events (``airflow_provider_cg.assets``)
  in Airflow's metadata DB: every run's ``messages_landed`` at its time, summed per 5 minutes.
  They survive restarts and are the same in every API server.
- **Backlog** is not stored anywhere by NATS, so the page samples it: every time the page or
  its JSON is served, each group's and member's backlog is kept in this API server process for
  an hour (the page reloads itself every 15 s while it is open). A restarted or another API
  server starts with no samples; the chart says how many it has.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from datetime import UTC, datetime
from typing import Any

WINDOW_S = 3600.0
BUCKET_S = 300.0
BUCKETS = int(WINDOW_S // BUCKET_S)
MAX_SERIES = 20_000  # (connection, stream, group, member) series kept; the oldest-touched go first
MAX_EVENTS = 50_000  # asset events of the last hour read at most (256 members landing each minute: 15,360)


class BacklogSamples:
    """Backlog samples per key, the last ``WINDOW_S`` seconds, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._series: dict[tuple, deque[tuple[float, int]]] = {}

    def record(self, key: tuple, backlog: int, now: float) -> None:
        with self._lock:
            series = self._series.pop(key, None) or deque()
            series.append((now, int(backlog)))
            while series and series[0][0] < now - WINDOW_S:
                series.popleft()
            self._series[key] = series  # re-inserted: the dict's order is the touch order
            while len(self._series) > MAX_SERIES:
                self._series.pop(next(iter(self._series)))

    def series(self, key: tuple, now: float) -> list[tuple[float, int]]:
        with self._lock:
            return [(t, n) for t, n in self._series.get(key, ()) if t >= now - WINDOW_S]


#: this API server process's samples
SAMPLES = BacklogSamples()


def bucket_of(at: float, now: float) -> int | None:
    """The 5-minute bucket (0 oldest .. BUCKETS-1 newest) of a time in the last hour."""
    age = now - at
    if age < 0 or age >= WINDOW_S:
        return None
    return BUCKETS - 1 - int(age // BUCKET_S)


def landed_last_hour(servers: list[str], now: float) -> dict[tuple[str, str, str | None], list[int]]:
    """Messages landed per 5 minutes over the last hour, per (stream, group, member), from the
    asset events announced through one of ``servers`` (``host:port``)."""
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from sqlalchemy import select

    since = datetime.fromtimestamp(now - WINDOW_S, UTC)
    out: dict[tuple[str, str, str | None], list[int]] = {}
    with create_session() as s:
        rows = s.execute(select(AssetEvent.timestamp, AssetEvent.extra).where(AssetEvent.timestamp >= since)
                         .order_by(AssetEvent.timestamp.desc()).limit(MAX_EVENTS)).all()
    for ts, x in rows:
        if not isinstance(x, dict) or "cg_extra_version" not in x:
            continue
        if not set(x.get("nats_servers") or ()) & set(servers):
            continue
        b = bucket_of(ts.timestamp(), now)
        if b is None:
            continue
        key = (str(x.get("stream")), str(x.get("group")), x.get("member"))
        out.setdefault(key, [0] * BUCKETS)[b] += int(x.get("messages_landed") or 0)
    return out


def with_history(conn_id: str, groups: list[dict[str, Any]], landed: dict, now: float | None = None) -> None:
    """Record this reading's backlog and attach each group's and member's last hour:
    ``{"backlog": [[unix time, messages], ...], "landed_per_5min": [12 counts, oldest first]}``."""
    now = time.time() if now is None else now
    for g in groups:
        if g.get("error"):
            continue
        total = [0] * BUCKETS
        for m in g.get("members") or []:
            key = (conn_id, g["stream"], g["group"], m["member"])
            SAMPLES.record(key, m.get("backlog") or 0, now)
            per = landed.get((g["stream"], g["group"], m["member"])) or [0] * BUCKETS
            total = [a + b for a, b in zip(total, per, strict=True)]
            m["history"] = {"backlog": [[round(t, 1), n] for t, n in SAMPLES.series(key, now)],
                            "landed_per_5min": per}
        key = (conn_id, g["stream"], g["group"], None)
        SAMPLES.record(key, g.get("backlog") or 0, now)
        g["history"] = {"backlog": [[round(t, 1), n] for t, n in SAMPLES.series(key, now)],
                        "landed_per_5min": total}
