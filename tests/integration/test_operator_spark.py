"""ConsumerGroupSparkSubmitOperator against a real nats-server (with user/password auth) and
real spark-submit (local mode). A PATH shim in front of the venv's spark-submit records
every invocation's argv, so the tests see whether Spark started and what its command line
held."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path

import pytest

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings
from airflow_provider_cg.core.tools.server import EmbeddedNatsServer
from tests.integration.test_groups import Puller
from tests.integration.test_operators_groups import NatsThread

pytest_plugins = ["tests.airflow_conftest"]
pytestmark = [pytest.mark.airflow, pytest.mark.integration]

USER = "cg-user"
PASSWORD = "pw-MARKER-7f3a9c1e55"  # must never show up in a command line, log or XCom
STREAM, GROUP = "ORDERS", "lake"


@pytest.fixture
def auth_server(tmp_path):
    server = EmbeddedNatsServer(
        tmp_path / "nats", config_extra=f'authorization {{ user: "{USER}", password: "{PASSWORD}" }}'
    ).start()
    yield server
    server.cleanup()


@pytest.fixture
def nats(auth_server):
    t = NatsThread(NatsConnectionSettings(servers=[auth_server.url], user=USER, password=PASSWORD))
    t.run(t.api.add_stream({"name": STREAM, "subjects": ["orders.>"], "storage": "file"}))
    cfg = ElasticGroupConfig(2, (PartitioningFilter("orders.*", (1,)),), 0, 0, ("m1",), ())
    t.run(t.cg.create(STREAM, GROUP, cfg.validate()))
    yield t
    t.run(t.nc.close())
    t.loop.call_soon_threadsafe(t.loop.stop)


@pytest.fixture
def shim(airflow_env, auth_server, tmp_path, monkeypatch):
    """spark-submit shim (records argv, then runs the venv's), spark_test = local[2], nats_auth."""
    bindir = tmp_path / "shim"
    bindir.mkdir()
    calls = tmp_path / "spark-submit.calls"
    real = Path(sys.executable).parent / "spark-submit"
    script = bindir / "spark-submit"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{calls}"\nexec "{real}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
    airflow_env.add_connection("spark_test", "spark", host="local[2]")
    airflow_env.add_connection("nats_auth", "nats", host="127.0.0.1", port=auth_server.port,
                               login=USER, password=PASSWORD)
    return calls


def _dag(dag_id: str, **op_kwargs):
    from airflow.sdk import DAG

    from airflow_provider_cg.operators.spark import ConsumerGroupSparkSubmitOperator

    conn = op_kwargs.pop("nats_conn_id_override", "nats_auth")
    with DAG(dag_id, schedule=None, params=op_kwargs.pop("params", None)) as dag:
        ConsumerGroupSparkSubmitOperator(
            task_id="consume", stream=STREAM, group=GROUP, member="m1", nats_conn_id=conn,
            conn_id="spark_test", idle_timeout=1.0, **op_kwargs,
        )
    return dag


def _all_xcoms_and_rendered(dag_id: str) -> str:
    from airflow.models.renderedtifields import RenderedTaskInstanceFields as RTIF
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as s:
        xcoms = [XComModel.deserialize_value(r) for r in s.scalars(select(XComModel).where(XComModel.dag_id == dag_id))]
        rendered = [r.rendered_fields for r in s.scalars(select(RTIF).where(RTIF.dag_id == dag_id))]
    return json.dumps([xcoms, rendered], default=str)


def _asset_events(uri: str) -> list[dict]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as s:
        rows = s.scalars(select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                         .where(AssetModel.uri == uri)).all()
        return [dict(r.extra or {}) for r in rows]


def _xcom_keys(dag_id: str, task_id: str) -> list[str]:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as s:
        return sorted(r.key for r in s.scalars(
            select(XComModel).where(XComModel.dag_id == dag_id, XComModel.task_id == task_id)))


def _logs(home: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in (home / "logs").rglob("*") if p.is_file())


@pytest.mark.spark
def test_summary_to_xcom_and_no_secret_anywhere(airflow_env, nats, shim, tmp_path, capfd, caplog, monkeypatch):
    from tests.support.listeners import ListenerWatch

    nats.publish([f"orders.c{i % 13}" for i in range(500)])
    lake = tmp_path / "lake"
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)  # the operator's own default is under test
    with ListenerWatch() as watch:  # the table from a param: the operator's outlet is the alias
        result = airflow_env.run_dag(_dag("cg_spark_summary", sink_path="{{ params.lake }}",
                                          params={"lake": str(lake)}))
    # local mode: the driver and its block manager listen on loopback only
    assert watch.found, "no listener of the run's processes was seen"
    assert not watch.outside_loopback(), watch.found

    assert result.state_of("consume") == "success"
    summary = result.xcom("consume")
    assert summary["result"] == "committed" and summary["rows_written"] == 500
    assert sum(p["messages"] for p in summary["partitions"].values()) == 500
    from airflow_provider_cg.core.landing.rows import ROW_SCHEMA
    from airflow_provider_cg.core.landing.sinks import read_committed

    assert [name for name, _ in summary["columns"]] == ROW_SCHEMA.names  # rows as read: the lineage schema

    assert read_committed(lake).num_rows == 500
    assert _xcom_keys("cg_spark_summary", "consume") == ["return_value"]  # one XCom: the summary
    # its asset event is on the table the run rendered (through the AssetAlias), saying what landed
    (event,) = _asset_events(f"file://{lake}")
    assert event["member"] == "m1" and event["messages_landed"] == 500 and event["nats_servers"], event

    argv = shim.read_text()
    assert "--stream ORDERS --group lake --member m1" in argv  # the shim saw the real submit
    out = capfd.readouterr()
    logged = out.out + out.err + caplog.text + _logs(airflow_env.home)
    assert "Spark-Submit cmd" in logged and "CG_SUMMARY" in logged  # the hook's log was captured
    for where, text in (("command line", argv), ("task log", logged),
                        ("XCom / rendered fields", _all_xcoms_and_rendered("cg_spark_summary"))):
        assert PASSWORD not in text, f"the NATS password leaked into the {where}"
    # settings travel as env only (the redaction pattern names CG_NATS_, no setting does)
    assert not re.search(r"CG_NATS_\w+=", argv) and "appMasterEnv" not in argv
    assert "spark.redaction.regex=" in argv
    # quiet and private by default: no driver UI, Spark's INFO lines out of the task log (the
    # job's own lines stay), and the logged command readable where it holds no secret
    assert "spark.ui.enabled=false" in argv and "spark.log.level=WARN" in argv
    assert "spark.driver.bindAddress=127.0.0.1" in argv and "spark.driver.host=127.0.0.1" in argv
    spark_info = [line for line in logged.splitlines() if re.search(r"\d\d:\d\d:\d\d INFO \w+:", line)]
    # only the three lines Spark writes before the context applies spark.log.level (~100 before)
    assert len(spark_info) <= 3 and all("INFO SparkContext:" in line for line in spark_info), spark_info
    assert "cg pinned member=m1" in logged
    (cmd,) = [line for line in logged.splitlines() if "Spark-Submit cmd" in line][:1]
    assert "******" not in cmd and "--py-files" in cmd, cmd


