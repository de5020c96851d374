"""The provider in Airflow's own UI, in a real browser: the ``nats`` connection form and the
consumer-groups page, served by a real ``airflow api-server`` (simple auth manager, signed
in through its login form) against a real nats-server, driven by Debian's Chromium through
Playwright. Screenshots go to the test's temp folder, and to ``$CG_DOCS_SCREENSHOTS`` when set
(the docs' images: ``docs/images/``)."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings
from airflow_provider_cg.core.tools.server import EmbeddedNatsServer

pytest_plugins = ["tests.airflow_conftest"]
pytestmark = [pytest.mark.airflow, pytest.mark.integration, pytest.mark.ui]

STREAM, GROUP, N = "ORDERS", "lake", 600
SAMPLE_SECONDS = 2  # the API server's backlog sampler, here


def screenshot(page, tmp_path: Path, name: str, **options) -> Path:
    shot = tmp_path / name
    page.screenshot(path=str(shot), **options)
    if os.environ.get("CG_DOCS_SCREENSHOTS"):
        shutil.copy(shot, Path(os.environ["CG_DOCS_SCREENSHOTS"]) / name)
    return shot
DOWN_PASSWORD = "pw-UI-MARKER-51d0c2"  # of a connection to a server that is not there


@pytest.fixture(scope="module")
def chromium():
    from tests.support.airflow_ui import ensure_chromium
    from tests.support.prebuild import built

    path = built(ensure_chromium)
    if path is None:
        pytest.fail("Debian's chromium is not installed and cannot be (apt-get as root): the UI tests need it")
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A nats-server with an elastic group of 3 members over 6 partitions, N messages queued,
    and member m1's consumer pinned by a client holding one unacknowledged message."""
    from tests.integration.test_groups import Puller
    from tests.integration.test_operators_groups import NatsThread

    server = EmbeddedNatsServer(tmp_path_factory.mktemp("nats")).start()
    t = NatsThread(NatsConnectionSettings(servers=[server.url]))
    try:
        t.run(t.api.add_stream({"name": STREAM, "subjects": ["orders.>"], "storage": "file"}))
        cfg = ElasticGroupConfig(6, (PartitioningFilter("orders.*", (1,)),), members=("m1", "m2", "m3"))
        t.run(t.cg.create(STREAM, GROUP, cfg.validate()))
        t.publish([f"orders.c{i % 17}" for i in range(N)])
        deadline = time.monotonic() + 30
        while t.run(t.cg.status(STREAM, GROUP)).backlog < N and time.monotonic() < deadline:
            time.sleep(0.2)
        # a job's ack wait of 5 minutes: the pin (and the consumer) outlive the test without pulls
        cstream, consumer = t.run(t.cg.ensure_member_consumer(STREAM, GROUP, "m1", ack_wait=300))
        puller = Puller(t.nc, cstream, consumer)
        held = t.run(puller.pull(1))
        assert held and puller.pin, "m1's consumer was not pinned"
        status = t.run(t.cg.status(STREAM, GROUP))
        yield server, status, puller.pin
    finally:
        t.run(t.nc.close())
        t.loop.call_soon_threadsafe(t.loop.stop)
        server.cleanup()


@pytest.fixture(scope="module")
def statsd():
    from tests.support.statsd import StatsdListener

    listener = StatsdListener()
    yield listener
    listener.close()


