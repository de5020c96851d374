"""The consumer-groups page: every group a NATS connection reaches, read-only.

Served by Airflow's API server (``plugin.py`` mounts it at ``/cg``, the UI shows it under
Browse). For the chosen ``nats`` connection: each group with its members, their partitions,
pin holder and since when, backlog, the age of the oldest pending message
(``core/groups/lag.py``), the last batch that landed for it, from the landing tasks'
asset events (``airflow_provider_cg.assets``), and a chart of its last hour: messages landed
per 5 minutes and the sampled backlog (``history.py``, ``charts.py``). Only signed-in users who may read the
connection see it (``auth.py``); no secret of the connection is ever shown (errors are
scrubbed). ``/cg/api/groups?conn_id=`` returns the same as JSON.
"""

from __future__ import annotations

import asyncio
import html
import time
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, JSONResponse

from airflow_provider_cg._provider_info import CONN_TYPE
from airflow_provider_cg.assets import server_addresses
from airflow_provider_cg.ui.auth import current_user, may_read_connection
from airflow_provider_cg.ui.charts import last_hour_svg
from airflow_provider_cg.ui.history import landed_last_hour, with_history

CONNECT_TIMEOUT = 5.0
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


async def groups_of(conn_id: str) -> tuple[list[dict[str, Any]], str | None]:
    """``(groups, error)``: every group's lag through connection ``conn_id``."""
    from airflow.models.connection import Connection

    from airflow_provider_cg.core.groups.lag import GroupLag, all_groups_lag
    from airflow_provider_cg.hooks.nats import scrub, settings_from_connection

    settings = None
    try:
        conn = Connection.get_connection_from_secrets(conn_id)
        settings = settings_from_connection(conn, conn.extra_dejson or {})
        nc = await asyncio.wait_for(settings.connect(), CONNECT_TIMEOUT + 1)
    except Exception as e:
        return [], scrub(f"cannot reach NATS through {conn_id!r}: {_first_line(e)}", settings)
    try:
        groups = await all_groups_lag(nc)
    except Exception as e:
        return [], scrub(f"cannot list the groups: {_first_line(e)}", settings)
    finally:
        await nc.close()
    out = [g.to_dict() if isinstance(g, GroupLag) else {**g, "error": scrub(g["error"], settings)} for g in groups]
    servers = server_addresses(settings.servers)
    landed = last_landed(servers)
    for g in out:
        for m in g.get("members") or []:
            m["last_landed"] = landed.get((g["stream"], g["group"], m["member"]))
    with_history(conn_id, out, landed_last_hour(servers, time.time()))
    return out, None


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
    """``{"0": "5008-7000"}`` as people read it: ``partition 0: messages 5,008–7,000``."""
    out = []
    for partition, span in sorted(ranges.items(), key=lambda kv: int(kv[0])):
        first, _, last = span.partition("-")
        out.append(f"partition {partition}: messages {int(first):,}\u2013{int(last):,}")
    return "; ".join(out)


def create_app() -> FastAPI:
    app = FastAPI(title="NATS consumer groups", docs_url=None, redoc_url=None, openapi_url=None)

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

    @app.get("/", response_class=HTMLResponse)
    async def page(conn_id: str | None = Query(None), user: Any = Depends(current_user)) -> HTMLResponse:
        conns, chosen = readable(conn_id, user)
        groups, error = (await groups_of(chosen)) if chosen else ([], None)
        return HTMLResponse(render(conns, chosen, groups, error))

    return app


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def render(conns: list[str], chosen: str | None, groups: list[dict[str, Any]], error: str | None) -> str:
    e = html.escape
    options = "".join(f'<option value="{e(c)}"{" selected" if c == chosen else ""}>{e(c)}</option>' for c in conns)
    parts = [f"""<!doctype html><html><head><meta charset="utf-8"><title>NATS consumer groups</title>
<meta http-equiv="refresh" content="15"><style>
body{{font-family:system-ui,sans-serif;margin:1rem;color:#1a202c}} table{{border-collapse:collapse;margin:.5rem 0 1.5rem}}
th,td{{border:1px solid #cbd5e0;padding:.25rem .6rem;text-align:left;font-size:.9rem}} th{{background:#edf2f7}}
.num{{text-align:right}} .err{{color:#c53030}} .muted{{color:#718096}} h2{{font-size:1.1rem;margin-bottom:.2rem}}
svg.spark{{display:block;background:#f7fafc}} .legend{{font-size:.8rem}}
.legend i{{display:inline-block;width:.8rem;height:.5rem;margin:0 .2rem 0 .6rem}}
</style></head><body><h1>NATS consumer groups</h1>
<form method="get"><label>Connection <select name="conn_id" onchange="this.form.submit()">{options}</select></label>
<noscript><button>Show</button></noscript></form>"""]
    if not conns:
        parts.append('<p class="muted" id="no-connections">No connection of type nats that you may read.</p>')
    if error:
        parts.append(f'<p class="err" id="error">{e(error)}</p>')
    if chosen and not error and not groups:
        parts.append('<p class="muted" id="no-groups">No consumer groups on this connection.</p>')
    now = time.time()
    for g in groups:
        title = f"{g['stream']} / {g['group']}"
        if g.get("error"):
            parts.append(f'<h2>{e(title)}</h2><p class="err">{e(g["error"])}</p>')
            continue
        parts.append(
            f'<h2 id="{e("group-" + g["stream"] + "-" + g["group"])}">{e(title)}</h2>'
            f'<p class="muted">{e(g["kind"])}, {g["max_members"]} partitions, backlog {g["backlog"]}, '
            f'oldest pending {_age(g["oldest_pending_age_s"])}'
            + (f', source lag {g["source_lag"]}' if g.get("source_lag") is not None else "")
            + (f', unassigned partitions {e(str(g["unassigned_partitions"]))}' if g["unassigned_partitions"] else "")
            + "</p>"
            + "".join(f'<p class="err" data-partition="{e(p)}">partition {e(p)}: its stream is not current: '
                      f'{e(why)} (its backlog is not known)</p>'
                      for p, why in (g.get("partition_problems") or {}).items())
            + f'<div class="group-chart">{last_hour_svg(g.get("history") or {}, now, width=480, height=60)}</div>'
            + '<p class="legend muted">last hour: <i style="background:#90cdf4"></i>messages landed per 5 min'
              '<i style="background:#c53030;height:2px"></i>backlog, sampled while this page is shown</p>'
            + "<table><tr><th>member</th><th>partitions</th><th>pin holder</th><th>pinned since</th>"
              "<th>backlog</th><th>ack pending</th><th>oldest pending</th><th>last hour</th><th>last landed</th></tr>")
        for m in g["members"]:
            last = m.get("last_landed")
            landed = "-" if not last else (
                f'{e(last["at"])}: {last["messages_landed"]} messages, {last["rows_written"]} rows '
                f'({e(readable_ranges(last["ranges"]))}) into {e(str(last["table"]))}')
            parts.append(
                f'<tr data-member="{e(m["member"])}"><td>{e(m["member"])}</td><td>{e(str(m["partitions"]))}</td>'
                f'<td>{e(m["pin_holder"] or "-")}</td><td>{e(m["pinned_since"] or "-")}</td>'
                f'<td class="num">{m["backlog"]}</td><td class="num">{m["num_ack_pending"]}</td>'
                f'<td class="num">{_age(m["oldest_pending_age_s"])}</td>'
                f'<td>{last_hour_svg(m.get("history") or {}, now)}</td><td>{landed}</td></tr>')
        parts.append("</table>")
    parts.append("</body></html>")
    return "".join(parts)
