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
    assert name(sink="iceberg", iceberg_table="lake.paid_orders", iceberg_catalog_uri="sqlite:////tmp/c.db") == (
        "iceberg://sqlite", "lake.paid_orders")
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