@pytest.fixture(scope="module")
def ui(airflow_session_env, world, statsd):
    """The API server, with Airflow's StatsD metrics sent to ``statsd``; it also knows
    connection ``nats_env`` from its environment only."""
    from tests.support.airflow_ui import AirflowUI

    env_conn = json.dumps({"conn_type": "nats", "host": "127.0.0.1", "port": world[0].port})
    server = AirflowUI.start(airflow_session_env.home, extra_env={
        "AIRFLOW_CONN_NATS_ENV": env_conn,
        "AIRFLOW__NATS_CONSUMER_GROUPS__BACKLOG_SAMPLE_SECONDS": str(SAMPLE_SECONDS),
        "AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(statsd.port), "AIRFLOW__METRICS__STATSD_PREFIX": "airflow"})
    yield server
    server.stop()


@pytest.fixture
def page(chromium, ui, tmp_path):
    from playwright.sync_api import sync_playwright

    from tests.support.airflow_ui import browser

    with sync_playwright() as p:
        b = browser(p)
        context = b.new_context(viewport={"width": 1400, "height": 1000})
        yield context.new_page()
        context.close()
        b.close()


def sign_in(page, ui, user: str, then: str) -> None:
    from tests.support.airflow_ui import USERS

    page.goto(ui.url + then)
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(USERS[user][1])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"**{then}", timeout=60_000)


def test_the_nats_connection_form(page, ui, world, tmp_path):
    """Extra fields are plain text inputs (no autocomplete) with their example shown under them,
    secrets are password inputs, PEM fields text areas; a connection saved from the form works."""
    server, _, _ = world
    sign_in(page, ui, "admin", "/connections")
    page.get_by_role("button", name="Add Connection").click()
    page.get_by_label("Connection ID").fill("nats_form")
    page.get_by_label("Connection Type").fill("NATS")
    page.get_by_text("NATS JetStream", exact=True).click()
    page.get_by_label("Host(s)").fill("127.0.0.1")
    page.get_by_label("Port").fill(str(server.port))
    page.get_by_text("Extra Fields", exact=True).click()
    servers, name = page.locator("#element_servers"), page.locator("#element_name")
    servers.wait_for()
    for field in (servers, name):
        assert field.evaluate("e => e.tagName") == "INPUT" and field.get_attribute("list") is None
        assert (field.get_attribute("placeholder") or "") == "" and field.get_attribute("type") in (None, "text")
    helper = {f: page.locator(f"#{page.locator(f'#element_{f}').get_attribute('aria-describedby')}".replace(":", "\\:"))
              .inner_text() for f in ("servers", "name")}
    assert "Example: nats://nats-1:4222,tls://nats-2:4222" in helper["servers"] and "Example: airflow" in helper["name"]
    assert "Start typing" not in page.content()
    for secret in ("token", "nkey_seed", "creds", "tls_key"):
        assert page.locator(f"#element_{secret}").get_attribute("type") == "password", secret
    assert page.locator("#element_tls_ca").evaluate("e => e.tagName") == "TEXTAREA"
    name.fill("airflow-ui-test")
    shot = screenshot(page, tmp_path, "nats-connection-form.png", full_page=True)
    assert shot.stat().st_size > 20_000
    page.get_by_role("button", name="Save").click()
    page.get_by_text("nats_form").first.wait_for(timeout=30_000)

    status, body = ui.api("GET", "/api/v2/connections/nats_form")
    assert status == 200 and body["conn_type"] == "nats", body
    assert (body["host"], body["port"]) == ("127.0.0.1", server.port)
    assert json.loads(body["extra"])["name"] == "airflow-ui-test"
    status, body = ui.api("POST", "/api/v2/connections/test", {"connection_id": "nats_form", "conn_type": "nats",
                                                              "host": "127.0.0.1", "port": server.port})
    assert status in (200, 403), body  # 403: connection testing is off by default in Airflow 3


def _announce_landing(ui, airflow_session_env, tmp_path, server_url: str) -> dict:
    """An asset event for m1's landing through ``server_url``, as a landing task sends it
    (through the REST API), and one for m2's through another server (a group of the same name
    there), which the page must not show."""
    from airflow.sdk import DAG
    from airflow.sdk.bases.operator import BaseOperator

    from airflow_provider_cg.assets import landed_extra, table_asset
    from airflow_provider_cg.core.landing.contract import MemberJobSpec, Summary

    table = str(tmp_path / "paid_orders")
    asset = table_asset(sink="delta", sink_path=table)
    with DAG("cg_ui_landing", schedule=None) as dag:
        BaseOperator(task_id="land", outlets=[asset])
    airflow_session_env.sync_dag(dag)
    status, body = ui.api("GET", f"/api/v2/assets?uri_pattern={quote(asset.uri)}")
    assert status == 200 and body["assets"], body
    s = Summary(STREAM, GROUP, "m1", result="committed", messages_read=120, rows_written=117)
    s.count_partition(0, 3, 590, 70)
    s.count_partition(1, 1, 598, 50)
    s.batch_ids.append(f"cg:{STREAM}:{GROUP}:m1:7:0a0b0c0d")
    spec = MemberJobSpec.build({"stream": STREAM, "group": GROUP, "member": "m1", "sink": "delta",
                                "sink_path": table})
    extra = landed_extra(spec, s.to_dict(), [server_url])
    asset_id = body["assets"][0]["id"]
    status, body = ui.api("POST", "/api/v2/assets/events", {"asset_id": asset_id, "extra": extra})
    assert status == 200, body
    elsewhere = landed_extra(spec, {**s.to_dict(), "member": "m2"}, ["nats://127.0.0.1:1"])
    status, body = ui.api("POST", "/api/v2/assets/events", {"asset_id": asset_id, "extra": elsewhere})
    assert status == 200, body
    return extra


def test_the_consumer_groups_page(page, ui, world, airflow_session_env, tmp_path):
    server, status, pin = world
    for conn_id, port, password in (("nats_groups", server.port, None), ("nats_down", 1, DOWN_PASSWORD)):
        body = {"connection_id": conn_id, "conn_type": "nats", "host": "127.0.0.1", "port": port,
                "extra": json.dumps({"connect_timeout": 1})}
        if password:
            body.update(login="u", password=password)
        code, answer = ui.api("POST", "/api/v2/connections", body)
        assert code in (201, 409), answer
    extra = _announce_landing(ui, airflow_session_env, tmp_path, server.url)

    # The backlog is sampled on a schedule by the API server, whether or not anyone looks: rows
    # of its table in Airflow's metadata DB (where a restarted API server finds them).
    samples = _wait_for_samples("nats_groups", 3)
    assert {n for m, n in samples if m == "m2"} == {members_backlog(status, "m2")}

    # Through Airflow's navigation: Browse -> Consumer groups (the page in the UI's frame).
    sign_in(page, ui, "admin", "/plugin/nats-consumer-groups")
    frame = page.frame_locator("iframe").first
    frame.locator("h1").wait_for(timeout=30_000)
    assert frame.locator("h1").inner_text() == "NATS consumer groups"

    page.goto(f"{ui.url}/cg/?conn_id=nats_groups")
    table = page.locator(f"#group-{STREAM}-{GROUP} table")
    rows = {r.get_attribute("data-member"): r.locator("td").all_inner_texts() for r in table.locator("tr[data-member]").all()}
    assert set(rows) == {"m1", "m2", "m3"}, rows
    members = {m.member: m for m in status.members}
    for member, cells in rows.items():
        m = members[member]
        assert cells[1] == str(m.partitions) and cells[4] == str(m.backlog), (member, cells)
        assert cells[6].endswith((" s", " min")), cells  # the oldest pending message's age
    # pinned by a client that does not report on the progress board (here the test's own), one
    # message in flight; the pin id and the raw time on hover, the time as a local time
    assert rows["m1"][2].startswith("a client that does not report") and rows["m1"][5] == "1", rows
    holder = table.locator("tr[data-member=m1] td.holder span.pin")
    assert holder.get_attribute("title") == f"pin id {pin}"
    since = table.locator("tr[data-member=m1] time").first
    assert since.get_attribute("title") == members["m1"].pinned_since and since.get_attribute("datetime").endswith("Z")
    shown = rows["m1"][3]  # today's: the clock only, in the zone the page's top line names
    pinned_at = dt.datetime.fromisoformat(since.get_attribute("datetime").replace("Z", "+00:00"))
    assert shown == pinned_at.strftime("%H:%M:%S"), shown  # (this browser's zone: UTC)
    assert page.locator("#zone").inner_text() == "UTC"
    assert rows["m2"][2] == "-" and rows["m3"][8] == "-"
    assert rows["m2"][8] == "-"  # m2 landed only through another server: another group
    assert "120" not in rows["m2"][8] and f"{extra['messages_landed']} messages" in rows["m1"][8]
    last = table.locator("tr[data-member=m1] td.landed div.last")  # a line or two: the detail on hover
    assert "partition 0: sequences 3\u2013590; partition 1: sequences 1\u2013598" in last.get_attribute("title")
    assert "sequences" not in rows["m1"][8] and rows["m1"][8].endswith(f"into \u2026/{Path(extra['table']).name}")
    heights = page.evaluate("[...document.querySelectorAll('tr[data-member]')].map(r => r.getBoundingClientRect().height)")
    assert max(heights) < 3 * 20 + 14, heights  # a row fits in two lines of text (and its chart)
    # each member's last hour: m1's landing as a bar, the backlog line through the samples, a
    # time axis of UTC clock times, and both scales' values written out
    charts = {r.get_attribute("data-member"): r.locator("svg.spark") for r in table.locator("tr[data-member]").all()}
    assert charts["m1"].locator("rect.landed").count() == 1 and charts["m2"].locator("rect.landed").count() == 0
    assert f"landed {extra['messages_landed']} messages in the last hour" in charts["m1"].locator(
        "title").first.text_content()
    assert charts["m1"].locator("text.y-landed").text_content() == f"{extra['messages_landed']}/5 min"
    spark = charts["m2"]
    points = spark.locator("polyline.backlog").get_attribute("points").split()
    assert len(points) >= 3, points  # the sampler's, before anyone looked
    assert spark.locator("text.y-backlog").text_content() == f"backlog {members['m2'].backlog}"
    ticks = spark.locator("text.x-tick").all_text_contents()
    assert len(ticks) == 3 and ticks[-1] in {time.strftime("%H:%M", time.gmtime(time.time() - s)) for s in (0, 60)}, ticks
    group_chart = page.locator(f"#group-{STREAM}-{GROUP} svg.group")
    assert group_chart.locator("text.x-tick").count() == 5
    assert group_chart.locator("text.y-landed").first.text_content() == str(extra["messages_landed"])
    assert group_chart.locator("text.y-backlog").first.text_content() == f"{N}"  # the largest backlog sampled
    assert "sampled every 2 s by the API server" in page.locator(f"#group-{STREAM}-{GROUP} .legend").inner_text()
    assert "backlog 600 messages" in page.locator(f"#group-{STREAM}-{GROUP} .summary").inner_text()
    screenshot(page, tmp_path, "consumer-groups.png", full_page=True)
    # nothing off-screen on a 1280 px screen: no horizontal scrolling, every cell inside the window
    page.set_viewport_size({"width": 1280, "height": 900})
    page.reload()
    width = page.evaluate("window.innerWidth")
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    rights = page.evaluate("[...document.querySelectorAll('td, th, svg, p')].map(e => e.getBoundingClientRect().right)")
    assert max(rights) <= width, max(rights)
    screenshot(page, tmp_path, "consumer-groups-1280.png", full_page=True)
    page.set_viewport_size({"width": 1400, "height": 1000})
    # light and dark, as Airflow's UI: its saved choice (in the UI's frame, its <html> class)
    light = page.evaluate("getComputedStyle(document.documentElement).backgroundColor")
    page.evaluate("localStorage.setItem('theme', 'dark')")
    page.reload()
    dark = page.evaluate("getComputedStyle(document.documentElement).backgroundColor")
    assert (light, dark) == ("rgb(255, 255, 255)", "rgb(9, 9, 11)"), (light, dark)
    bar = page.locator(f"#group-{STREAM}-{GROUP} svg.group rect.landed").first
    assert bar.evaluate("e => getComputedStyle(e).fill") == "rgb(96, 165, 250)"  # the dark palette's bars
    screenshot(page, tmp_path, "consumer-groups-dark.png", full_page=True)
    page.evaluate("localStorage.removeItem('theme')")

    # One time zone for the tables and the charts, the reader's: a browser in Asia/Kolkata (UTC+5:30)
    kolkata = page.context.browser.new_context(timezone_id="Asia/Kolkata", storage_state=page.context.storage_state())
    try:
        there = kolkata.new_page()
        there.goto(f"{ui.url}/cg/?conn_id=nats_groups")
        zone = there.locator("#zone").inner_text()  # ICU's name (Asia/Calcutta here) and its offset
        assert zone.startswith(("Asia/Kolkata", "Asia/Calcutta")) and "5:30" in zone, zone
        local = pinned_at + dt.timedelta(hours=5, minutes=30)
        cell = there.locator(f"#group-{STREAM}-{GROUP} tr[data-member=m1] td").nth(3).inner_text()
        assert cell.endswith(local.strftime("%H:%M:%S")), cell
        ticks = there.locator(f"#group-{STREAM}-{GROUP} tr[data-member=m2] svg.spark text.x-tick").all_text_contents()
        now_there = {(dt.datetime.now(dt.UTC) + dt.timedelta(hours=5, minutes=30, seconds=-s)).strftime("%H:%M")
                     for s in (0, 60)}
        assert ticks[-1] in now_there, ticks
    finally:
        kolkata.close()

    # The same as JSON; a connection that cannot reach NATS says so, without its password.
    api = page.request.get(f"{ui.url}/cg/api/groups?conn_id=nats_groups").json()
    assert api["conn_id"] == "nats_groups" and api["error"] is None
    (group,) = [g for g in api["groups"] if g["group"] == GROUP]
    assert sum(m["backlog"] for m in group["members"]) == status.backlog == N
    m1 = next(m for m in group["members"] if m["member"] == "m1")
    assert m1["history"]["landed_per_5min"][-1] == extra["messages_landed"] and len(m1["history"]["backlog"]) >= 3
    assert sum(group["history"]["landed_per_5min"]) == extra["messages_landed"]
    page.goto(f"{ui.url}/cg/?conn_id=nats_down")
    error = page.locator("#error").inner_text()
    assert "cannot reach NATS through 'nats_down'" in error and DOWN_PASSWORD not in page.content()
    assert {"nats_groups", "nats_down"} <= set(page.locator("select option").all_inner_texts())
    # a connection kept in the API server's environment (or a secrets backend), when named
    page.goto(f"{ui.url}/cg/?conn_id=nats_env")
    assert page.locator(f"#group-{STREAM}-{GROUP}").is_visible()


def test_the_page_stays_usable_with_256_members(page, ui, world, tmp_path):
    """A group of 256 members over 256 partitions: every member's row and chart, in one page
    that loads in seconds and stays small."""
    from tests.integration.test_operators_groups import NatsThread

    server, _, _ = world
    t = NatsThread(NatsConnectionSettings(servers=[server.url]))
    try:
        cfg = ElasticGroupConfig(256, (PartitioningFilter("orders.*", (1,)),),
                                 members=tuple(f"w{i:03d}" for i in range(256)))
        t.run(t.cg.create(STREAM, "wide", cfg.validate()))
    finally:
        t.run(t.nc.close())
    code, answer = ui.api("POST", "/api/v2/connections", {"connection_id": "nats_groups", "conn_type": "nats",
                                                          "host": "127.0.0.1", "port": server.port})
    assert code in (201, 409), answer
    sign_in(page, ui, "admin", "/plugin/nats-consumer-groups")
    started = time.monotonic()
    page.goto(f"{ui.url}/cg/?conn_id=nats_groups")
    rows = page.locator(f"#group-{STREAM}-wide table tr[data-member]")
    assert rows.count() == 256 and page.locator(f"#group-{STREAM}-wide table svg.spark").count() == 256
    took = time.monotonic() - started
    size = len(page.content())
    print(f"256 members: page in {took:.2f} s, {size / 1024:.0f} kB")
    assert took < 20 and size < 2_000_000, (took, size)
    backlogs = [int(c) for c in rows.locator("td:nth-child(5)").all_inner_texts()]
    assert sum(backlogs) == N  # every message is in one member's partitions
    # one member found among 256 by its name, the table's header kept in view
    page.locator(f"#group-{STREAM}-wide input.member-filter").fill("w2")
    visible = [r for r in rows.all() if r.is_visible()]
    assert [r.get_attribute("data-member") for r in visible] == [f"w{i:03d}" for i in range(200, 256)]
    page.locator(f"#group-{STREAM}-wide input.member-filter").fill("w042")
    assert [r.get_attribute("data-member") for r in rows.all() if r.is_visible()] == ["w042"]
    screenshot(page, tmp_path, "consumer-groups-256.png")


def test_the_page_is_behind_airflows_auth(page, ui, world):
    anonymous = page.request.get(f"{ui.url}/cg/api/groups")
    assert anonymous.status == 401
    # a viewer may not read connections (simple auth manager: connections are for ops)
    sign_in(page, ui, "viewer", "/plugin/nats-consumer-groups")
    page.goto(f"{ui.url}/cg/")
    assert page.locator("#no-connections").is_visible()
    assert page.request.get(f"{ui.url}/cg/api/groups?conn_id=nats_groups").status == 404


def members_backlog(status, member: str) -> int:
    return next(m.backlog for m in status.members if m.member == member)


def _wait_for_samples(conn_id: str, at_least: int, timeout: float = 60) -> list[tuple[str, int]]:
    """The sampler's rows for ``conn_id``'s group, from Airflow's metadata DB (no page asked):
    ``(member, backlog)``, once a member has ``at_least`` of them."""
    from airflow import settings
    from sqlalchemy import text

    deadline = time.monotonic() + timeout
    rows: list = []
    while time.monotonic() < deadline:
        with settings.engine.connect() as c:
            try:
                rows = c.execute(text("SELECT member, backlog FROM cg_backlog_samples WHERE conn_id = :c AND "
                                      "group_name = :g"), {"c": conn_id, "g": GROUP}).all()
            except Exception:  # the table is created by the sampler's first round
                rows = []
        if sum(1 for m, _ in rows if m == "m2") >= at_least:
            return [(m, int(n)) for m, n in rows]
        time.sleep(SAMPLE_SECONDS)
    raise AssertionError(f"the sampler wrote {len(rows)} samples of {conn_id!r} in {timeout:.0f} s")


def _prometheus(text: str) -> dict[tuple[str, frozenset], float]:
    """Prometheus text as ``{(name, labels): value}``, each metric's HELP and TYPE checked."""
    import re

    out, typed = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
            continue
        if line.startswith("#") or not line:
            continue
        m = re.fullmatch(r'(\w+)\{(.*)\} (\S+)', line)
        assert m, line
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2)))
        assert m.group(1) in typed, line
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def test_lag_as_metrics_in_prometheus_text_and_through_airflows_statsd(ui, world, statsd):
    """The group's lag as the server has it, scraped from ``/cg/metrics`` with a token (and
    refused without one), and sent by the API server's sampler through Airflow's own StatsD
    client to a real UDP listener: the same backlog, m1 pinned, the ages in seconds."""
    import urllib.error
    import urllib.request

    server, status, pin = world
    url = f"{ui.url}/cg/metrics?conn_id=nats_env"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=30)
    assert refused.value.code in (401, 403)
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {ui.token()}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        scraped = _prometheus(r.read().decode())
    group = frozenset({("conn_id", "nats_env"), ("stream", STREAM), ("group", GROUP)})
    assert scraped[("cg_connection_up", frozenset({("conn_id", "nats_env")}))] == 1
    assert scraped[("cg_group_backlog_messages", group)] == status.backlog == N
    assert scraped[("cg_group_members", group)] == 3
    assert scraped[("cg_group_partition_streams_not_current", group)] == 0
    assert scraped[("cg_group_oldest_pending_age_seconds", group)] > 0
    m1, m2 = group | {("member", "m1")}, group | {("member", "m2")}
    assert scraped[("cg_member_pinned", m1)] == 1 and scraped[("cg_member_pinned", m2)] == 0
    assert scraped[("cg_member_ack_pending_messages", m1)] == 1
    by_member = {m.member: m.backlog for m in status.members}
    assert scraped[("cg_member_backlog_messages", m2)] == by_member["m2"]
    assert sum(v for (name, labels), v in scraped.items() if name == "cg_member_backlog_messages"
               and group <= labels) == N

    deadline = time.monotonic() + 60  # the sampler's next rounds (every SAMPLE_SECONDS)
    prefix = f"airflow.cg.nats_env.{STREAM}.{GROUP}"
    while time.monotonic() < deadline and not any(ln.startswith(f"{prefix}.m1.pinned:") for ln in statsd.lines):
        time.sleep(0.5)
    lines = list(statsd.lines)
    gauges = {ln.split(":")[0]: float(ln.split(":")[1].split("|")[0]) for ln in lines if ln.endswith("|g")}
    assert gauges.get(f"{prefix}.backlog_messages") == N, sorted(gauges)[:20]
    assert gauges[f"{prefix}.m1.pinned"] == 1 and gauges[f"{prefix}.m2.pinned"] == 0
    assert gauges[f"{prefix}.m2.backlog_messages"] == by_member["m2"]
    assert gauges[f"{prefix}.oldest_pending_age_seconds"] > 0
    assert gauges["airflow.cg.nats_env.connection_up"] == 1