@pytest.fixture
def openlineage_events(tmp_path, monkeypatch):
    """Airflow's OpenLineage provider on, writing its events to a file: ``read()`` -> events."""
    from airflow.providers.openlineage import conf
    from airflow.providers.openlineage.plugins.listener import get_openlineage_listener

    path = tmp_path / "openlineage.jsonl"
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT",
                       json.dumps({"type": "file", "log_file_path": str(path), "append": True}))
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__NAMESPACE", "cg-tests")

    def reset():
        for name in dir(conf):
            getattr(getattr(conf, name), "cache_clear", lambda: None)()
        get_openlineage_listener().adapter._client = None

    reset()
    # the provider's plugin registers its listener when Airflow loads plugins, if OpenLineage is
    # configured then; this session started without it, so register the same listener now
    from airflow.sdk.listener import get_listener_manager

    listeners = get_listener_manager()
    listener = get_openlineage_listener()
    added = not listeners.pm.is_registered(listener)
    listeners.add_listener(listener)

    def read() -> list[dict]:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []

    yield read
    if added:
        listeners.pm.unregister(listener)
    monkeypatch.undo()
    reset()


@pytest.mark.spark
def test_delta_on_object_storage_with_keys_from_an_aws_connection(airflow_env, nats, shim, tmp_path, capfd, caplog,
                                                                    minio_server, s3_bucket, monkeypatch,
                                                                    openlineage_events, auth_server):
    """sink="delta" into s3:// with aws_conn_id: the keys come from the Airflow connection only
    (none in this process's environment), reach the driver and the Spark tasks that write the
    transformed batch's files, and show up in no command line, log, XCom or rendered field."""
    from tests.support.member_job import read_delta

    for name in minio_server.env():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO", "true")
    airflow_env.add_connection("lake_s3", "aws", login=minio_server.user, password=minio_server.password,
                               extra={"endpoint_url": minio_server.endpoint, "region_name": "us-east-1"})
    try:
        nats.publish([f"orders.c{i % 13}" for i in range(300)])
        table = f"s3://{s3_bucket}/orders"
        sql = "SELECT origin_stream, origin_seq, key, partition, payload_text FROM batch"
        result = airflow_env.run_dag(_dag("cg_spark_delta_s3", sink="delta", sink_path=table, aws_conn_id="lake_s3",
                                          transform_sql=sql))
    finally:
        airflow_env.remove_connection("lake_s3")
    assert result.state_of("consume") == "success"
    assert result.xcom("consume")["rows_written"] == 300
    from airflow_provider_cg.core.landing.sinks.delta.writer import delta_storage_options
    from airflow_provider_cg.core.landing.sinks.lake.storage import ObjectStoreSettings

    opts = delta_storage_options(ObjectStoreSettings.from_env(minio_server.env()))
    seqs = sorted(read_delta(table, ["origin_seq"], opts).column("origin_seq").to_pylist())
    assert seqs == list(range(1, 301))
    argv = shim.read_text()
    out = capfd.readouterr()
    logged = out.out + out.err + caplog.text + _logs(airflow_env.home)
    assert "--sink delta" in argv and "Spark-Submit cmd" in logged
    for where, text in (("command line", argv), ("task log", logged),
                        ("XCom / rendered fields", _all_xcoms_and_rendered("cg_spark_delta_s3"))):
        assert minio_server.password not in text, f"the object store's secret key leaked into the {where}"
    assert "AWS_SECRET_ACCESS_KEY=" not in argv

    # Lineage (Airflow's OpenLineage provider, its real listener): the stream in, the table out.
    complete = [e for e in openlineage_events() if e["eventType"] == "COMPLETE"
                and e["job"]["name"].endswith("cg_spark_delta_s3.consume")]
    assert complete, openlineage_events()
    (event,) = complete
    assert [(d["namespace"], d["name"]) for d in event["inputs"]] == [(f"nats://127.0.0.1:{auth_server.port}", STREAM)]
    (out,) = event["outputs"]
    assert (out["namespace"], out["name"]) == (f"s3://{s3_bucket}", "orders")
    assert out["outputFacets"]["outputStatistics"]["rowCount"] == 300
    # the table's schema: the transformation's columns, as the Spark tasks wrote them
    assert [(f["name"], f["type"]) for f in out["facets"]["schema"]["fields"]] == [
        ("origin_stream", "string"), ("origin_seq", "int64"), ("key", "string"), ("partition", "int32"),
        ("payload_text", "string")], out["facets"]
    # [openlineage] spark_inject_parent_job_info: the Spark job's own OpenLineage events can name
    # this task's run as their parent
    assert "spark.openlineage.parentJobName=cg_spark_delta_s3.consume" in argv, argv
    assert f"spark.openlineage.parentRunId={event['run']['runId']}" in argv, argv
    assert minio_server.password not in json.dumps(openlineage_events()) and PASSWORD not in json.dumps(
        openlineage_events())


