"""The consumer-groups page: every group a NATS connection reaches, read-only.

Served by Airflow's API server (``plugin.py`` mounts it at ``/cg``, the UI shows it under
Browse). For the chosen ``nats`` connection: each group with its members, their partitions,
pin holder and since when, backlog, the age of the oldest pending message
(``core/groups/lag.py``), the last batch that landed for it, from the landing tasks'
asset events (``airflow_provider_cg.assets``) and, while a run is pinned, what it has landed so
far (its progress board, ``core/landing/run/board.py``: a follower's progress), and a chart of its last hour: messages landed
per 5 minutes and the backlog, sampled on a schedule by this app's lifespan task (``history.py``, ``charts.py``). Only signed-in users who may read the
connection see it (``auth.py``); no secret of the connection is ever shown (errors are
scrubbed). ``/cg/api/groups?conn_id=`` returns the same as JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse

from airflow_provider_cg._provider_info import CONN_TYPE
from airflow_provider_cg.assets import server_addresses
from airflow_provider_cg.core.groups import problems
from airflow_provider_cg.core.groups.lag import epoch_seconds
from airflow_provider_cg.core.jetstream.api import DEFAULT_PREFIX
from airflow_provider_cg.core.landing.run.board import landing_now
from airflow_provider_cg.metrics import (
    airflow_stats,
    connection_metric,
    emit,
    lag_metrics,
    prometheus_text,
)
from airflow_provider_cg.ui.auth import current_user, may_read_connection
from airflow_provider_cg.ui.charts import last_hour_svg
from airflow_provider_cg.ui.history import (
    SAMPLES,
    landed_last_hour,
    sample_backlogs,
    sample_seconds,
    with_history,
)

CONNECT_TIMEOUT = 5.0
log = logging.getLogger(__name__)
LAST_EVENTS = 500  # asset events scanned for each group's last landed batch


def nats_connections(user: Any) -> list[str]:
    """The ``nats`` connections of the metadata DB ``user`` may read, sorted (one kept in the
    environment or a secrets backend is shown when named: ``?conn_id=``)."""
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as s:
        ids = s.scalars(select(Connection.conn_id).where(Connection.conn_type == CONN_TYPE)).all()
    return sorted(c for c in ids if may_read_connection(user, c))


def _is_nats(conn_id: str) -> bool:
    """A ``nats`` connection outside the metadata DB (environment, secrets backend)."""
    from airflow.models.connection import Connection

    try:
        return Connection.get_connection_from_secrets(conn_id).conn_type == CONN_TYPE
    except Exception:  # not found anywhere
        return False


async def lag_of(conn_id: str) -> tuple[list[dict[str, Any]], str | None, Any]:
    """``(groups, error, settings)``: every group's lag through connection ``conn_id``."""
    from airflow.models.connection import Connection

    from airflow_provider_cg.core.groups.lag import GroupLag, all_groups_lag
    from airflow_provider_cg.hooks.nats import scrub, settings_from_connection

    settings = None
    try:
        conn = await asyncio.to_thread(Connection.get_connection_from_secrets, conn_id)
        settings = settings_from_connection(conn, conn.extra_dejson or {})
        nc = await asyncio.wait_for(settings.connect(), CONNECT_TIMEOUT + 1)
    except Exception as e:
        return [], scrub(f"cannot reach NATS through {conn_id!r}: {_first_line(e)}", settings), settings
    try:
        groups = await all_groups_lag(nc)
        out = [g.to_dict() if isinstance(g, GroupLag) else {**g, "error": scrub(g["error"], settings)}
               for g in groups]
        try:
            await landing_now(nc, DEFAULT_PREFIX, out)
        except Exception as e:  # noqa: BLE001 - the board is an extra: the lag stands without it
            log.warning("consumer-groups page: the progress board unread (%s)", _first_line(e))
    except Exception as e:
        return [], scrub(f"cannot list the groups: {_first_line(e)}", settings), settings
    finally:
        await nc.close()
    return out, None, settings


#: connections the page was asked for that the metadata DB does not list (the environment's, a
#: secrets backend's): the sampler samples them too, from then on
ASKED: set[str] = set()


