"""OpenLineage for the landing operator, when Airflow's OpenLineage provider is installed.

Input: the group's origin stream, ``Dataset(namespace="nats://<host>:<port>", name=<stream>)``
(the first server of the connection, without credentials; OpenLineage has no NATS naming
yet, so this follows its Kafka one: the broker as namespace, the topic as name). Output: the
table, in OpenLineage's naming for its storage: ``file`` + absolute path, ``s3://bucket`` +
key, ``postgres://host:port`` + ``database.schema.table``; an Iceberg table by its location
(as OpenLineage's Spark integration names it), with the catalog's name of it as a symlink of
type TABLE (``SinkKind.catalog_table``); with the rows the run wrote as output statistics and their columns
as the dataset's schema. The provider's
classes are imported here only, when the provider asks for lineage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow_provider_cg.core.landing.sinks.registry import sink_kind

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage


def stream_dataset_name(servers: list[str], stream: str) -> tuple[str, str]:
    """``(namespace, name)`` of an origin stream: ``nats://host:port`` (no credentials; an IPv6
    host in brackets, as in a URL)."""
    url = urlsplit(servers[0] if "://" in servers[0] else f"nats://{servers[0]}")
    host = url.hostname or "localhost"
    return f"nats://{f'[{host}]' if ':' in host else host}:{url.port or 4222}", stream


class MovesNoData:
    """Mixin of the operators that move no data (group administration, the members list, table
    maintenance): their OpenLineage events name no dataset, rather than the "unknown source"
    facet the provider adds for an operator that says nothing."""

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        from airflow.providers.openlineage.extractors import OperatorLineage

        return OperatorLineage()


def table_dataset_name(spec: Any, table_location: tuple[str, str] | None = None) -> tuple[str, str]:
    """``(namespace, name)`` of the table a ``MemberJobSpec`` lands into, as its sink names it
    (``SinkKind.dataset``); ``table_location``: host and database of the connection that
    locates the table (PostgreSQL's)."""
    kind = sink_kind(spec.sink)
    return kind.dataset(kind.typed(spec), table_location)


def operator_lineage(spec: Any, servers: list[str], summary: dict[str, Any] | None,
                     table_location: tuple[str, str] | None = None) -> OperatorLineage:
    """The provider's ``OperatorLineage`` for one landing run. A run that wrote no row (a member
    skipped for want of backlog, or whose messages had all landed before) read the stream and
    landed nothing: its event names the stream and no table (with no dataset at all, the
    provider would fall back to the task's outlet, the table, and the event would read as a
    landing)."""
    from airflow.providers.common.compat.openlineage.facet import (
        Identifier,
        InputDataset,
        OutputDataset,
        OutputStatisticsOutputDatasetFacet,
        SchemaDatasetFacet,
        SchemaDatasetFacetFields,
        SymlinksDatasetFacet,
    )
    from airflow.providers.openlineage.extractors import OperatorLineage

    namespace, name = stream_dataset_name(servers, spec.stream)
    inputs = [InputDataset(namespace=namespace, name=name)]
    if not summary or not summary.get("rows_written"):
        return OperatorLineage(inputs=inputs)
    outputs = []
    for route, options in spec.tables():  # one table, or each route's
        counts = summary if route is None or not summary else (summary.get("routes") or {}).get(route) or {}
        kind = sink_kind(options.sink)
        typed = kind.typed(options)
        out_namespace, out_name = kind.dataset(typed, table_location, counts.get("table_location"))
        output_facets: dict[str, Any] = {}
        if counts and counts.get("rows_written") is not None:
            output_facets["outputStatistics"] = OutputStatisticsOutputDatasetFacet(rowCount=int(counts["rows_written"]))
        facets: dict[str, Any] = {}
        if (catalog := kind.catalog_table(typed, table_location)) is not None:  # the table as its catalog names it
            facets["symlinks"] = SymlinksDatasetFacet(identifiers=[Identifier(*catalog, type="TABLE")])
        if counts.get("columns"):  # the rows' columns as the job wrote them (their Arrow types)
            facets["schema"] = SchemaDatasetFacet(fields=[SchemaDatasetFacetFields(name=name, type=kind)
                                                          for name, kind in counts["columns"]])
        outputs.append(OutputDataset(namespace=out_namespace, name=out_name, facets=facets,
                                     outputFacets=output_facets))
    return OperatorLineage(inputs=inputs, outputs=outputs)
