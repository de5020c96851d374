"""OpenLineage names of the landing operator's input (the stream) and output (the table)."""

from __future__ import annotations

from airflow_provider_cg.core.landing.contract import MemberJobSpec
from airflow_provider_cg.lineage import stream_dataset_name, table_dataset_name

BASE = {"stream": "ORDERS", "group": "g", "member": "m1"}


def test_the_stream_is_named_by_its_first_server_without_credentials():
    assert stream_dataset_name(["nats://lake:s3cr3t@nats-1.example:4223", "nats://nats-2:4222"], "ORDERS") == (
        "nats://nats-1.example:4223", "ORDERS")
    assert stream_dataset_name(["tls://nats-1"], "O") == ("nats://nats-1:4222", "O")
    # an IPv6 server keeps its brackets, as in a URL
    assert stream_dataset_name(["nats://[::1]:4443"], "O") == ("nats://[::1]:4443", "O")
    assert stream_dataset_name(["tls://u:p@[fd00::7]"], "O") == ("nats://[fd00::7]:4222", "O")


def test_tables_are_named_as_openlineage_names_their_storage():
    def name(**values):
        return table_dataset_name(MemberJobSpec.build({**BASE, **values}))

    assert name(sink="delta", sink_path="/lake/paid_orders") == ("file", "/lake/paid_orders")
    assert name(sink="delta", sink_path="s3://bucket/wh/paid_orders") == ("s3://bucket", "wh/paid_orders")
    assert name(sink="parquet", sink_path="/lake/raw") == ("file", "/lake/raw")
    # OpenLineage names a file by its plain path: the Asset URI's quoting stays out of the name
    assert name(sink="parquet", sink_path="/lake/paid orders pq") == ("file", "/lake/paid orders pq")
    assert name(sink="delta", sink_path="s3://bucket/wh/paid orders") == ("s3://bucket", "wh/paid orders")
    # an Iceberg table that wrote nothing yet: by its catalog's name of it
    assert name(sink="iceberg", iceberg_table="lake.paid_orders", iceberg_catalog_uri="sqlite:////tmp/c.db") == (
        "sqlite:////tmp/c.db", "default.lake.paid_orders")
    pg = table_dataset_name(MemberJobSpec.build({**BASE, "sink": "postgres", "pg_table": "landed"}),
                            ("db.example:5432", "lake"))
    assert pg == ("postgres://db.example:5432", "lake.public.landed")


def test_a_landing_names_its_table_with_the_rows_and_columns_it_wrote_and_no_table_without_rows(airflow_env):
    from airflow_provider_cg.lineage import operator_lineage

    spec = MemberJobSpec.build({**BASE, "sink": "delta", "sink_path": "/lake/t"})
    wrote = operator_lineage(spec, ["nats://127.0.0.1:4222"], {"rows_written": 3, "columns": [["id", "int64"]]})
    (out,) = wrote.outputs
    assert (out.namespace, out.name, out.outputFacets["outputStatistics"].rowCount) == ("file", "/lake/t", 3)
    assert [(f.name, f.type) for f in out.facets["schema"].fields] == [("id", "int64")]
    for summary in (None, {"rows_written": 0, "result": "committed"}):  # skipped, or nothing written
        nothing = operator_lineage(spec, ["nats://127.0.0.1:4222"], summary)
        assert [(i.namespace, i.name) for i in nothing.inputs] == [("nats://127.0.0.1:4222", "ORDERS")]
        assert nothing.outputs == []


def test_an_iceberg_table_is_named_by_its_location_with_its_catalogs_name_as_a_symlink(airflow_env):
    """As OpenLineage's Spark integration names Iceberg tables: the dataset is the table's
    location, the catalog's identifier a symlink of type TABLE. Two SQL catalogs (two databases,
    or two catalog names in one) with tables of the same name never meet."""
    from airflow_provider_cg.core.landing.sinks.registry import sink_kind
    from airflow_provider_cg.lineage import operator_lineage

    iceberg = sink_kind("iceberg")

    def spec(**values):
        return MemberJobSpec.build({**BASE, "sink": "iceberg", "iceberg_table": "lake.orders", **values})

    one, two = spec(iceberg_catalog_uri="sqlite:////a/c.db"), spec(iceberg_catalog_uri="sqlite:////b/c.db")
    named = spec(iceberg_catalog_uri="sqlite:////a/c.db", iceberg_catalog_name="finance")
    assert len({iceberg.catalog_table(s) for s in (one, two, named)}) == 3
    assert iceberg.catalog_table(named) == ("sqlite:////a/c.db", "finance.lake.orders")
    # a REST catalog is its endpoint, and the table its identifier there
    assert iceberg.catalog_table(spec(iceberg_catalog_uri="https://cat.example/api/catalog/")) == (
        "https://cat.example/api/catalog", "lake.orders")
    # a PostgreSQL catalog from a connection (host and database), a REST one from its URL
    assert iceberg.catalog_table(spec(), ("db.example:5432", "lake")) == (
        "postgresql://db.example:5432/lake", "default.lake.orders")
    assert iceberg.catalog_table(spec(), ("https://cat.example/api", "")) == ("https://cat.example/api", "lake.orders")
    # never credentials
    assert iceberg.catalog_table(spec(iceberg_catalog_uri="postgresql://lake@db:5432/cat"))[0] == (
        "postgresql://db:5432/cat")

    wrote = {"rows_written": 2, "table_location": "file:///wh/lake.db/my%20orders", "columns": [["id", "int64"]]}
    (out,) = operator_lineage(one, ["nats://127.0.0.1:4222"], wrote).outputs
    assert (out.namespace, out.name) == ("file", "/wh/lake.db/my orders")
    assert [(i.namespace, i.name, i.type) for i in out.facets["symlinks"].identifiers] == [
        ("sqlite:////a/c.db", "default.lake.orders", "TABLE")]
    on_s3 = {"rows_written": 2, "table_location": "s3://lake/wh/lake.db/orders"}
    (out,) = operator_lineage(two, ["nats://127.0.0.1:4222"], on_s3).outputs
    assert (out.namespace, out.name) == ("s3://lake", "wh/lake.db/orders")
    # a routed landing: each route's table by its own location
    routed = MemberJobSpec.build({**BASE, "sink": "iceberg", "iceberg_catalog_uri": "sqlite:////a/c.db",
                                  "routes": {"a": {"iceberg_table": "lake.a"}, "b": {"iceberg_table": "lake.b"}},
                                  "route_by": "r"})
    summary = {"rows_written": 4, "routes": {"a": {"rows_written": 1, "table_location": "file:///wh/lake.db/a"},
                                             "b": {"rows_written": 3, "table_location": "file:///wh/lake.db/b"}}}
    outs = operator_lineage(routed, ["nats://127.0.0.1:4222"], summary).outputs
    assert sorted((o.name, o.facets["symlinks"].identifiers[0].name) for o in outs) == [
        ("/wh/lake.db/a", "default.lake.a"), ("/wh/lake.db/b", "default.lake.b")]