async def groups_of(conn_id: str, record: bool = True) -> tuple[list[dict[str, Any]], str | None]:
    """``(groups, error)``: every group's lag through connection ``conn_id``, with what each
    member landed last and the last hour (``record``: a backlog sample of this reading added;
    the sampler records its own)."""
    ASKED.add(conn_id)
    out, error, settings = await lag_of(conn_id)
    if error:
        return [], error
    servers = server_addresses(settings.servers)
    now = time.time()

    def history() -> tuple[dict, dict, dict]:  # the metadata DB: off the event loop
        if record:
            SAMPLES.record(conn_id, out, now)
        return last_landed(servers), landed_last_hour(servers, now), SAMPLES.series(conn_id, now)

    landed, per_5min, backlog = await asyncio.to_thread(history)
    for g in out:
        for m in g.get("members") or []:
            m["last_landed"] = landed.get((g["stream"], g["group"], m["member"]))
    with_history(out, per_5min, backlog)
    return out, None


def sampled_connections() -> list[str]:
    """What the backlog sampler reads: every ``nats`` connection of the metadata DB, and the
    others the page was asked for."""
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as s:
        ids = set(s.scalars(select(Connection.conn_id).where(Connection.conn_type == CONN_TYPE)).all())
    return sorted(ids | ASKED)


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e).strip() else type(e).__name__


