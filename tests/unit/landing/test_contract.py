"""The member job's contract (core/landing/contract.py): every option survives spec -> argv ->
spec, text converts as the job and the operator both read it, and every rule names its field."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing import contract
from airflow_provider_cg.core.landing.contract import MemberJobSpec
from airflow_provider_cg.core.landing.fields import flag

AVRO = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]})

#: a value other than the default for every option (two specs: a live run and a backfill)
LIVE = {
    "stream": "ORDERS", "group": "g-1", "member": "m_1", "batch_size": 7, "max_messages": 11, "max_bytes": 1 << 20,
    "max_seconds": 2.5, "standby_timeout": 3.0, "ack_wait": 4.5, "max_ack_pending": 1, "max_deliver": 9, "idle_timeout": 0.25,
    "progress_interval": 1.0, "read": "consumer", "sink": "postgres", "pg_table": "orders_t", "merge_keys": "order_id",
    "delete_when": "op = 'd'",
    "payload_format": "avro", "json_schema": "id BIGINT", "avro_schema": AVRO, "transform": "pkg.mod:fn",
    "no_spark": False, "summary_file": "/tmp/s.json",
}
BACKFILL = {
    "stream": "ORDERS", "group": "g", "backfill_start": "2026-01-01T00:00:00+00:00",
    "backfill_end": "2026-01-02T00:00:00+00:00", "sink_path": "/lake", "payload_format": "text",
    "transform_sql": "SELECT * FROM batch WHERE partition = 1", "no_spark": False,
}


def test_every_option_round_trips_through_argv():
    covered = set()
    iceberg = {"stream": "S", "group": "g", "member": "m", "sink": "iceberg", "iceberg_table": "lake.orders",
               "iceberg_catalog_uri": "sqlite:////tmp/c.db", "iceberg_warehouse": "s3://bucket/warehouse",
               "iceberg_catalog_name": "lakehouse", "partition_by": "day(ts), bucket(16, id)",
               "target_file_size": 134217728, "join": True, "batch_bytes": 8_000_000}
    routed = {"stream": "S", "group": "g", "member": "m", "sink": "delta", "route_by": "table",
              "routes": {"paid": {"sink_path": "/lake/paid", "merge_keys": "id"},
                         "refunds": {"sink": "iceberg", "iceberg_table": "lake.refunds",
                                     "iceberg_catalog_uri": "sqlite:////tmp/c.db"}},
              "bad_records": "fail", "transform_sql": "SELECT *, 'paid' AS table FROM batch",
              "follow": "1h30m", "commit_interval": 0.25, "table_commit_interval": 2.0, "handover_wait": 90.0}
    for values in (LIVE, BACKFILL, {"stream": "S", "group": "g", "member": "m", "sink_path": "/l", "no_spark": True,
                                    "payload_format": "text", "stream_life": "new:2026-11-26T12:00:00.5Z"}, iceberg,
                   routed):
        spec = MemberJobSpec.build(values)
        again = MemberJobSpec.from_argv(spec.to_argv())
        assert again == spec, spec.to_argv()
        covered |= {k for k, v in values.items() if v != MemberJobSpec.__dataclass_fields__[k].default}
    assert covered == set(MemberJobSpec.__dataclass_fields__), "an option is not covered by the round trip"


def test_defaults_are_written_nowhere_else_and_left_out_of_argv():
    spec = MemberJobSpec.build({"stream": "S", "group": "g", "member": "m", "sink_path": "/l"})
    assert spec.to_argv() == ["--stream", "S", "--group", "g", "--member", "m", "--sink-path", "/l"]
    assert (spec.batch_size, spec.max_deliver, spec.standby_timeout, spec.idle_timeout) == (100_000, 5, 30.0, 2.0)
    assert spec.consumer_ack_wait(elastic=True) == contract.ELASTIC_ACK_WAIT
    assert spec.consumer_ack_wait(elastic=False) == contract.STATIC_ACK_WAIT
    assert MemberJobSpec.build({**LIVE}).consumer_ack_wait(elastic=True) == 4.5


def test_rendered_text_converts_like_argv():
    spec = MemberJobSpec.build({"stream": "S", "group": "g", "member": "m", "sink_path": "/l", "batch_size": " 500",
                                "max_seconds": "1.5", "ack_wait": "2", "no_spark": "true"})
    assert (spec.batch_size, spec.max_seconds, spec.ack_wait, spec.no_spark) == (500, 1.5, 2.0, True)
    argv = spec.to_argv()
    assert argv[argv.index("--batch-size") + 1] == "500" and argv[argv.index("--ack-wait") + 1] == "2"


BASE = {"stream": "S", "group": "g", "member": "m", "sink_path": "/lake"}
#: (values over BASE, the field the error names); shared with the operator test below
BAD = [
    ({"batch_size": "0"}, "batch_size"), ({"batch_size": "-1"}, "batch_size"), ({"batch_size": "1.5"}, "batch_size"),
    ({"batch_size": True}, "batch_size"), ({"max_messages": "0"}, "max_messages"), ({"max_bytes": "x"}, "max_bytes"),
    ({"max_seconds": "nan"}, "max_seconds"), ({"standby_timeout": "inf"}, "standby_timeout"),
    ({"ack_wait": "-5"}, "ack_wait"), ({"idle_timeout": "x"}, "idle_timeout"), ({"max_deliver": "1"}, "max_deliver"),
    ({"progress_interval": "0"}, "progress_interval"), ({"read": "sometimes"}, "read"), ({"sink": "s3"}, "sink"),
    ({"payload_format": "xml"}, "payload_format"), ({"payload_format": "json"}, "json_schema"),
    ({"payload_format": "avro"}, "avro_schema"), ({"payload_format": "avro", "avro_schema": "{not json"}, "avro_schema"),
    ({"payload_format": "avro", "avro_schema": '{"type": "string"}'}, "avro_schema"),
    ({"member": None}, "member"), ({"stream": "a b"}, "stream"), ({"group": "a.b"}, "group"), ({"member": "*"}, "member"),
    ({"sink_path": None}, "sink_path"), ({"sink": "postgres", "sink_path": None, "pg_table": "t" * 64}, "pg_table"),
    ({"sink": "postgres", "sink_path": None, "pg_table": "a;drop"}, "pg_table"), ({"sink": "postgres", "sink_path": None, "pg_table": ""}, "pg_table"),
    *[({"sink": "postgres", "sink_path": None, "pg_table": t}, "pg_table") for t in ("cg_prepared_writes", "cg_committed_writes",
                                                                    "cg_partition_fences", "cg_committed_inputs")],
    ({"sink": "delta", "sink_path": None}, "sink_path"), ({"sink": "delta", "sink_path": "s3://"}, "sink_path"),
    ({"sink": "delta", "sink_path": "s3://key:secret@bucket/t"}, "sink_path"),
    ({"stream_life": "yes"}, "stream_life"),
    ({"stream_life": "new:"}, "stream_life"),
    ({"sink": "delta", "sink_path": "gs://bucket/t"}, "sink_path"), ({"sink_path": "s3://bucket/t"}, "sink_path"),
    ({"sink": "iceberg", "sink_path": None}, "iceberg_table"), ({"sink": "iceberg", "sink_path": None, "iceberg_table": "orders"}, "iceberg_table"),
    ({"sink": "iceberg", "sink_path": None, "iceberg_table": "a.b.c"}, "iceberg_table"),
    ({"sink": "iceberg", "sink_path": None, "iceberg_table": "l.o", "iceberg_catalog_uri": "mysql://h/db"}, "iceberg_catalog_uri"),
    ({"sink": "iceberg", "sink_path": None, "iceberg_table": "l.o", "iceberg_catalog_uri": "postgresql://u:pw@h/db"},
     "iceberg_catalog_uri"),
    ({"sink": "iceberg", "sink_path": None, "iceberg_table": "l.o", "iceberg_warehouse": "ftp://x/y"}, "iceberg_warehouse"),
    ({"sink": "iceberg", "sink_path": None, "iceberg_table": "l.o", "iceberg_catalog_uri": "https://id:secret@cat/v1"},
     "iceberg_catalog_uri"),
    ({"sink": "iceberg", "sink_path": None, "iceberg_table": "l.o", "iceberg_catalog_uri": "http:///x"},
     "iceberg_catalog_uri"),
    ({"sink": "iceberg", "sink_path": None, "iceberg_table": "l.o", "iceberg_catalog_name": "a b"},
     "iceberg_catalog_name"),
    # an option of another sink is refused, naming it (not ignored)
    ({"sink": "delta", "iceberg_table": "ns.t"}, "iceberg_table"), ({"pg_table": "t"}, "pg_table"),
    ({"sink": "delta", "iceberg_catalog_name": "x"}, "iceberg_catalog_name"),
    ({"sink": "postgres", "sink_path": "/lake"}, "sink_path"), ({"partition_by": "region"}, "partition_by"),
    # partitioning
    ({"sink": "delta", "partition_by": ""}, "partition_by"), ({"sink": "delta", "partition_by": "day(ts)"}, "partition_by"),
    ({"sink": "delta", "partition_by": "a,,b"}, "partition_by"), ({"sink": "delta", "partition_by": "a, a"}, "partition_by"),
    ({"sink": "delta", "partition_by": "a-b"}, "partition_by"),
    *[({"sink": "iceberg", "sink_path": None, "iceberg_table": "l.o", "partition_by": p}, "partition_by")
      for p in ("bucket(id)", "bucket(0, id)", "day(3, ts)", "week(ts)", "day(ts", "truncate(x, n)", "day(ts), day(ts)")],
    ({"transform": "not a spec"}, "transform"), ({"transform": "m:f", "transform_sql": "SELECT 1"}, "transform"),
    ({"transform_sql": "  "}, "transform_sql"),
    ({"backfill_start": "2026-01-01T00:00:00Z"}, "backfill_end"), ({"backfill_end": "2026-01-01T00:00:00Z"}, "backfill_start"),
    ({"backfill_start": "yesterday", "backfill_end": "2026-01-01T00:00:00Z"}, "backfill_start"),
    ({"backfill_start": "2026-01-02T00:00:00Z", "backfill_end": "2026-01-01T00:00:00Z"}, "backfill_end"),
    ({"backfill_start": "2026-01-01T00:00:00Z", "backfill_end": "2026-01-01T00:00:00Z"}, "backfill_end"),
    ({"bad_records": "skip"}, "bad_records"),
    ({"table_commit_interval": "0"}, "table_commit_interval"), ({"table_commit_interval": "soon"}, "table_commit_interval"),
    ({"route_by": "t"}, "route_by"),
    ({"sink_path": None, "routes": "{x"}, "routes"),
    ({"sink_path": None, "routes": json.dumps({"a": {"sink_path": "/a"}})}, "routes.a.subjects"),
    ({"routes": json.dumps({"a": {"sink_path": "/a", "subjects": "s"}})}, "sink_path"),
    ({"sink_path": None, "routes": json.dumps({"a": {"sink_path": "/a", "subjects": "s", "partition_by": "x"}})},
     "routes.a.partition_by"),
    ({"sink_path": None, "routes": json.dumps({"a": {"sink_path": "/a", "subjects": "s"}, "b": {"sink_path": "/b"}})},
     "routes.b.subjects"),
    ({"sink_path": None, "route_by": "t", "routes": json.dumps({"a": {"sink_path": "/a"}, "b": {"sink_path": "/a/"}})},
     "routes.b"),
]


@pytest.mark.parametrize(("over", "field"), BAD)
def test_the_job_refuses_naming_the_field(over, field):
    argv = []
    for k, v in {**BASE, **over}.items():
        if v is not None:
            argv += [flag(k), str(v).lower() if isinstance(v, bool) else str(v)]
    with pytest.raises(ConfigError) as e:
        MemberJobSpec.from_argv(argv)
    assert e.value.field == field, e.value


def test_no_spark_rules_and_usage_errors():
    for over, field in (({"transform": "m:f"}, "transform"), ({"payload_format": "json", "json_schema": "a INT"},
                                                               "payload_format")):
        with pytest.raises(ConfigError) as e:
            MemberJobSpec.build({**BASE, **over, "no_spark": True})
        assert e.value.field == field
    for argv in (["--bogus", "1"], ["--stream"]):
        with pytest.raises(contract.UsageError):
            MemberJobSpec.from_argv(argv)
    with pytest.raises(ConfigError, match="not an option"):
        MemberJobSpec.build({**BASE, "bogus": 1})


def test_unknown_fields_postpone_only_the_rules_that_read_them():
    MemberJobSpec.check_known({**BASE, "sink": "{{ params.sink }}", "sink_path": None}, {"sink"})
    MemberJobSpec.check_known({**BASE, "batch_size": "{{ params.n }}"}, {"batch_size"})
    with pytest.raises(ConfigError) as e:  # known and wrong: refused at once
        MemberJobSpec.check_known({**BASE, "batch_size": "0", "sink": "{{ x }}"}, {"sink"})
    assert e.value.field == "batch_size"


def test_summary_format_and_failed_summary():
    s = contract.Summary("S", "g", "m", result=contract.RESULT_COMMITTED)
    s.count_partition(3, 10, 20, 5)
    s.count_partition(3, 5, 12, 2)
    d = json.loads(s.to_json())
    assert d["partitions"] == {"3": {"messages": 7, "first_origin_seq": 5, "last_origin_seq": 20}}
    assert set(d) == {f.name for f in dataclasses.fields(contract.Summary)} | {"messages_landed"}
    # messages landed: read, less what was already there, dead-lettered or (backfill) skipped
    s.messages_read, s.duplicates_skipped, s.dead_lettered, s.skipped = 100, 7, 2, 1
    assert json.loads(s.to_json())["messages_landed"] == 90
    failed = contract.Summary.failed(MemberJobSpec.build(BASE), contract.EXIT_INVALID, "transform: boom")
    assert (failed.result, failed.exit_code, failed.error) == ("failed", 1, "transform: boom")
    assert contract.RESULT_FAILED not in contract.SKIP_RESULTS


def test_a_reset_creates_a_static_durable_as_a_default_job_would():
    import inspect

    from airflow_provider_cg.core.groups.reset import GroupReset

    assert inspect.signature(GroupReset).parameters["batch_size"].default == \
        MemberJobSpec.__dataclass_fields__["batch_size"].default


def test_a_backfill_has_no_member_to_add():
    from airflow_provider_cg.core.errors import ConfigError

    with pytest.raises(ConfigError, match="join: a backfill reads the origin"):
        MemberJobSpec.build({**BACKFILL, "join": True})



def test_a_batch_budget_sizes_batches_from_the_payloads_seen():
    from airflow_provider_cg.core.landing.contract import BatchOptions, Summary
    from airflow_provider_cg.core.landing.reads.stop_rule import FIRST_SIZED, StopRule

    summary = Summary("S", "g", "m1")
    rule = StopRule(BatchOptions(stream="S", group="g", member="m1", batch_size=5_000, batch_bytes=100_000,
                                 follow=60.0), summary, time.monotonic())
    assert rule.wanted(5_000) == FIRST_SIZED  # nothing measured yet
    rule.took(1_000, lambda: 500_000)  # 500 B each
    assert rule.wanted(5_000) == 200
    rule.took(200, lambda: 200 * 2_000)  # bigger payloads now: the average moves
    assert rule.wanted(5_000) == 100_000 * 1_200 // 900_000
    rule.took(10)  # planned ranges (payloads read by Spark): the landed figures stand in when none is known
    unbudgeted = StopRule(BatchOptions(stream="S", group="g", member="m1", batch_size=5_000, follow=60.0),
                          summary, time.monotonic())
    assert unbudgeted.wanted(5_000) == 5_000
    unbudgeted.took(5, lambda: pytest.fail("payloads sized without a budget"))  # the read loop pays nothing
    summary.messages_read, summary.bytes = 100, 100 * 4_000
    ranges = StopRule(BatchOptions(stream="S", group="g", member="m1", batch_size=5_000, batch_bytes=100_000,
                                   follow=60.0), summary, time.monotonic())
    ranges.took(10)
    assert ranges.wanted(5_000) == 25
    with pytest.raises(ConfigError, match="batch_bytes"):
        BatchOptions(stream="S", group="g", member="m1", batch_bytes=0)
