"""Consumer lag as metrics, where operators already look: the API server's backlog sampler
(``ui/history.py``) turns each reading of a connection's groups into gauges and counters,
emitted through Airflow's own metrics (StatsD or OpenTelemetry, as ``[metrics]`` configures
them) and served as Prometheus text at ``/cg/metrics`` (the plugin's app, behind Airflow's
auth). Kafka users watch consumer lag the same way (Burrow, kafka-lag-exporter).

Every metric carries ``conn_id``, ``stream`` and ``group`` (member metrics ``member`` too):
Prometheus and OpenTelemetry as labels or attributes, StatsD in the name
(``cg.<conn_id>.<stream>.<group>[.<member>].<metric>``, tags too where the StatsD flavour
takes them). Each landing task adds what it landed to counters through the worker's Airflow
metrics (``landed_counters``). ``METRICS`` lists each with its unit; the table in
docs/how-to/lag.md is generated from it."""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from airflow_provider_cg.core.groups.lag import epoch_seconds

__all__ = ["METRICS", "MetricSpec"]

log = logging.getLogger(__name__)

PREFIX = "cg"


@dataclass(frozen=True)
class MetricSpec:
    """One consumer-lag metric of ``METRICS``: its Prometheus type, unit and help text."""

    kind: str  # "gauge" or "counter", as Prometheus types them
    unit: str
    help: str


#: name (Prometheus; StatsD's last part is what follows ``cg_group_``, ``cg_member_`` or ``cg_``) -> what it is
METRICS: dict[str, MetricSpec] = {
    "cg_group_backlog_messages": MetricSpec("gauge", "messages", "messages waiting to be landed in the group"),
    "cg_group_oldest_pending_age_seconds": MetricSpec(
        "gauge", "seconds", "age of the group's oldest message not landed yet: how far behind its tables are "
                            "(0 when nothing waits)"),
    "cg_group_members": MetricSpec("gauge", "members", "members of the group"),
    "cg_group_unassigned_partitions": MetricSpec("gauge", "partitions", "partitions no member is assigned"),
    "cg_group_partition_streams_not_current": MetricSpec(
        "gauge", "partitions", "partition streams that are not current (lost, unserved, behind their log): "
                               "their backlog is not known until rebuilt"),
    "cg_group_source_lag_messages": MetricSpec(
        "gauge", "messages", "messages of the origin stream (on the group's filters) not yet sourced into the "
                             "group's work queue or partition log: counted from the origin, not the server's report"),
    "cg_group_source_stalled": MetricSpec(
        "gauge", "boolean", "1 while the group's source has messages to take and has been silent (nats-server "
                            "would wait up to 2 minutes; the group's member jobs start it again)"),
    "cg_group_origin_went_back": MetricSpec(
        "gauge", "boolean", "1 while the group's jobs refuse because its origin stream went back (its store came "
                            "back older): landed messages it no longer holds; cg status says the way forward"),
    "cg_member_backlog_messages": MetricSpec(
        "gauge", "messages", "messages waiting in the member's partitions (a follower's task also sends it as "
                             "the run reports it, every progress interval)"),
    "cg_member_ack_pending_messages": MetricSpec(
        "gauge", "messages", "messages delivered to the member's pinned run and not acknowledged yet"),
    "cg_member_oldest_pending_age_seconds": MetricSpec(
        "gauge", "seconds", "age of the member's oldest message not landed yet (0 when nothing waits)"),
    "cg_member_pinned": MetricSpec("gauge", "boolean", "1 while an instance holds the member's pin"),
    "cg_member_pin_changes_total": MetricSpec(
        "counter", "changes", "times another instance took the member's pin, as sampled since the API server "
                              "started"),
    "cg_member_landing_rate_messages_per_second": MetricSpec(
        "gauge", "messages/s", "the pinned run's rate as it last reported (0 when no run reports)"),
    "cg_member_landed_messages_last_hour": MetricSpec(
        "gauge", "messages", "messages landed by the member's tasks in the last hour (their asset events)"),
    "cg_member_last_landed_age_seconds": MetricSpec(
        "gauge", "seconds", "time since the member last landed a batch: its running follower's last report, "
                            "else its last task's asset event"),
}

METRICS["cg_connection_up"] = MetricSpec("gauge", "boolean", "1 when the connection's server answered the last "
                                                             "reading of its groups")

for _name, _help in (("cg_member_landed_messages_total", "messages whose effect a landing task committed"),
                     ("cg_member_landed_rows_total", "rows a landing task wrote"),
                     ("cg_member_landed_batches_total", "batches a landing task committed")):
    METRICS[_name] = MetricSpec("counter", _name.split("_")[3], f"{_help} (through Airflow's metrics only, sent by each task at its end; not in /cg/metrics)")

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class Metric:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    @property
    def spec(self) -> MetricSpec:
        return METRICS[self.name]

    def statsd_name(self) -> str:
        """``cg.<conn_id>.<stream>.<group>[.<member>].<metric>``: each part with what StatsD
        names cannot hold (dots included) as ``_``."""
        parts = [_UNSAFE.sub("_", v) for _, v in self.labels]
        short = self.name.removeprefix("cg_").removeprefix("group_").removeprefix("member_").removesuffix("_total")
        return ".".join([PREFIX, *parts, short])