@pytest.mark.spark
def test_iceberg_with_its_catalog_in_postgresql_from_a_postgres_connection(airflow_env, nats, shim, tmp_path, capfd,
                                                                           caplog, postgres_db, openlineage_events):
    """sink="iceberg" with pg_conn_id: the SQL catalog lives in PostgreSQL, its URI (with the
    password) reaches the job as CG_ICEBERG_CATALOG_URI only; read back through the catalog.
    Lineage names the table by its location, with the catalog's name of it as a symlink."""
    from tests.support.member_job import iceberg_landed

    airflow_env.add_connection("pg_catalog", "postgres", host=postgres_db.host, port=postgres_db.port,
                               login=postgres_db.user, password=postgres_db.password, schema=postgres_db.dbname)
    try:
        nats.publish([f"orders.c{i % 13}" for i in range(300)])
        result = airflow_env.run_dag(_dag("cg_spark_iceberg_pg", sink="iceberg", iceberg_table="lake.orders",
                                          iceberg_warehouse=str(tmp_path / "warehouse"), pg_conn_id="pg_catalog"))
    finally:
        airflow_env.remove_connection("pg_catalog")
    assert result.state_of("consume") == "success"
    assert result.xcom("consume")["rows_written"] == 300
    p = postgres_db
    landed = iceberg_landed(f"postgresql+psycopg2://{p.user}:{p.password}@{p.host}:{p.port}/{p.dbname}", "lake.orders")
    assert sorted(r.origin_seq for r in landed) == list(range(1, 301))
    argv = shim.read_text()
    out = capfd.readouterr()
    logged = out.out + out.err + caplog.text + _logs(airflow_env.home)
    for where, text in (("command line", argv), ("task log", logged),
                        ("XCom / rendered fields", _all_xcoms_and_rendered("cg_spark_iceberg_pg"))):
        assert postgres_db.password not in text, f"the catalog database's password leaked into the {where}"
    location = (tmp_path / "warehouse" / "lake.db" / "orders").resolve()
    assert result.xcom("consume")["table_location"] == f"file://{location}"
    (event,) = [e for e in openlineage_events() if e["eventType"] == "COMPLETE"
                and e["job"]["name"].endswith("cg_spark_iceberg_pg.consume")]
    (out,) = event["outputs"]
    assert (out["namespace"], out["name"]) == ("file", str(location))
    assert out["facets"]["symlinks"]["identifiers"] == [
        {"namespace": f"postgresql://{p.host}:{p.port}/{p.dbname}", "name": "default.lake.orders", "type": "TABLE"}]
    assert postgres_db.password not in json.dumps(openlineage_events())


