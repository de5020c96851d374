"""Landed data as Airflow Assets: the table a landing task writes, and what one run landed.

A landing task declares its table as an outlet Asset (``table_asset``; the operator does it
by itself when the table's location is not templated; when it is, the operator's outlet is the
``AssetAlias`` ``cg_landed_tables`` and each run adds the event to the Asset of the table it
actually rendered) and each successful run attaches to its asset event what it landed
(``landed_extra``), with the NATS servers it went through: per origin stream and partition the
origin sequence range of the messages it committed, the counts, the batch ids. A DAG
scheduled on the Asset reads exactly those rows with ``landed_rows`` (rows keep
``origin_stream``, ``origin_seq`` and ``partition``; a transformation must keep them too).
No secret ever goes into an extra: an Iceberg catalog URI with a password is refused by the
job's contract, and a catalog from a connection is left out.

The range of a partition covers the messages the run committed in it, in stream order; a
message inside it that an earlier path landed (a backfill, a run that crashed after its
commit) has its row once in the table and is included.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.contract import COUNTS
from airflow_provider_cg.core.landing.sinks.options import SinkOptions
from airflow_provider_cg.core.landing.sinks.registry import sink_kind

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
    from airflow.sdk import Asset

__all__ = ["LANDED_TABLES", "landed_rows", "read_table", "table_asset"]

#: the asset event extra's layout version
EXTRA_VERSION = 1
#: the ``AssetAlias`` a landing task whose table is templated names its table through
LANDED_TABLES = "cg_landed_tables"


def table_uri(options: Any) -> str:
    """The Asset URI of a landing table (``SinkOptions``, or a spec carrying them), as its sink
    declares it (``SinkKind.asset_uri``): ``file:///abs/path`` or ``s3://bucket/prefix``
    (Delta, Parquet), ``iceberg://<catalog host or sqlite>/<namespace>/<table>``,
    ``postgres:///<table>``."""
    kind = sink_kind(options.sink)
    return kind.asset_uri(kind.typed(options))


def table_asset_name(options: Any) -> str:
    """The name a landing table's Asset has unless told otherwise, for people: the table's name,
    its format and where it is (``paid_orders (delta, /lake/paid_orders)``, ``lake.orders (iceberg,
    sqlite)``; one name per URI: ``SinkKind.asset_name``)."""
    kind = sink_kind(options.sink)
    return kind.asset_name(kind.typed(options))


def table_asset(name: str | None = None, **location: Any) -> Asset:
    """An Airflow ``Asset`` for the table the sink options ``location`` name (``SinkOptions``'
    fields: ``sink="delta", sink_path=...``), named ``name`` or ``table_asset_name``. A DAG
    scheduled on a landed table names it the same way (this function, or ``Asset`` with the same
    name and URI): Airflow keeps one name per URI among active assets."""
    from airflow.sdk import Asset

    options = SinkOptions.build(location)
    return Asset(name=name or table_asset_name(options), uri=table_uri(options))


def table_assets(**options: Any) -> list:
    """The Assets of the tables sink options name: one, or (``routes``) each route's table;
    none for a PostgreSQL-only landing (its table has no file or catalog URI an engine reads)."""
    out = []
    for _, route in SinkOptions.build(options).tables():
        if sink_kind(route.sink).has_asset:
            out.append(table_asset(**route.given()))
    return out


def server_addresses(servers: Any) -> list[str]:
    """``host:port`` of each NATS server URL (no scheme, no credentials), sorted: the servers
    a landing went through, as the consumer-groups page matches them to a connection."""
    from urllib.parse import urlsplit

    out = set()
    for url in servers or ():
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        out.add(f"{(parts.hostname or 'localhost').lower()}:{parts.port or 4222}")
    return sorted(out)


def landed_extra(spec: Any, summary: dict[str, Any], servers: Any = ()) -> dict[str, Any]:
    """The asset event's extra for one landing run (a ``MemberJobSpec`` and its summary, and
    the NATS servers it went through: ``server_addresses``)."""
    ranges = {str(p): {"first_seq": int(r["first_origin_seq"]), "last_seq": int(r["last_origin_seq"]),
                       "messages": int(r.get("messages", 0))}
              for p, r in sorted((summary.get("partitions") or {}).items(), key=lambda kv: int(kv[0]))}
    extra: dict[str, Any] = {
        "cg_extra_version": EXTRA_VERSION,
        "format": spec.sink,
        "table": table_uri(spec),
        "name": table_asset_name(spec),  # the Asset's, for an event through the AssetAlias
        "stream": spec.stream, "group": spec.group, "member": summary.get("member"),
        "nats_servers": server_addresses(servers),
        # under the key of the origin's life: the rows' origin_stream (the stream, or <stream>#<n>)
        "origin": {summary.get("origin_key") or spec.stream: ranges} if ranges else {},
        **{k: int(summary.get(k) or 0) for k in COUNTS},
        "batch_ids": list(summary.get("batch_ids") or []),
    }
    kind = sink_kind(spec.sink)
    extra.update(kind.asset_extra(kind.typed(spec)))  # where a reader finds the table again
    if spec.backfill:
        extra["window"] = [summary.get("window_start"), summary.get("window_end")]
    return extra