class PinChanges:
    """Pin holders as the sampler saw them: a member whose pin id differs from the last one
    seen counts a change (the first sighting does not)."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, ...], str] = {}
        self._counts: dict[tuple[str, ...], int] = {}
        self._lock = threading.Lock()

    def seen(self, key: tuple[str, ...], pin: str | None, observe: bool = True) -> tuple[int, bool]:
        """``(changes so far, whether this sighting is one)``; ``observe=False`` only reads."""
        with self._lock:
            if not observe:
                return self._counts.get(key, 0), False
            changed = pin is not None and key in self._last and self._last[key] != pin
            if pin is not None:
                self._last[key] = pin
            self._counts[key] = self._counts.get(key, 0) + int(changed)
            return self._counts[key], changed


PIN_CHANGES = PinChanges()


def lag_metrics(conn_id: str, groups: list[dict[str, Any]], now: float | None = None,
                pins: PinChanges = PIN_CHANGES, observe: bool = True) -> tuple[list[Metric], list[Metric]]:
    """``(metrics, pin changes seen now)`` of one reading of ``conn_id``'s groups (the page's
    dicts: ``GroupLag.to_dict()`` with ``landing_now``, ``last_landed`` and ``history``);
    ``observe``: this reading counts pin changes (the sampler's do; a scrape between them only
    reads the counts)."""
    now = time.time() if now is None else now
    out: list[Metric] = []
    changes: list[Metric] = []
    for g in groups:
        if g.get("error"):
            continue
        labels = (("conn_id", conn_id), ("stream", str(g["stream"])), ("group", str(g["group"])))

        def add(name: str, value: float | None, at: tuple[tuple[str, str], ...] = labels) -> None:
            if value is not None:
                out.append(Metric(name, at, float(value)))

        members = g.get("members") or []
        add("cg_group_backlog_messages", g.get("backlog"))
        add("cg_group_oldest_pending_age_seconds", g.get("oldest_pending_age_s") or 0.0)
        add("cg_group_members", len(members))
        add("cg_group_unassigned_partitions", len(g.get("unassigned_partitions") or ()))
        add("cg_group_partition_streams_not_current", len(g.get("partition_problems") or {}))
        add("cg_group_source_lag_messages", g.get("source_lag"))
        add("cg_group_source_stalled", int(bool(g.get("source_stalled"))))
        add("cg_group_origin_went_back", int("origin_went_back" in (g.get("problems") or {})))
        for m in members:
            at = (*labels, ("member", str(m["member"])))
            add("cg_member_backlog_messages", m.get("backlog"), at)
            add("cg_member_ack_pending_messages", m.get("num_ack_pending"), at)
            add("cg_member_oldest_pending_age_seconds", m.get("oldest_pending_age_s") or 0.0, at)
            add("cg_member_pinned", int(bool(m.get("pin_holder"))), at)
            count, changed = pins.seen(tuple(v for _, v in at), m.get("pin_holder"), observe)
            add("cg_member_pin_changes_total", count, at)
            if changed:
                changes.append(Metric("cg_member_pin_changes_total", at, 1.0))
            landing = m.get("landing_now") or {}
            add("cg_member_landing_rate_messages_per_second", landing.get("rate_msg_s") or 0, at)
            history = m.get("history") or {}
            if "landed_per_5min" in history:
                add("cg_member_landed_messages_last_hour", sum(history["landed_per_5min"]), at)
            last = epoch_seconds(landing.get("updated_at")) or epoch_seconds((m.get("last_landed") or {}).get("at"))
            add("cg_member_last_landed_age_seconds", None if last is None else max(0.0, now - last), at)
    return out, changes


def prometheus_text(metrics: list[Metric]) -> str:
    """The Prometheus text exposition format (0.0.4): each metric's HELP and TYPE once, then
    its samples."""
    def label(v: str) -> str:
        return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    lines: list[str] = []
    for name, spec in METRICS.items():
        samples = [m for m in metrics if m.name == name]
        if not samples:
            continue
        lines += [f"# HELP {name} {spec.help} ({spec.unit})", f"# TYPE {name} {spec.kind}"]
        for m in samples:
            labels = ",".join(f'{k}="{label(v)}"' for k, v in m.labels)
            value = int(m.value) if m.value.is_integer() else m.value
            lines.append(f"{name}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


def connection_metric(conn_id: str, up: bool) -> Metric:
    return Metric("cg_connection_up", (("conn_id", conn_id),), float(up))


def airflow_stats() -> Any:
    """Airflow's ``Stats`` for this process, set up from ``[metrics]`` the way Airflow's own
    services set up theirs (StatsD, Datadog's flavour or OpenTelemetry; nothing when none is
    on). The API server sets up its own copy, not the one ``airflow.sdk`` exports, so the
    plugin sets up this one. None (and a warning) when that fails: the page goes on."""
    try:
        from airflow.configuration import conf
        from airflow.observability.metrics import stats_utils
        from airflow.sdk.observability import stats

        stats.initialize(factory=stats_utils.get_stats_factory(),
                         export_legacy_names=conf.getboolean("metrics", "legacy_names_on", fallback=True))
        return stats.Stats
    except Exception as e:  # noqa: BLE001 - metrics never stop the page or its sampler
        log.warning("consumer-groups metrics: Airflow's metrics not set up (%s); /cg/metrics still answers", e)
        return None


def emit(stats: Any, metrics: list[Metric], changes: list[Metric]) -> None:
    """Through Airflow's ``stats`` (``airflow_stats()``): gauges as gauges, a pin change as an
    increment of its counter."""
    if stats is None:
        return
    try:
        for m in metrics:
            if m.spec.kind == "gauge":
                stats.gauge(m.statsd_name(), m.value, tags=dict(m.labels))
        for m in changes:
            stats.incr(m.statsd_name(), 1, tags=dict(m.labels))
    except Exception as e:  # noqa: BLE001 - a metric never costs the sampler its backlog history
        log.warning("consumer-groups metrics not sent (%s)", e)


def landed_counters(conn_id: str, summary: dict[str, Any]) -> list[Metric]:
    """What one landing task landed (its summary), as increments of its member's counters."""
    member = summary.get("member") or "backfill"
    labels = (("conn_id", conn_id), ("stream", str(summary.get("stream"))), ("group", str(summary.get("group"))),
              ("member", str(member)))
    return [Metric(name, labels, float(summary.get(key) or 0)) for name, key in (
        ("cg_member_landed_messages_total", "messages_landed"), ("cg_member_landed_rows_total", "rows_written"),
        ("cg_member_landed_batches_total", "batches"))]