@pytest.mark.spark
def test_avro_payloads_bring_sparks_avro_package(airflow_env, nats, shim, tmp_path):
    """payload_format="avro": the operator adds Spark's Avro package to the submit (fetched from
    Maven Central by spark-submit), and Spark decodes the records into ``value``."""
    import io

    import fastavro

    from airflow_provider_cg.core.landing.pipeline.decode import SPARK_AVRO_PACKAGE
    from airflow_provider_cg.core.landing.sinks import read_committed

    schema = {"type": "record", "name": "Event", "fields": [{"name": "id", "type": "long"},
                                                            {"name": "tag", "type": ["null", "string"]}]}
    parsed = fastavro.parse_schema(schema)

    def avro(i: int) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, {"id": i, "tag": None if i % 3 else f"t{i}"})
        return buf.getvalue()

    async def publish():
        js = nats.nc.jetstream()
        for i in range(200):
            await js.publish(f"orders.c{i % 7}", avro(i))

    nats.run(publish())
    lake = tmp_path / "lake"
    result = airflow_env.run_dag(_dag("cg_spark_avro", sink_path=str(lake), payload_format="avro",
                                      avro_schema=json.dumps(schema)))
    assert result.state_of("consume") == "success"
    assert result.xcom("consume")["rows_written"] == 200
    values = read_committed(lake).column("value").to_pylist()
    assert sorted(v["id"] for v in values) == list(range(200))
    assert {v["id"]: v["tag"] for v in values}[3] == "t3"
    assert f"--packages {SPARK_AVRO_PACKAGE}" in shim.read_text()


