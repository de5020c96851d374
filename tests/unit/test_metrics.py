"""The lag metrics' shapes (airflow_provider_cg/metrics.py): StatsD names that StatsD can hold,
Prometheus text with HELP, TYPE and escaped labels, pin changes counted once each, and a
landing task's counters from its summary. What a real listener receives: tests/ui."""

from __future__ import annotations

from airflow_provider_cg.metrics import METRICS, PinChanges, lag_metrics, landed_counters, prometheus_text

GROUP = {"stream": "ORD.ERS", "group": 'g"1', "kind": "elastic", "backlog": 7, "oldest_pending_age_s": 3.5,
         "unassigned_partitions": [], "partition_problems": {"2": "lost"}, "source_lag": None,
         "members": [{"member": "m/1", "backlog": 7, "num_ack_pending": 2, "oldest_pending_age_s": 3.5,
                      "pin_holder": "PIN-A", "landing_now": {"rate_msg_s": 40, "updated_at": "2026-12-02T10:00:00+00:00"},
                      "history": {"landed_per_5min": [1, 2, 3]}}]}


def test_a_reading_as_metrics_and_prometheus_text():
    pins = PinChanges()
    now = 1_796_205_610.0  # 2026-12-02T10:00:10Z
    metrics, changes = lag_metrics("nats", [GROUP, {"stream": "X", "group": "y", "error": "down"}], now, pins)
    by = {(m.name, m.labels[-1][1]): m.value for m in metrics}
    assert by[("cg_group_backlog_messages", 'g"1')] == 7 and by[("cg_group_partition_streams_not_current", 'g"1')] == 1
    assert by[("cg_member_pinned", "m/1")] == 1 and by[("cg_member_landed_messages_last_hour", "m/1")] == 6
    assert by[("cg_member_last_landed_age_seconds", "m/1")] == 10.0 and not changes
    assert all(m.labels[2][1] != "y" for m in metrics)  # a group that could not be read has no figures
    names = {m.statsd_name() for m in metrics}
    assert "cg.nats.ORD_ERS.g_1.m_1.backlog_messages" in names and "cg.nats.ORD_ERS.g_1.backlog_messages" in names
    text = prometheus_text(metrics)
    assert '# TYPE cg_member_pin_changes_total counter' in text
    assert 'cg_group_backlog_messages{conn_id="nats",stream="ORD.ERS",group="g\\"1"} 7' in text
    assert all(f"# HELP {m.name} " in text for m in metrics) and set(m.name for m in metrics) <= set(METRICS)


def test_each_pin_change_counts_once_and_a_scrape_only_reads():
    pins = PinChanges()
    seen = [pins.seen(("k",), pin) for pin in ("A", "A", None, "A", "B", "B", "C")]
    assert [c for c, _ in seen] == [0, 0, 0, 0, 1, 1, 2] and [x for _, x in seen].count(True) == 2
    assert pins.seen(("k",), "D", observe=False) == (2, False) and pins.seen(("k",), "C") == (2, False)


def test_a_landing_tasks_counters_from_its_summary():
    counters = landed_counters("nats", {"stream": "S", "group": "g", "member": "m1", "messages_landed": 90,
                                        "rows_written": 85, "batches": 3})
    assert {m.statsd_name(): m.value for m in counters} == {"cg.nats.S.g.m1.landed_messages": 90,
                                                           "cg.nats.S.g.m1.landed_rows": 85,
                                                           "cg.nats.S.g.m1.landed_batches": 3}
