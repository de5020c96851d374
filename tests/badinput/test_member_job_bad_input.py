"""Bad input to the member job (its own process, against a real nats-server and PostgreSQL):
exit 1 naming the argument for invalid input, exit 2 for the server or the sink's database,
one line, no traceback, no secret, and nothing created (no lake directory, no consumer, no pin)."""

from __future__ import annotations

import pytest

from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
from airflow_provider_cg.core.tools.server import free_port
from tests.support.badinput import member_job, report, snapshot

pytestmark = [pytest.mark.integration]

SECRET = "pg-pa55-s3cret-value"


async def test_bad_member_job_arguments(nc, nats_server, tmp_path):
    await nc.jetstream().add_stream(name="ORDERS", subjects=["orders.*"])
    await ConsumerGroups(nc).create("ORDERS", "g", ElasticGroupConfig(
        2, (PartitioningFilter("orders.*", (1,)),), members=("m1",)))
    afile = tmp_path / "a-file"
    afile.write_text("x")
    lake = tmp_path / "lake"
    env = {"CG_NATS_SERVERS": nats_server.url}
    base = ["--stream", "ORDERS", "--group", "g", "--member", "m1", "--sink-path", str(lake)]

    def with_(**over):
        argv = list(base)
        for k, v in over.items():
            flag = "--" + k.replace("_", "-")
            if flag in argv:
                i = argv.index(flag)
                if v is None:
                    del argv[i:i + 2]
                else:
                    argv[i + 1] = v
            elif v is not None:
                argv += [flag, v]
        return argv

    cases = [  # (argv, env extra, exit, field)
        (with_(batch_size="-1"), {}, 1, "--batch-size"),
        (with_(batch_size="0"), {}, 1, "--batch-size"),
        (with_(batch_size="1.5"), {}, 1, "--batch-size"),
        (with_(max_messages="0"), {}, 1, "--max-messages"),
        (with_(standby_timeout="nan"), {}, 1, "--standby-timeout"),
        (with_(standby_timeout="inf"), {}, 1, "--standby-timeout"),
        (with_(ack_wait="-5"), {}, 1, "--ack-wait"),
        (with_(idle_timeout="x"), {}, 1, "--idle-timeout"),
        (with_(max_deliver="1"), {}, 1, "--max-deliver"),
        (with_(read="sometimes"), {}, 1, "--read"),
        (with_(sink="s3"), {}, 1, "--sink"),
        (with_(payload_format="xml"), {}, 1, "--payload-format"),
        (with_(payload_format="json"), {}, 1, "--json-schema"),
        (with_(payload_format="avro"), {}, 1, "--avro-schema"),
        (with_(payload_format="avro", avro_schema="{not json"), {}, 1, "--avro-schema"),
        (with_(payload_format="avro", avro_schema='{"type": "string"}'), {}, 1, "--avro-schema"),
        (with_(payload_format="avro", avro_schema='{"type": "record", "name": "R", "fields": []}'), {}, 1,
         "--avro-schema"),
        (with_(payload_format="avro", avro_schema='{"type": "record", "name": "R", "fields": [{"name": "a"}]}'),
         {}, 1, "--avro-schema"),
        (with_(payload_format="avro", avro_schema='{"type": "record", "name": "R", "fields": '
                                                  '[{"name": "a", "type": "long"}]}'), {}, 1, "--payload-format"),
        (with_(bogus="1"), {}, 1, "unrecognized arguments"),
        (with_(member=None), {}, 1, "--member"),
        (with_(stream="a b"), {}, 1, "--stream"),
        (with_(group="a.b"), {}, 1, "--group"),
        (with_(member="*"), {}, 1, "--member"),
        (with_(sink_path=str(afile)), {}, 1, "--sink-path"),
        (with_(sink_path=None), {}, 1, "--sink-path"),
        (with_(sink="delta", iceberg_table="ns.t"), {}, 1, "--iceberg-table"),
        (with_(sink="delta", partition_by="day(ts)"), {}, 1, "--partition-by"),
        (with_(sink="postgres", sink_path=None, pg_table="t" * 64), {}, 1, "--pg-table"),
        (with_(sink="postgres", sink_path=None, pg_table="cg_prepared_writes"), {}, 1, "--pg-table"),
        (with_(sink="postgres", sink_path=None, pg_table=""), {}, 1, "--pg-table"),
        (with_(sink="postgres", sink_path=None, pg_table="a;drop"), {}, 1, "--pg-table"),
        (with_(backfill_start="2026-01-01T00:00:00Z"), {}, 1, "--backfill-end"),
        (with_(member=None, backfill_start="yesterday", backfill_end="2026-01-01T00:00:00Z"), {}, 1,
         "--backfill-start"),
        (with_(member=None, backfill_start="2026-01-02T00:00:00Z", backfill_end="2026-01-01T00:00:00Z"), {}, 1,
         "--backfill-end"),
        (with_(sink="postgres", sink_path=None, pg_table="cg_committed_inputs"), {}, 1, "--pg-table"),
        (with_(bad_records="skip"), {}, 1, "--bad-records"),
        (with_(sink_path=None, routes="{not json"), {}, 1, "--routes"),
        (with_(sink_path=None, routes='["a"]'), {}, 1, "--routes"),
        (with_(routes=f'{{"a": {{"sink_path": "{lake}/a", "subjects": "x"}}}}'), {}, 1, "--sink-path"),
        (with_(sink_path=None, routes=f'{{"a": {{"sink_path": "{lake}/a"}}}}'), {}, 1, "routes.a.subjects"),
        (with_(sink_path=None, routes=f'{{"a": {{"sink_path": "{afile}", "subjects": "x"}}}}'), {}, 1,
         "routes.a.sink_path"),
        (with_(sink_path=None, routes=f'{{"a": {{"sink_path": "{lake}/a", "subjects": "x", "sink": "postgres"}}}}'),
         {}, 1, "routes.a.sink_path"),
        (with_(sink_path=None, routes='{"a": {"pg_table": "t", "sink": "postgres", "subjects": "x"}}'), {}, 1,
         "routes.a.CG_PG_DSN"),
        (with_(sink_path=None, route_by="t"), {}, 1, "--route-by"),
        (with_(group="nope"), {}, 1, "group"),
        (with_(stream="NOPE"), {}, 1, "group"),
        (with_(member="m7"), {}, 1, "--member"),
        (with_(sink="postgres", sink_path=None), {}, 1, "CG_PG_DSN"),
        (with_(sink="postgres", sink_path=None), {"CG_PG_DSN_FILE": "/nonexistent"}, 1, "CG_PG_DSN_FILE"),
        (base, {"CG_NATS_TLS_CA": "/nonexistent"}, 1, "CG_NATS_TLS_CA"),
        (base, {"CG_NATS_CONFIG_FILE": str(afile)}, 1, "CG_NATS_CONFIG_FILE"),
        (base, {"CG_NATS_SERVERS": f"nats://127.0.0.1:{free_port()}"}, 2, "cannot reach NATS"),
        (with_(sink="postgres", sink_path=None), {"CG_PG_DSN": f"postgresql://u:{SECRET}@127.0.0.1:{free_port()}/db"}, 2,
         "postgres connect failed"),
    ]
    failures = []
    before = await snapshot(nc)
    for argv, extra, code, field in cases:
        a = member_job(*argv, env={**env, **extra})
        failures += [f"{argv[6:]} {extra}: {p}: {a.err.strip()[:200]!r}"
                     for p in a.problems(code, field, (SECRET,), prog="cg_member_job")]
        if lake.exists():
            failures.append(f"{argv[6:]} {extra}: created the lake directory")
            import shutil

            shutil.rmtree(lake)
    if await snapshot(nc) != before:
        failures.append("the server's state changed (a consumer or a pin was created)")
    report(failures)