def test_zero_backlog_skips_without_starting_spark(airflow_env, nats, shim, tmp_path, openlineage_events,
                                                     auth_server):
    """A member without backlog is skipped before spark-submit, and its OpenLineage event (the
    provider's real listener) names the stream and no table: it landed nothing. An admin
    operator's event names no dataset, and is not marked as an operator of unknown source."""
    from airflow.sdk import DAG

    from airflow_provider_cg.operators.groups import ConsumerGroupStatusOperator
    from airflow_provider_cg.operators.spark import ConsumerGroupSparkSubmitOperator

    with DAG("cg_spark_empty", schedule=None) as dag:
        ConsumerGroupStatusOperator(task_id="status", stream=STREAM, group=GROUP, nats_conn_id="nats_auth") >> \
            ConsumerGroupSparkSubmitOperator(task_id="consume", stream=STREAM, group=GROUP, member="m1",
                                             nats_conn_id="nats_auth", conn_id="spark_test", idle_timeout=1.0,
                                             sink_path=str(tmp_path / "lake"))
    result = airflow_env.run_dag(dag)
    assert result.state_of("status") == "success"
    assert result.state_of("consume") == "skipped"
    assert not shim.exists(), "spark-submit was invoked for a member without backlog"
    events = {e["job"]["name"].rsplit(".", 1)[-1]: e for e in openlineage_events()
              if e["eventType"] == "COMPLETE" and e["job"]["name"].startswith("cg_spark_empty.")}
    assert set(events) == {"status", "consume"}, openlineage_events()
    names = {task: ([(d["namespace"], d["name"]) for d in e.get("inputs", [])],
                    [(d["namespace"], d["name"]) for d in e.get("outputs", [])]) for task, e in events.items()}
    assert names == {"status": ([], []), "consume": ([(f"nats://127.0.0.1:{auth_server.port}", STREAM)], [])}
    for task, event in events.items():
        assert "unknownSourceAttribute" not in event["run"].get("facets", {}), (task, event["run"]["facets"])


def test_a_backfill_of_a_group_not_created_yet_skips_or_fails_as_asked(airflow_env, nats, shim, tmp_path):
    """Unpausing every example DAG at once: the backfill may run before the DAG that creates
    its group. With skip_missing_group it is skipped; without, it fails at once (no retry)."""
    from airflow.sdk import DAG

    from airflow_provider_cg.operators.spark import ConsumerGroupSparkSubmitOperator

    window = {"backfill_start": "2026-11-20T09:00:00Z", "backfill_end": "2026-11-20T10:00:00Z"}
    with DAG("cg_spark_no_group", schedule=None) as dag:
        for task_id, skip in (("skips", True), ("fails", False)):
            ConsumerGroupSparkSubmitOperator(task_id=task_id, stream=STREAM, group="not-yet", nats_conn_id="nats_auth",
                                             conn_id="spark_test", sink_path=str(tmp_path / "lake"),
                                             skip_missing_group=skip, retries=2, **window)
    result = airflow_env.run_dag(dag)
    assert result.state_of("skips") == "skipped"
    assert result.xcom("skips")["stop_reason"] == "the group does not exist yet: Spark not started"
    assert result.state_of("fails") == "failed"
    assert not shim.exists()


