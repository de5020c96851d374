"""The consumer-groups page's last-hour charts and backlog samples (``ui/history.py``,
``ui/charts.py``), without Airflow: bars where messages landed, the backlog line through the
samples, samples older than an hour dropped; and the landed ranges as the page writes them."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from airflow_provider_cg.ui.charts import last_hour_svg
from airflow_provider_cg.ui.history import BUCKETS, BacklogSamples, bucket_of, with_history

NS = "{http://www.w3.org/2000/svg}"


def test_buckets_cover_the_last_hour_oldest_first():
    now = 10_000.0
    assert bucket_of(now, now) == BUCKETS - 1 and bucket_of(now - 299, now) == BUCKETS - 1
    assert bucket_of(now - 300, now) == BUCKETS - 2 and bucket_of(now - 3599, now) == 0
    assert bucket_of(now - 3600, now) is None and bucket_of(now + 1, now) is None


def test_samples_keep_one_hour_per_key():
    s = BacklogSamples()
    for t in range(0, 7200, 600):
        s.record(("c", "S", "g", "m1"), t, float(t))
    assert [n for _, n in s.series(("c", "S", "g", "m1"), 7200.0)] == [3600, 4200, 4800, 5400, 6000, 6600]
    assert s.series(("c", "S", "g", "m2"), 7200.0) == []


def test_the_chart_draws_landed_bars_and_the_backlog_line():
    now = 50_000.0
    landed = [0] * BUCKETS
    landed[3], landed[-1] = 500, 1000
    svg = ET.fromstring(last_hour_svg({"landed_per_5min": landed, "backlog": [[now - 1800, 40], [now, 10]]}, now))
    bars = svg.findall(f"{NS}rect")
    assert len(bars) == 2 and float(bars[1].get("height")) > float(bars[0].get("height"))
    (line,) = svg.findall(f"{NS}polyline")
    (x1, y1), (x2, y2) = (tuple(map(float, p.split(","))) for p in line.get("points").split())
    assert x1 == 90.0 and x2 == 180.0 and y1 < y2  # half an hour ago, and now; 40 drawn above 10
    title = svg.find(f"{NS}title").text
    assert "landed 1500 messages" in title and "backlog now 10, at most 40 in 2 samples" in title
    empty = ET.fromstring(last_hour_svg({}, now))
    assert not empty.findall(f"{NS}rect") and "no backlog samples yet" in empty.find(f"{NS}title").text


def test_with_history_sums_members_into_the_group():
    groups = [{"stream": "S", "group": "g", "backlog": 7,
               "members": [{"member": "a", "backlog": 3}, {"member": "b", "backlog": 4}]}]
    landed = {("S", "g", "a"): [1] * BUCKETS, ("S", "g", "b"): [2] * BUCKETS}
    with_history("conn-x", groups, landed, now=1_000.0)
    g = groups[0]
    assert g["history"]["landed_per_5min"] == [3] * BUCKETS and g["history"]["backlog"] == [[1000.0, 7]]
    assert g["members"][1]["history"] == {"backlog": [[1000.0, 4]], "landed_per_5min": [2] * BUCKETS}


def test_landed_ranges_read_as_people_write_them():
    from airflow_provider_cg.ui.app import readable_ranges

    assert readable_ranges({"10": "7-9", "0": "5008-7000"}) == (
        "partition 0: messages 5,008\u20137,000; partition 10: messages 7\u20139")
    assert readable_ranges({}) == ""
