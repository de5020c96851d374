"""The last hour of each group and member, for the consumer-groups page's charts.

- **Landed messages** come from the landing tasks' asset events (``airflow_provider_cg.assets``)
  in Airflow's metadata DB: every run's ``messages_landed`` at its time, summed per 5 minutes.
- **Backlog**: NATS keeps no history of it, so the API server samples it on a schedule, whether
  or not anyone looks (``sample_backlogs``, every ``[nats_consumer_groups]
  backlog_sample_seconds``, 60 by default; 0 turns it off), for every ``nats`` connection of the
  metadata DB and every one the page was asked for; a page view adds a sample too. The samples
  are rows of ``cg_backlog_samples`` in Airflow's metadata DB (created on first use, kept an
  hour), so a restarted API server, or another one behind the load balancer, draws the same line.

Both survive restarts and are the same in every API server.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from airflow_provider_cg._provider_info import CONFIG, CONFIG_SECTION

if TYPE_CHECKING:
    from sqlalchemy import Table

log = logging.getLogger(__name__)

WINDOW_S = 3600.0
BUCKET_S = 300.0
BUCKETS = int(WINDOW_S // BUCKET_S)
MAX_EVENTS = 50_000  # asset events of the last hour read at most (256 members landing each minute: 15,360)
SAMPLE_SECONDS = float(CONFIG[CONFIG_SECTION]["options"]["backlog_sample_seconds"]["default"])  # declared there
GROUP = ""  # the member column of a group's own sample

Key = tuple[str, str, str]  # (stream, group, member or GROUP)


def _table() -> Table:
    from sqlalchemy import BigInteger, Column, Float, Index, MetaData, String, Table

    return Table("cg_backlog_samples", MetaData(),
                 Column("conn_id", String(250), nullable=False), Column("stream", String(255), nullable=False),
                 Column("group_name", String(255), nullable=False), Column("member", String(255), nullable=False),
                 Column("at", Float, nullable=False), Column("backlog", BigInteger, nullable=False),
                 Index("idx_cg_backlog_samples_conn_at", "conn_id", "at"),
                 Index("idx_cg_backlog_samples_at", "at"))


class BacklogStore:
    """Backlog samples in a database table (Airflow's metadata DB by default), the last
    ``WINDOW_S`` seconds. ``engine``: a callable giving the SQLAlchemy engine, asked on first use."""

    def __init__(self, engine: Callable[[], Any] | None = None) -> None:
        self._engine_of = engine or _airflow_engine
        self._engine: Any = None
        self._lock = threading.Lock()
        self.table = _table()

    def _ready(self) -> Any:
        with self._lock:
            if self._engine is None:
                engine = self._engine_of()
                self.table.create(engine, checkfirst=True)
                self._engine = engine
            return self._engine

    def record(self, conn_id: str, groups: list[dict[str, Any]], now: float) -> None:
        """One sample of each group's and member's backlog; samples older than an hour go."""
        from sqlalchemy import delete, insert

        rows = []
        for g in groups:
            if g.get("error") or g.get("backlog") is None:
                continue
            rows.append({"member": GROUP, "backlog": int(g["backlog"] or 0), "stream": g["stream"],
                         "group_name": g["group"]})
            rows += [{"member": m["member"], "backlog": int(m.get("backlog") or 0), "stream": g["stream"],
                      "group_name": g["group"]} for m in g.get("members") or []]
        engine = self._ready()
        with engine.begin() as c:
            if rows:
                c.execute(insert(self.table), [{**r, "conn_id": conn_id, "at": now} for r in rows])
            c.execute(delete(self.table).where(self.table.c.at < now - WINDOW_S))

    def series(self, conn_id: str, now: float) -> dict[Key, list[tuple[float, int]]]:
        """Every series of ``conn_id`` over the last hour, oldest sample first."""
        from sqlalchemy import select

        t = self.table
        out: dict[Key, list[tuple[float, int]]] = {}
        with self._ready().connect() as c:
            for stream, group, member, at, n in c.execute(
                    select(t.c.stream, t.c.group_name, t.c.member, t.c.at, t.c.backlog)
                    .where(t.c.conn_id == conn_id, t.c.at >= now - WINDOW_S).order_by(t.c.at)):
                out.setdefault((stream, group, member), []).append((float(at), int(n)))
        return out


def _airflow_engine() -> Any:
    from airflow import settings

    return settings.engine


#: this process's store, in Airflow's metadata DB
SAMPLES = BacklogStore()


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


def with_history(groups: list[dict[str, Any]], landed: dict, backlog: dict[Key, list[tuple[float, int]]]) -> None:
    """Attach each group's and member's last hour: ``{"backlog": [[unix time, messages], ...],
    "landed_per_5min": [12 counts, oldest first]}`` (``backlog``: ``BacklogStore.series``)."""
    for g in groups:
        if g.get("error"):
            continue
        total = [0] * BUCKETS
        for m in g.get("members") or []:
            per = landed.get((g["stream"], g["group"], m["member"])) or [0] * BUCKETS
            total = [a + b for a, b in zip(total, per, strict=True)]
            m["history"] = {"backlog": [[round(t, 1), n] for t, n in backlog.get((g["stream"], g["group"], m["member"]), ())],
                            "landed_per_5min": per}
        g["history"] = {"backlog": [[round(t, 1), n] for t, n in backlog.get((g["stream"], g["group"], GROUP), ())],
                        "landed_per_5min": total}


def sample_seconds() -> float:
    """``[nats_consumer_groups] backlog_sample_seconds`` (0: no scheduled sampling)."""
    from airflow.configuration import conf

    return conf.getfloat(CONFIG_SECTION, "backlog_sample_seconds", fallback=SAMPLE_SECONDS)


async def sample_backlogs(read: Callable[[str], Any], connections: Callable[[], list[str]],
                          interval: float, store: BacklogStore = SAMPLES) -> None:
    """Sample every connection's backlog each ``interval`` seconds, until cancelled:
    ``connections()`` names them, ``read(conn_id)`` (a coroutine) gives ``(groups, error)``. A
    connection that cannot be read is skipped this round (the page says why when shown)."""
    while True:
        started = time.monotonic()
        try:
            for conn_id in await asyncio.to_thread(connections):
                groups, error = await read(conn_id)
                if not error:
                    await asyncio.to_thread(store.record, conn_id, groups, time.time())
        except asyncio.CancelledError:
            raise
        except Exception as e:  # never end the loop: the next round tries again
            log.warning("cg: sampling the consumer groups' backlog failed: %s", str(e).splitlines()[0] if str(e) else e)
        await asyncio.sleep(max(1.0, interval - (time.monotonic() - started)))