@pytest.mark.spark
def test_not_pinned_is_skipped(airflow_env, nats, shim, tmp_path):
    nats.publish([f"orders.c{i}" for i in range(20)])
    cstream, consumer = nats.run(nats.cg.ensure_member_consumer(STREAM, GROUP, "m1", ack_wait=60.0))
    holder = Puller(nats.nc, cstream, consumer)
    assert nats.run(holder.pull(batch=1)) and holder.pin  # another instance holds the pin
    result = airflow_env.run_dag(_dag("cg_spark_not_pinned", sink_path=str(tmp_path / "lake"), standby_timeout=2.0))
    assert result.state_of("consume") == "skipped"
    assert shim.exists()  # Spark did start: the job itself found the pin taken


def test_invalid_arguments_name_the_field(airflow_env):
    from airflow_provider_cg.operators.spark import ConsumerGroupSparkSubmitOperator

    base = {"task_id": "t", "stream": STREAM, "group": GROUP, "member": "m1", "sink_path": "/tmp/x"}
    for kwargs, field in (
        ({"sink": "csv"}, "sink"),
        ({"payload_format": "xml"}, "payload_format"),
        ({"payload_format": "json"}, "json_schema"),
        ({"batch_size": 0}, "batch_size"),
        ({"settle_timeout": -1}, "settle_timeout"),
        ({"member": "bad name"}, "member"),
        ({"sink_path": None}, "sink_path"),
        ({"sink": "postgres", "sink_path": None}, "pg_conn_id"),
        ({"sink": "postgres"}, "sink_path"),  # an option of another sink: refused, not ignored
        ({"sink": "delta", "iceberg_table": "lake.orders"}, "iceberg_table"),
        ({"sink": "delta", "partition_by": "day(ts)"}, "partition_by"),
        ({"sink": "delta", "delete_when": "op = 'd'"}, "delete_when"),
        ({"application_args": ["--x"]}, "application_args"),
        ({"batch_bytes": 0}, "batch_bytes"),  # a job option the job would refuse: refused before spark-submit
    ):
        with pytest.raises(ConfigError) as e:
            ConsumerGroupSparkSubmitOperator(**{**base, **kwargs})
        assert e.value.field == field, (kwargs, e.value)
    with pytest.raises(TypeError, match="no_such_option"):
        ConsumerGroupSparkSubmitOperator(**base, no_such_option=1)


def test_cluster_master_gets_secrets_in_a_private_properties_file(airflow_env, auth_server, tmp_path):
    """YARN: no CG_NATS_* on the command line (no --conf), a 0600 properties file carries them
    as spark.yarn.appMasterEnv.* next to the user's own properties. Spark is not started."""
    from airflow_provider_cg.operators.spark import ConsumerGroupSparkSubmitOperator

    airflow_env.add_connection("spark_yarn", "spark", host="yarn")
    airflow_env.add_connection("nats_auth", "nats", host="127.0.0.1", port=auth_server.port,
                               login=USER, password=PASSWORD)
    own = tmp_path / "own.conf"
    own.write_text("spark.executor.memory 2g\n")
    op = ConsumerGroupSparkSubmitOperator(
        task_id="t", stream=STREAM, group=GROUP, member="m1", sink_path="/lake", nats_conn_id="nats_auth",
        conn_id="spark_yarn", properties_file=str(own), env_vars={"PLAIN": "1"},
    )
    spec = op.job_spec()
    hook, props_path = op.submit_hook(spec, spec.to_argv())
    try:
        # the command the provider's hook would run (inspected, not run)
        cmd = " ".join(hook._build_spark_submit_command("cg_member_job.py"))
        assert PASSWORD not in cmd and not re.search(r"CG_NATS_\w+=", cmd)
        assert "spark.yarn.appMasterEnv.PLAIN=1" in cmd  # the user's own env_vars as before
        props = Path(props_path)
        assert cmd.count("--properties-file") == 1 and str(props) in cmd
        assert stat.S_IMODE(props.stat().st_mode) == 0o600
        text = props.read_text()
        assert "spark.executor.memory 2g" in text
        assert f"spark.yarn.appMasterEnv.CG_NATS_PASSWORD {PASSWORD}" in text
        assert PASSWORD not in json.dumps(op.env_vars)  # the template field is untouched
    finally:
        os.unlink(props_path)