def last_landed(servers: list[str]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The last asset event of each (stream, group, member) the landing tasks announced through
    one of ``servers`` (``host:port``): a group of the same name on another server is another
    group."""
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from sqlalchemy import select

    out: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    with create_session() as s:
        events = s.scalars(select(AssetEvent).order_by(AssetEvent.timestamp.desc()).limit(LAST_EVENTS)).all()
        for e in events:
            x = e.extra or {}
            if not isinstance(x, dict) or "cg_extra_version" not in x:
                continue
            if not set(x.get("nats_servers") or ()) & set(servers):
                continue
            key = (x.get("stream"), x.get("group"), x.get("member"))
            if key not in out:
                ranges = {p: f"{r['first_seq']}-{r['last_seq']}" for rs in (x.get("origin") or {}).values()
                          for p, r in rs.items()}
                out[key] = {"at": e.timestamp.isoformat(timespec="seconds"), "table": x.get("table"),
                            "messages_landed": x.get("messages_landed"), "rows_written": x.get("rows_written"),
                            "ranges": ranges, "dag_id": e.source_dag_id, "run_id": e.source_run_id}
    return out


def readable_ranges(ranges: dict[str, str]) -> str:
    """``{"0": "5008-7000"}`` as people read it: ``partition 0: sequences 5,008–7,000`` (the
    origin stream's sequence numbers, first to last: a range, not a count)."""
    out = []
    for partition, span in sorted(ranges.items(), key=lambda kv: int(kv[0])):
        first, _, last = span.partition("-")
        out.append(f"partition {partition}: sequences {int(first):,}\u2013{int(last):,}")
    return "; ".join(out)


@contextlib.asynccontextmanager
async def sampling(app: FastAPI) -> AsyncIterator[None]:
    """The API server's lifespan (Airflow enters a plugin app's): the backlog sampler runs as
    long as the server does."""
    interval = sample_seconds()
    task = None
    if interval > 0:
        stats = airflow_stats()

        async def read(conn_id: str) -> tuple[list[dict[str, Any]], str | None]:
            groups, error = await groups_of(conn_id, record=False)
            metrics, changes = lag_metrics(conn_id, groups)
            emit(stats, [*metrics, connection_metric(conn_id, error is None)], changes)
            return groups, error

        task = asyncio.create_task(sample_backlogs(read, sampled_connections, interval))
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def create_app() -> FastAPI:
    app = FastAPI(title="NATS consumer groups", docs_url=None, redoc_url=None, openapi_url=None, lifespan=sampling)

    def readable(conn_id: str | None, user: Any) -> tuple[list[str], str | None]:
        conns = nats_connections(user)
        if conn_id is None:
            return conns, conns[0] if conns else None
        if conn_id not in conns and not (may_read_connection(user, conn_id) and _is_nats(conn_id)):
            # unknown, or not the user's to read: the same answer
            raise HTTPException(404, f"no nats connection {conn_id!r} you may read")
        return (conns if conn_id in conns else [*conns, conn_id]), conn_id

    @app.get("/api/groups")
    async def api_groups(conn_id: str | None = Query(None), user: Any = Depends(current_user)) -> JSONResponse:
        conns, chosen = readable(conn_id, user)
        if chosen is None:
            return JSONResponse({"connections": conns, "conn_id": None, "groups": [], "error": None})
        groups, error = await groups_of(chosen)
        return JSONResponse({"connections": conns, "conn_id": chosen, "groups": groups, "error": error})

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics(conn_id: str | None = Query(None), user: Any = Depends(current_user)) -> PlainTextResponse:
        """Prometheus text (``metrics.py``): every group of ``conn_id``, or of every ``nats``
        connection the user may read."""
        conns, chosen = readable(conn_id, user)
        out = []
        for c in [chosen] if conn_id and chosen else conns:
            groups, error = await groups_of(c)
            out += [*lag_metrics(c, groups, observe=sample_seconds() <= 0)[0], connection_metric(c, error is None)]
        return PlainTextResponse(prometheus_text(out), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/", response_class=HTMLResponse)
    async def page(conn_id: str | None = Query(None), user: Any = Depends(current_user)) -> HTMLResponse:
        conns, chosen = readable(conn_id, user)
        groups, error = (await groups_of(chosen)) if chosen else ([], None)
        return HTMLResponse(render(conns, chosen, groups, error))

    return app


def landing_now_html(now: dict[str, Any]) -> str:
    """A pinned run's figures from the progress board (``core/landing/run/board.py``): a
    follower's progress while it runs, before its task's asset event; past its follow time,
    that it hands over (it lands on until its successor is warm)."""
    until = now.get("follow_until")
    if now.get("state") == "handing over":
        what = "handing over to the member's next follower"
    else:
        what = f"following until {time_html(until)}" if until else "landing"
    return (f'<div class="landing-now" data-owner="{html.escape(str(now.get("owner")))}"><b>{what}</b>: '
            f'{plural(now.get("messages_read", 0), "message")}, {plural(now.get("rows_written", 0), "row")} in '
            f'{plural(now.get("batches", 0), "batch", "batches")} since {time_html(now.get("started_at"))}, '
            f'{now.get("rate_msg_s", 0):,} msg/s <span class="muted">(reported {_age(now.get("age_s"))} ago)</span></div>')


def landed_html(last: dict[str, Any] | None, now: dict[str, Any] | None, successor: dict[str, Any] | None) -> str:
    """A member's *last landed* cell in a line or two: its follower's figures while one runs
    (its last task's landing then on hover), else the last task's landing: when, how much,
    into which table (the sequence ranges and the table's whole name on hover); and its next
    follower while one waits."""
    e = html.escape
    done = ""
    if last:
        detail = f'{readable_ranges(last["ranges"])} into {last["table"]}'
        done = (f'<div class="last" title="{e(detail)}">{time_html(last["at"])}: '
                f'{plural(last["messages_landed"], "message")}, {plural(last["rows_written"], "row")} into '
                f'{wrappable(short_table(last["table"]))}</div>')
    if now:
        hover = f' title="{e("last landed by a task: " + detail)}"' if last else ""
        done = f"<div{hover}>{landing_now_html(now)}</div>"
    return (successor_html(successor) if successor else "") + (done or "-")


def successor_html(waiting: dict[str, Any]) -> str:
    """The member's next follower, started while the pin is held: warming up (its Spark
    session and warm-up), or warm and waiting for the pin (``board.py``)."""
    who = waiting.get("holder") or {}
    task = wrappable(who["task"]) if who.get("task") else f"a cg job on {wrappable(who.get('host'))}"
    return f'<div class="successor">next: {task}, <b>{html.escape(str(waiting.get("state")))}</b></div>'


def plural(n: int, one: str, many: str | None = None) -> str:
    """``1 batch``, ``2 batches``, ``1,000 messages``."""
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


def time_html(raw: Any) -> str:
    """A time as people read it, in the page's one time zone: the browser writes it in the
    reader's (the clock only, today; the page's top line names the zone), UTC without script;
    the raw value is on hover and in ``datetime``."""
    at = epoch_seconds(raw)
    if at is None:
        return html.escape(str(raw)) if raw else "-"
    utc = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at))
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
    return f'<time datetime="{iso}" title="{html.escape(str(raw))}">{utc} UTC</time>'


def wrappable(name: Any) -> str:
    """``name`` escaped, with a line-break opportunity after each ``.``, ``_``, ``/``, ``:`` and
    ``-``: a long task or table name wraps between its words, never inside one."""
    return "<wbr>".join(html.escape(part) for part in re.split(r"(?<=[._/:-])", str(name)))


def short_table(table: Any) -> str:
    """A table's last name (``s3://lake/sales/paid_orders`` -> ``…/paid_orders``); the whole on hover."""
    text = str(table)
    tail = text.rstrip("/").rsplit("/", 1)[-1]
    return text if tail == text.rstrip("/") else f"\u2026/{tail}"


def holder_html(member: dict[str, Any]) -> str:
    """Who holds a member's pin: the run that reports on the progress board with that pin (its
    Airflow task, host and process), else a client that does not report (orbit's, another
    tool's); the pin id on hover."""
    pin = member.get("pin_holder")
    if not pin:
        return "-"
    now = member.get("landing_now") or {}
    who = now.get("holder") or {}
    if now.get("pin_id") == pin and who:
        task = who.get("task")
        name = (f"{wrappable(task)} on {wrappable(who.get('host'))}" if task
                else f"a cg job on {wrappable(who.get('host'))}")
        return f'<span class="pin" title="pin id {html.escape(pin)}">{name} (pid {html.escape(str(who.get("pid")))})</span>'
    return (f'<span class="pin" title="pin id {html.escape(pin)}">a client that does not report '
            f'(orbit, another tool) <span class="muted">…{html.escape(pin[-6:])}</span></span>')


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


#: Airflow 3's look (its UI is Chakra UI: Inter, zinc greys, tables ruled by rows), light and dark
STYLE = """
:root{--bg:#fff;--fg:#09090b;--muted:#71717a;--border:#e4e4e7;--head:#fafafa;--plot:#fafafa;--grid:#e4e4e7;
--bar:#3b82f6;--line:#e11d48;--err:#dc2626;--link:#0164b3}
:root[data-theme=dark]{--bg:#09090b;--fg:#fafafa;--muted:#a1a1aa;--border:#27272a;--head:#18181b;--plot:#111113;
--grid:#27272a;--bar:#60a5fa;--line:#fb7185;--err:#f87171;--link:#60a5fa}
@media (prefers-color-scheme:dark){:root:not([data-theme=light]){--bg:#09090b;--fg:#fafafa;--muted:#a1a1aa;
--border:#27272a;--head:#18181b;--plot:#111113;--grid:#27272a;--bar:#60a5fa;--line:#fb7185;--err:#f87171;--link:#60a5fa}}
html{background:var(--bg);color:var(--fg)}
body{margin:0;padding:16px 20px;font:14px/1.45 Inter,-apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,sans-serif}
h1{font-size:20px;font-weight:600;margin:0 0 12px} h2{font-size:16px;font-weight:600;margin:24px 0 2px}
select,input{font:inherit;color:var(--fg);background:var(--bg);border:1px solid var(--border);border-radius:6px;padding:4px 8px}
table{border-collapse:collapse;margin:8px 0 8px;width:100%}
th,td{border-bottom:1px solid var(--border);padding:6px 10px;text-align:left;vertical-align:middle}
th{background:var(--head);font-weight:600;font-size:12px;color:var(--muted);position:sticky;top:0;z-index:1}
tr:hover td{background:var(--head)} .num{text-align:right;font-variant-numeric:tabular-nums}
.err{color:var(--err)} .muted{color:var(--muted)} .legend{font-size:12px}
.legend i{display:inline-block;width:12px;height:8px;margin:0 4px 0 12px;vertical-align:middle}
svg{display:block;overflow:visible} svg .plot{fill:var(--plot)} svg .grid{stroke:var(--grid);stroke-width:1}
svg .landed,.legend .landed{fill:var(--bar);background:var(--bar)} svg .backlog{fill:none;stroke:var(--line);stroke-width:1.6}
svg .backlog-now{fill:var(--line)} .legend .backlog{background:var(--line);height:2px}
svg text{fill:var(--muted);font-size:10px;font-variant-numeric:tabular-nums} svg.group text{font-size:11px}
svg text.y-landed{fill:var(--bar)} svg text.y-backlog{fill:var(--line)} svg text.empty{font-size:12px}
.landing-now{color:var(--link)}
td.landed{min-width:14em;max-width:30em} td.holder{max-width:16em} td{overflow-wrap:break-word}
.group-chart{max-width:100%;overflow:hidden} svg.group{max-width:100%;height:auto}
"""
#: which theme: Airflow's own (its frame's <html> class, or its saved choice), else the system's
THEME_SCRIPT = """(function(){function pick(){var d=null;try{var p=window.parent.document.documentElement;
if(p!==document.documentElement){d=p.classList.contains('dark')?'dark':p.classList.contains('light')?'light':null}}catch(e){}
if(!d){try{var s=localStorage.getItem('theme');if(s==='dark'||s==='light')d=s}catch(e){}}
if(!d)d=matchMedia('(prefers-color-scheme: dark)').matches?'dark':'light';document.documentElement.dataset.theme=d}
pick();try{new MutationObserver(pick).observe(window.parent.document.documentElement,{attributes:true})}catch(e){}})();"""
#: a group's members filtered by name; the page reloads itself every 30 s unless a filter is typed
PAGE_SCRIPT = """document.querySelectorAll('input.member-filter').forEach(function(f){f.addEventListener('input',function(){
var q=f.value.toLowerCase();document.querySelectorAll('#'+f.dataset.table+' tr[data-member]').forEach(function(r){
r.hidden=q&&r.dataset.member.toLowerCase().indexOf(q)<0})})});
(function(){var today=new Date().toDateString(),hms={hour:'2-digit',minute:'2-digit',second:'2-digit',hour12:false};
document.querySelectorAll('time[datetime]').forEach(function(t){var d=new Date(t.dateTime);if(isNaN(d))return;
t.textContent=d.toDateString()===today?d.toLocaleTimeString([],hms):d.toLocaleString([],Object.assign({month:'short',
day:'numeric'},hms))});
function hm(d,utc){var h=utc?d.getUTCHours():d.getHours(),m=utc?d.getUTCMinutes():d.getMinutes();
return (h<10?'0':'')+h+':'+(m<10?'0':'')+m}
document.querySelectorAll('svg [data-at]').forEach(function(t){var d=new Date(1000*t.dataset.at);
t.textContent=t.textContent.replace(hm(d,true),hm(d,false))});
var z=document.getElementById('zone');if(z){var n=Intl.DateTimeFormat().resolvedOptions().timeZone,
s=new Date().toLocaleTimeString([],{timeZoneName:'short'}).split(' ').pop();z.textContent=n===s?n:n+' ('+s+')'}})();
setInterval(function(){if(![].some.call(document.querySelectorAll('input.member-filter'),function(f){return f.value}))
location.reload()},30000);"""
FILTER_FROM = 12  # members from which a group's table gets a filter box


def render(conns: list[str], chosen: str | None, groups: list[dict[str, Any]], error: str | None) -> str:
    e = html.escape
    options = "".join(f'<option value="{e(c)}"{" selected" if c == chosen else ""}>{e(c)}</option>' for c in conns)
    every = sample_seconds()
    sampled = (f"sampled every {every:.0f} s by the API server" if every > 0 else "sampled when this page is shown")
    parts = [f"""<!doctype html><html><head><meta charset="utf-8"><title>NATS consumer groups</title>
<meta name="viewport" content="width=device-width"><script>{THEME_SCRIPT}</script><style>{STYLE}</style></head>
<body><h1>NATS consumer groups</h1>
<form method="get"><label>Connection <select name="conn_id" onchange="this.form.submit()">{options}</select></label>
<noscript><button>Show</button></noscript></form>
<p class="muted">Times in <span id="zone">UTC</span>, in the tables and the charts.</p>"""]
    if not conns:
        parts.append('<p class="muted" id="no-connections">No connection of type nats that you may read.</p>')
    if error:
        parts.append(f'<p class="err" id="error">{e(error)}</p>')
    if chosen and not error and not groups:
        parts.append('<p class="muted" id="no-groups">No consumer groups on this connection.</p>')
    now = time.time()
    for g in groups:
        title = f"{g['stream']} / {g['group']}"
        anchor = e("group-" + g["stream"] + "-" + g["group"])
        if g.get("error"):
            parts.append(f'<section class="group"><h2>{e(title)}</h2><p class="err">{e(g["error"])}</p></section>')
            continue
        members = g["members"]
        table_id = e("members-" + g["stream"] + "-" + g["group"])
        parts.append(
            f'<section class="group" id="{anchor}"><h2>{e(title)}</h2>'
            f'<p class="muted summary">{e(g["kind"])}, {g["max_members"]} partitions, {len(members)} members, '
            f'backlog {g["backlog"]:,} messages, oldest pending {_age(g["oldest_pending_age_s"])}'
            + (f', source lag {g["source_lag"]:,} messages' if g.get("source_lag") is not None else "")
            + (f', unassigned partitions {e(str(g["unassigned_partitions"]))}' if g["unassigned_partitions"] else "")
            + "</p>"
            + "".join(f'<p class="err" data-partition="{e(p)}">partition {e(p)}: its stream is not current: '
                      f'{e(why)} (its backlog is not known)</p>'
                      for p, why in (g.get("partition_problems") or {}).items())
            + (f'<p class="err" id="{anchor}-source">source stalled: {e(g["source_stalled"])}; the group\'s member '
               "jobs start it again</p>" if g.get("source_stalled") else "")
            + (f'<p class="err" id="{anchor}-origin">{e(problems.describe(problems.ORIGIN_WENT_BACK, g["problems"][problems.ORIGIN_WENT_BACK]))}'
               "</p>" if problems.ORIGIN_WENT_BACK in (g.get("problems") or {}) else "")
            + f'<div class="group-chart">{last_hour_svg(g.get("history") or {}, now, large=True, css_class="group")}</div>'
            + f'<p class="legend muted">the last hour: <i class="landed"></i>messages landed per 5 min (left scale)'
              f'<i class="backlog"></i>backlog, {sampled} (right scale); samples kept in Airflow\'s database</p>'
            + (f'<input type="search" class="member-filter" data-table="{table_id}" placeholder="Filter members" '
               f'aria-label="Filter members of {e(title)}">' if len(members) >= FILTER_FROM else "")
            + f'<table id="{table_id}"><thead><tr><th>member</th><th>partitions</th><th>pin holder</th>'
              "<th>pinned since</th><th class=\"num\">backlog (messages)</th><th class=\"num\">ack pending "
              "(messages)</th><th class=\"num\">oldest pending (age)</th><th>last hour</th><th>last landed</th>"
              "</tr></thead><tbody>")
        for m in members:
            landed = landed_html(m.get("last_landed"), m.get("landing_now"), m.get("successor"))
            parts.append(
                f'<tr data-member="{e(m["member"])}"><td>{e(m["member"])}</td><td>{e(str(m["partitions"]))}</td>'
                f'<td class="holder">{holder_html(m)}</td><td>{time_html(m["pinned_since"])}</td>'
                f'<td class="num">{m["backlog"]}</td><td class="num">{m["num_ack_pending"]}</td>'
                f'<td class="num">{_age(m["oldest_pending_age_s"])}</td>'
                f'<td>{last_hour_svg(m.get("history") or {}, now)}</td><td class="landed">{landed}</td></tr>')
        parts.append("</tbody></table></section>")
    parts.append(f"<script>{PAGE_SCRIPT}</script></body></html>")
    return "".join(parts)