def landed_extras(spec: Any, summary: dict[str, Any], servers: Any = ()) -> list[dict[str, Any]]:
    """The asset event extras of one landing run, one per table it wrote: the table's, or
    (``routes``) each route's with rows written, carrying that route's own counts and ranges."""
    import dataclasses

    if spec.routes is None:
        return [landed_extra(spec, summary, servers)]
    out = []
    for name, options in spec.tables():
        counts = (summary.get("routes") or {}).get(name) or {}
        if not counts.get("rows_written"):
            continue
        table_spec = dataclasses.replace(spec, routes=None, route_by=None,
                                         **{f: getattr(options, f) for f in SinkOptions.__dataclass_fields__
                                            if f not in ("routes", "route_by")})
        extra = landed_extra(table_spec, {**summary, **counts}, servers)
        extra["route"] = name
        out.append(extra)
    return out


def landed_rows(extras: list[dict[str, Any]], columns: list[str] | None = None, *,
                storage_options: dict[str, str] | None = None, iceberg_catalog_uri: str | None = None) -> pa.Table:
    """The rows the runs behind ``extras`` (asset events of one table) landed, as a pyarrow
    table: the table read once (delta-rs, pyiceberg or the Parquet lake's commit log) with
    each event's partitions and origin ranges as the row filter (pushed down to the Parquet
    reader for Delta tables)."""
    import pyarrow.compute as pc

    extras = [e for e in extras if e and e.get("origin")]
    if not extras:
        return None
    first = extras[0]
    if any((e["format"], e["table"]) != (first["format"], first["table"]) for e in extras):
        raise ValueError("landed_rows reads one table at a time: the events name several")
    stream, part, seq = pc.field("origin_stream"), pc.field("partition"), pc.field("origin_seq")
    wanted = None
    for e in extras:
        for origin, ranges in e["origin"].items():
            for p, r in ranges.items():
                hit = ((stream == origin) & (part == int(p))
                       & (seq >= r["first_seq"]) & (seq <= r["last_seq"]))
                wanted = hit if wanted is None else wanted | hit
    table = _read_table(first, storage_options, iceberg_catalog_uri, wanted)
    out = table.filter(wanted).sort_by([("origin_stream", "ascending"), ("origin_seq", "ascending")])
    return out.select(columns) if columns else out


def read_table(fmt: str, *, sink_path: str | None = None, iceberg_table: str | None = None,
               iceberg_catalog_uri: str | None = None, storage_options: dict[str, str] | None = None,
               columns: list[str] | None = None, row_filter: pc.Expression | None = None) -> pa.Table:
    """A landed table as a reader without Spark sees it (``SinkKind.read_table``: delta-rs's
    file list read by pyarrow, pyiceberg, the Parquet lake's commit log); ``s3://`` locations
    with ``AWS_*`` settings. ``row_filter`` (a pyarrow expression) is pushed down to the Delta
    table's Parquet files; the other formats return every row."""
    try:
        kind = sink_kind(fmt)
    except ConfigError:
        raise ValueError(f"cannot read a {fmt!r} table") from None
    return kind.read_table(sink_path=sink_path, iceberg_table=iceberg_table, iceberg_catalog_uri=iceberg_catalog_uri,
                           storage_options=storage_options, columns=columns, row_filter=row_filter)


def _read_table(extra: dict[str, Any], storage_options: dict[str, str] | None, catalog_uri: str | None,
                row_filter: pc.Expression | None = None) -> pa.Table:
    return read_table(extra["format"], sink_path=extra.get("sink_path"), iceberg_table=extra.get("iceberg_table"),
                      iceberg_catalog_uri=catalog_uri or extra.get("iceberg_catalog_uri"),
                      storage_options=storage_options, row_filter=row_filter)