def test_a_local_follower_compiles_with_c1_unless_its_conf_says_otherwise(airflow_env, auth_server):
    """A follower in local mode gets ``spark.driver.defaultJavaOptions=-XX:TieredStopAtLevel=1``
    (``LOCAL_FOLLOWER_JVM``); a bounded run, a cluster master or the user's own
    ``defaultJavaOptions`` does not. The commands are inspected, not run."""
    from airflow_provider_cg.operators.spark import ConsumerGroupSparkSubmitOperator

    airflow_env.add_connection("spark_local2", "spark", host="local[2]")
    airflow_env.add_connection("spark_yarn", "spark", host="yarn")
    airflow_env.add_connection("nats_auth", "nats", host="127.0.0.1", port=auth_server.port,
                               login=USER, password=PASSWORD)

    def command(**kwargs) -> str:
        op = ConsumerGroupSparkSubmitOperator(task_id="t", stream=STREAM, group=GROUP, member="m1", sink_path="/lake",
                                              nats_conn_id="nats_auth", **kwargs)
        spec = op.job_spec()
        hook, props = op.submit_hook(spec, spec.to_argv())
        if props:
            os.unlink(props)
        return " ".join(hook._build_spark_submit_command("cg_member_job.py"))

    c1 = "spark.driver.defaultJavaOptions=-XX:TieredStopAtLevel=1"
    assert c1 in command(conn_id="spark_local2", follow=600)
    assert "defaultJavaOptions" not in command(conn_id="spark_local2")  # a bounded run: C2 for its big batches
    assert "defaultJavaOptions" not in command(conn_id="spark_yarn", follow=600)
    own = command(conn_id="spark_local2", follow=600, conf={"spark.driver.defaultJavaOptions": "-Xss4m"})
    assert "spark.driver.defaultJavaOptions=-Xss4m" in own and c1 not in own


@pytest.mark.spark
def test_spark_redacts_the_member_jobs_secret_properties(tmp_path):
    """Real spark-submit with an event log: a secret in ``spark.executorEnv.CG_NATS_CREDS`` (as
    the YARN/Kubernetes properties carry them) is redacted with the operator's pattern and
    would not be with Spark's default one."""
    import subprocess
    import sys

    from airflow_provider_cg.hooks.spark_submit import with_redaction

    app = tmp_path / "app.py"
    app.write_text("from pyspark.sql import SparkSession\nSparkSession.builder.getOrCreate().stop()\n")
    secret = "SUAMADEUPSEEDFORTHEREDACTIONTEST0123456789"
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1"}

    def event_log(conf: dict) -> str:
        logs = tmp_path / f"events-{len(conf)}"
        logs.mkdir()
        props = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(logs), "spark.ui.enabled": "false",
                 "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false",
                 "spark.executorEnv.CG_NATS_CREDS": secret, "spark.executorEnv.CG_PG_DSN": f"postgresql://u:{secret}@h/d",
                 "spark.executorEnv.DB_PASSWORD": f"{secret}-pw",
                 **conf}
        pf = tmp_path / f"p-{len(conf)}.conf"
        pf.write_text("".join(f"{k} {v}\n" for k, v in props.items()))
        subprocess.run([str(bindir / "spark-submit"), "--master", "local[1]", "--properties-file", str(pf), str(app)],
                       env=env, check=True, capture_output=True, timeout=300)
        return "".join(f.read_text(errors="replace") for f in logs.rglob("*") if f.is_file())

    assert secret in event_log({})  # Spark's default pattern does not cover our names
    redacted = event_log(with_redaction(None))  # Spark's own words spelled differently: still redacted
    assert "CG_NATS_CREDS" in redacted and "DB_PASSWORD" in redacted and secret not in redacted


