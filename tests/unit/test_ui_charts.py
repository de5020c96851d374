"""The consumer-groups page's last-hour charts and backlog samples (``ui/history.py``,
``ui/charts.py``): bars where messages landed, the backlog line through the samples, the time
axis and both scales' values written; samples kept in a real SQLite database (what Airflow's
metadata DB is here), an hour per series, read back by a new store as after a restart; and the
landed ranges as the page writes them."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from airflow_provider_cg.ui.charts import last_hour_svg
from airflow_provider_cg.ui.history import BUCKETS, GROUP, BacklogStore, bucket_of, with_history

NS = "{http://www.w3.org/2000/svg}"


def test_buckets_cover_the_last_hour_oldest_first():
    now = 10_000.0
    assert bucket_of(now, now) == BUCKETS - 1 and bucket_of(now - 299, now) == BUCKETS - 1
    assert bucket_of(now - 300, now) == BUCKETS - 2 and bucket_of(now - 3599, now) == 0
    assert bucket_of(now - 3600, now) is None and bucket_of(now + 1, now) is None


def _store(tmp_path):
    from sqlalchemy import create_engine

    engine = create_engine(f"sqlite:///{tmp_path / 'airflow.db'}")
    return BacklogStore(lambda: engine)


def _groups(backlog_a: int, backlog_b: int) -> list[dict]:
    return [{"stream": "S", "group": "g", "backlog": backlog_a + backlog_b,
             "members": [{"member": "a", "backlog": backlog_a}, {"member": "b", "backlog": backlog_b}]},
            {"stream": "S", "group": "broken", "error": "no stream"}]


def test_samples_keep_one_hour_per_series_and_outlive_their_store(tmp_path):
    store = _store(tmp_path)
    for t in range(0, 7200, 600):
        store.record("c", _groups(t, 1), float(t))
    store.record("other", _groups(5, 5), 7000.0)
    series = _store(tmp_path).series("c", 7200.0)  # another process's store (a restarted API server)
    assert [n for _, n in series[("S", "g", "a")]] == [3600, 4200, 4800, 5400, 6000, 6600]
    assert [n for _, n in series[("S", "g", GROUP)]] == [3601, 4201, 4801, 5401, 6001, 6601]
    assert ("S", "broken", GROUP) not in series and ("S", "g", "c") not in series
    assert [n for _, n in _store(tmp_path).series("other", 7200.0)[("S", "g", "b")]] == [5]


def test_the_chart_draws_landed_bars_the_backlog_line_and_its_axes():
    now = 50_000.0  # 13:53:20 UTC
    landed = [0] * BUCKETS
    landed[3], landed[-1] = 500, 1000
    history = {"landed_per_5min": landed, "backlog": [[now - 1800, 40], [now, 10]]}
    svg = ET.fromstring(last_hour_svg(history, now))
    bars = svg.findall(f"{NS}rect[@class='landed']")
    assert len(bars) == 2 and float(bars[1].get("height")) > float(bars[0].get("height"))
    (line,) = svg.findall(f"{NS}polyline")
    (x1, y1), (x2, y2) = (tuple(map(float, p.split(","))) for p in line.get("points").split())
    assert x1 == 120.0 and x2 == 236.0 and y1 < y2  # half an hour ago (mid-plot), and now; 40 drawn above 10
    texts = {e.get("class"): [x.text for x in svg.findall(f"{NS}text[@class='{e.get('class')}']")]
             for e in svg.findall(f"{NS}text")}
    assert texts["x-tick"] == ["12:53", "13:23", "13:53"]  # an hour ago, half an hour ago, now (UTC)
    assert texts["y-landed"] == ["1,000/5 min"] and texts["y-backlog"] == ["backlog 10"]
    title = svg.find(f"{NS}title").text
    assert "landed 1,500 messages" in title and "backlog now 10, at most 40 in 2 samples" in title
    group = ET.fromstring(last_hour_svg(history, now, large=True))
    assert [x.text for x in group.findall(f"{NS}text[@class='x-tick']")] == [
        "12:53", "13:08", "13:23", "13:38", "13:53"]
    assert [x.text for x in group.findall(f"{NS}text[@class='y-landed']")] == ["1,000", "0"]
    assert [x.text for x in group.findall(f"{NS}text[@class='y-backlog']")] == ["40", "0"]
    empty = ET.fromstring(last_hour_svg({}, now))
    assert not empty.findall(f"{NS}rect[@class='landed']") and "no backlog samples yet" in empty.find(f"{NS}title").text


def test_with_history_sums_members_into_the_group():
    groups = _groups(3, 4)
    landed = {("S", "g", "a"): [1] * BUCKETS, ("S", "g", "b"): [2] * BUCKETS}
    backlog = {("S", "g", GROUP): [(1000.0, 7)], ("S", "g", "b"): [(1000.0, 4)]}
    with_history(groups, landed, backlog)
    g = groups[0]
    assert g["history"]["landed_per_5min"] == [3] * BUCKETS and g["history"]["backlog"] == [[1000.0, 7]]
    assert g["members"][1]["history"] == {"backlog": [[1000.0, 4]], "landed_per_5min": [2] * BUCKETS}
    assert "history" not in groups[1]


def test_landed_ranges_read_as_people_write_them():
    from airflow_provider_cg.ui.app import readable_ranges

    assert readable_ranges({"10": "7-9", "0": "5008-7000"}) == (
        "partition 0: sequences 5,008\u20137,000; partition 10: sequences 7\u20139")
    assert readable_ranges({}) == ""


def test_times_read_locally_with_the_raw_value_on_hover_and_an_empty_chart_says_so():
    from airflow_provider_cg.ui.app import holder_html, time_html
    from airflow_provider_cg.ui.charts import last_hour_svg

    for raw in ("2026-12-02T13:00:05.123456789Z", "1796216405123456789", "2026-12-02T13:00:05+00:00"):
        out = time_html(raw)
        assert out.startswith('<time datetime="2026-12-02T13:00:05Z"') and f'title="{raw}"' in out, out
        assert ">2026-12-02 13:00:05 UTC</time>" in out
    assert time_html(None) == "-"
    pin = "Xx9aBcDeFgHiJkLmNoP"
    mine = {"pin_holder": pin, "landing_now": {"pin_id": pin, "holder": {"host": "w1", "pid": 42,
                                                                          "task": "cg_follow_orders.follow"}}}
    shown = holder_html(mine)
    assert ">cg_<wbr>follow_<wbr>orders.<wbr>follow on w1 (pid 42)<" in shown and f"pin id {pin}" in shown
    assert "cg_follow_orders.follow on w1" in shown.replace("<wbr>", "")  # breaks between words only
    other = holder_html({"pin_holder": pin, "landing_now": None})
    assert "a client that does not report" in other and f'title="pin id {pin}"' in other
    empty = last_hour_svg({}, 1_800_000_000.0, large=True, css_class="group")
    assert "nothing landed in the last hour" in empty and 'class="y-landed"' not in empty
    assert "messages landed / 5 min" in empty and "backlog, messages" in empty


def test_a_members_last_landing_fits_a_line_or_two_with_its_detail_on_hover():
    from airflow_provider_cg.ui.app import landed_html, short_table

    assert short_table("s3://lake/sales/paid_orders/") == "\u2026/paid_orders" and short_table("orders") == "orders"
    last = {"at": "2026-12-02T13:00:05Z", "messages_landed": 1, "rows_written": 2, "ranges": {"0": "3-3"},
            "table": "s3://lake/sales/paid_orders"}
    cell = landed_html(last, None, None)
    assert "1 message, 2 rows into \u2026/<wbr>paid_<wbr>orders" in cell and "sequences" not in cell.split(">", 1)[1]
    assert 'title="partition 0: sequences 3\u20133 into s3://lake/sales/paid_orders"' in cell
    following = landed_html(last, {"state": "landing", "messages_read": 5, "rows_written": 5, "batches": 1,
                                   "rate_msg_s": 2, "age_s": 1.0, "owner": "m1/x"},
                            {"state": "warming up", "holder": {"task": "d.t", "host": "h"}})
    assert following.startswith('<div class="successor">next: d.<wbr>t, <b>warming up</b></div>')
    assert "5 messages, 5 rows in 1 batch since" in following and "1 message, 2 rows" not in following
    assert landed_html(None, None, None) == "-"