def count_landed(conn_id: str, summary: dict[str, Any]) -> None:
    """``landed_counters`` through the task's Airflow metrics (set up by Airflow's task runner
    from ``[metrics]``); never fails the task."""
    try:
        from airflow.sdk.observability.stats import Stats

        for m in landed_counters(conn_id, summary):
            if m.value:
                Stats.incr(m.statsd_name(), int(m.value), tags=dict(m.labels))
    except Exception as e:  # noqa: BLE001 - a metric is never worth a failed landing
        log.warning("landed counters not sent (%s)", e)


def follower_gauges(conn_id: str, stream: str, group: str, member: str, entry: dict[str, Any] | None
                    ) -> list[Metric]:
    """The member's gauges as its pinned run reported them on the progress board (``entry``:
    ``board.pinned_run``), under the same names and labels as the sampler's; none when no run
    reports (the sampler's reading stands)."""
    if not entry:
        return []
    at = (("conn_id", conn_id), ("stream", stream), ("group", group), ("member", member))
    out = [Metric("cg_member_pinned", at, 1.0),
           Metric("cg_member_landing_rate_messages_per_second", at, float(entry.get("rate_msg_s") or 0))]
    if entry.get("backlog") is not None:
        out.append(Metric("cg_member_backlog_messages", at, float(entry["backlog"])))
    return out


class FollowerReports:
    """While a follower's job runs, its Airflow task sends the member's lag as the run reports
    it (``board.py``: every progress interval) through the task's Airflow metrics, so a burst
    that drains between two of the API server's samples (60 s by default) shows. A thread with
    one NATS connection (``hook``: ``NatsHook``); never fails the task."""

    def __init__(self, hook: Any, conn_id: str, stream: str, group: str, member: str, interval: float) -> None:
        self.hook, self.conn_id, self.interval = hook, conn_id, max(float(interval), 1.0)
        self.stream, self.group, self.member = stream, group, member
        self.sent = 0  # reports sent (the task's log says how many at its end)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="cg-follower-reports")

    def __enter__(self) -> FollowerReports:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=self.interval + 5)

    def _run(self) -> None:
        try:
            from airflow.sdk.observability.stats import Stats

            self.hook.run(lambda nc: self._report(nc, Stats))
        except Exception as e:  # noqa: BLE001 - a metric is never worth a failed landing
            log.warning("the follower's lag not sent as metrics (%s)", str(e)[:160])

    async def _report(self, nc: Any, stats: Any) -> None:
        import asyncio

        from airflow_provider_cg.core.jetstream.api import DEFAULT_PREFIX
        from airflow_provider_cg.core.landing.run.board import pinned_run

        while not self._done.is_set():
            entry = await pinned_run(nc, DEFAULT_PREFIX, self.stream, self.group, self.member)
            gauges = follower_gauges(self.conn_id, self.stream, self.group, self.member, entry)
            emit(stats, gauges, [])
            self.sent += bool(gauges)
            await asyncio.to_thread(self._done.wait, self.interval)