def _try_numbers(dag_id: str) -> list[int]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as s:
        return [ti.try_number for ti in s.scalars(select(TaskInstance).where(TaskInstance.dag_id == dag_id))]


@pytest.mark.spark
def test_job_exit_codes_mean_something_in_airflow(airflow_env, nats, shim, tmp_path, capfd, caplog):
    """Exit 1 (a failing transformation): the task fails at once, retries or not, with the job's
    own error line as its failure. Exit 2 (NATS unreachable from the driver): a failure Airflow
    retries (two tries with retries=1)."""
    import datetime as dt

    nats.publish([f"orders.c{i % 5}" for i in range(30)])
    lake = tmp_path / "lake"
    result = airflow_env.run_dag(_dag("cg_spark_exit_1", sink_path=str(lake), retries=3,
                                      retry_delay=dt.timedelta(seconds=0),
                                      transform_sql="SELECT no_such_column FROM batch"))
    assert result.state_of("consume") == "failed"
    assert _try_numbers("cg_spark_exit_1") == [1]  # not retried: invalid input stays invalid
    out = capfd.readouterr()
    logs = out.out + out.err + caplog.text
    assert "AirflowFailException: member job: transform: AnalysisException" in logs and "no_such_column" in logs
    assert shim.read_text().count("--member m1") == 1

    # the driver cannot reach NATS (the connection the job gets points nowhere): exit 2, retried
    from airflow_provider_cg.core.tools.server import free_port

    airflow_env.add_connection("nats_nowhere", "nats", host="127.0.0.1", port=free_port())
    result = airflow_env.run_dag(_dag("cg_spark_exit_2", sink_path=str(lake), retries=1,
                                      retry_delay=dt.timedelta(seconds=0), check_backlog=False,
                                      nats_conn_id_override="nats_nowhere"))
    assert result.state_of("consume") == "failed"
    assert _try_numbers("cg_spark_exit_2") == [2]
    out = capfd.readouterr()
    assert "AirflowException: member job: cannot reach NATS" in out.out + out.err + caplog.text
    assert not lake.exists() or not list(lake.rglob("*.parquet"))


@pytest.mark.spark
def test_routes_land_into_two_tables_with_an_asset_event_each(airflow_env, nats, shim, tmp_path):
    """``routes`` as a dict: one Asset per table as the task's outlets, one asset event per table
    carrying that table's own rows and ranges, the summary counting per route."""
    from airflow_provider_cg.assets import landed_rows
    from airflow_provider_cg.core.landing.sinks import read_committed

    nats.publish([f"orders.c{i % 4}" for i in range(200)])  # c0/c1 to one table, c2/c3 to the other
    lakes = {"early": tmp_path / "early", "late": tmp_path / "late"}
    routes = {"early": {"sink_path": str(lakes["early"]), "subjects": ["orders.c0", "orders.c1"]},
              "late": {"sink_path": str(lakes["late"]), "subjects": "orders.c2, orders.c3"}}
    dag = _dag("cg_spark_routes", routes=routes)
    assert sorted(a.uri for a in dag.get_task("consume").outlets) == sorted(f"file://{p}" for p in lakes.values())
    result = airflow_env.run_dag(dag)
    assert result.state_of("consume") == "success", result.ti_states
    summary = result.xcom("consume")
    assert {k: v["rows_written"] for k, v in summary["routes"].items()} == {"early": 100, "late": 100}
    for name, lake in lakes.items():
        (event,) = _asset_events(f"file://{lake}")
        assert event["route"] == name and event["rows_written"] == 100 and event["format"] == "parquet", event
        rows = landed_rows([event], ["subject"])
        assert rows.num_rows == 100 and set(rows.column("subject").to_pylist()) == set(
            routes[name]["subjects"] if name == "early" else ["orders.c2", "orders.c3"])
        assert read_committed(lake).num_rows == 100
