"""Secrets of every NATS auth mode, planted in Airflow connections as a user pastes them, go
through a real DAG run (real spark-submit, real nats-servers) and are then looked for in
every output: the spark-submit command line, the task logs, XComs, rendered fields, the Spark
driver's output, and the YARN properties file's lifetime (0600, deleted after the submit)."""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path

import nkeys
import pytest

from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings
from airflow_provider_cg.core.tools.server import EmbeddedNatsServer
from tests.integration.test_operators_groups import NatsThread
from tests.support.nats_auth import Operator, make_tls, new_keypair

pytest_plugins = ["tests.airflow_conftest"]
pytestmark = [pytest.mark.airflow, pytest.mark.integration, pytest.mark.spark]

PASSWORD, TOKEN = "pw-PLANTED-1f2e3d4c5b", "tok-PLANTED-9a8b7c6d5e4f"


@pytest.fixture
def planted(tmp_path, airflow_env):
    """A nats-server per auth mode with a group and messages, and an Airflow connection each."""
    op = Operator.new()
    user = new_keypair(nkeys.PREFIX_BYTE_USER)
    tls = make_tls(tmp_path / "tls")
    creds = op.user_creds()
    tls_conf = f'tls {{ cert_file: "{tls["server_cert"]}", key_file: "{tls["server_key"]}", ca_file: "{tls["ca"]}", verify: true, timeout: 2 }}'
    modes = {
        "user": (f'authorization {{ user: alice, password: "{PASSWORD}" }}', {"login": "alice", "password": PASSWORD},
                 NatsConnectionSettings(user="alice", password=PASSWORD)),
        "token": (f'authorization {{ token: "{TOKEN}" }}', {"extra": {"token": TOKEN}}, NatsConnectionSettings(token=TOKEN)),
        "nkey": (f"authorization {{ users: [ {{ nkey: {user.public_key.decode()} }} ] }}",
                 {"extra": {"nkey_seed": user.seed.decode()}}, NatsConnectionSettings(nkey_seed=user.seed.decode())),
        "jwt": (op.server_config(), {"extra": {"creds": creds.replace("\n", "")}}, NatsConnectionSettings(creds=creds)),
        "mtls": (tls_conf, {"schema": "tls", "extra": {"tls_ca": tls["ca"].read_text(), "tls_cert": tls["client_cert"].read_text(),
                                                       "tls_key": tls["client_key"].read_text().replace("\n", "")}},
                 NatsConnectionSettings(tls_ca=str(tls["ca"]), tls_cert=str(tls["client_cert"]), tls_key=str(tls["client_key"]))),
    }
    secrets = [PASSWORD, TOKEN, user.seed.decode(), creds.split("\n")[1], _seed_of(creds),
               "".join(tls["client_key"].read_text().splitlines()[1:-1])[:40]]
    servers, threads = [], []
    for mode, (conf, fields, settings) in modes.items():
        server = EmbeddedNatsServer(tmp_path / mode, config_extra=conf).start()
        servers.append(server)
        scheme = "tls" if mode == "mtls" else "nats"
        settings.servers = [f"{scheme}://127.0.0.1:{server.port}"]
        t = NatsThread(settings)
        threads.append(t)
        t.run(t.api.add_stream({"name": "ORDERS", "subjects": ["orders.>"], "storage": "file"}))
        t.run(t.cg.create("ORDERS", "g", ElasticGroupConfig(2, (PartitioningFilter("orders.*", (1,)),), members=("m1",))))
        t.publish([f"orders.k{i % 7}" for i in range(40)])
        airflow_env.add_connection(f"nats_{mode}", "nats", host="127.0.0.1", port=server.port, **fields)
    yield list(modes), [s for s in secrets if s]
    for t in threads:
        t.run(t.nc.close())
        t.loop.call_soon_threadsafe(t.loop.stop)
    for s in servers:
        s.cleanup()


def _seed_of(creds: str) -> str:
    return next(line for line in creds.splitlines() if line.startswith("SU"))


def test_no_secret_of_any_auth_mode_shows_anywhere(airflow_env, planted, tmp_path, monkeypatch, capfd, caplog):
    from airflow.sdk import DAG

    from airflow_provider_cg.operators.spark import ConsumerGroupSparkSubmitOperator
    from airflow_provider_cg.operators.streaming import ConsumerGroupStreamingAppOperator
    from tests.integration.test_operator_spark import _all_xcoms_and_rendered, _logs

    modes, secrets = planted
    calls = tmp_path / "spark-submit.calls"
    shim = tmp_path / "shim"
    shim.mkdir()
    real = Path(sys.executable).parent / "spark-submit"
    (shim / "spark-submit").write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{calls}"\nenv >> "{calls}.env"\n'
                                       f'exec "{real}" "$@"\n')
    (shim / "spark-submit").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
    airflow_env.add_connection("spark_local", "spark", host="local[1]")
    app = tmp_path / "stream_app.py"  # a user's streaming application: an available-now query over m1
    app.write_text("from pyspark.sql import SparkSession\n"
                   "from airflow_provider_cg.core.streaming import member_options, register\n"
                   "spark = SparkSession.builder.getOrCreate()\nregister(spark)\n"
                   "q = spark.readStream.format('cg_member').options(**member_options()).load().writeStream"
                   ".format('noop').trigger(availableNow=True).option('checkpointLocation', __import__('sys').argv[1])"
                   ".start()\nq.awaitTermination()\nprint('CG_APP_OFFSETS', q.lastProgress and "
                   "q.lastProgress['sources'][0]['endOffset'])\n")
    with DAG("cg_secrets_everywhere", schedule=None) as dag:
        for mode in modes:
            consume = ConsumerGroupSparkSubmitOperator(
                task_id=f"consume_{mode}", stream="ORDERS", group="g", member="m1", nats_conn_id=f"nats_{mode}",
                conn_id="spark_local", sink_path=str(tmp_path / f"lake-{mode}"), idle_timeout=1.0)
            # the streaming source connects (planning process and tasks) with the same settings
            consume >> ConsumerGroupStreamingAppOperator(
                task_id=f"stream_{mode}", stream="ORDERS", group="g", member="m1", nats_conn_id=f"nats_{mode}",
                conn_id="spark_local", application=str(app), application_args=[str(tmp_path / f"ck-{mode}")])
    result = airflow_env.run_dag(dag)
    for mode in modes:
        assert result.state_of(f"consume_{mode}") == "success", (mode, result.ti_states)
        assert result.xcom(f"consume_{mode}")["rows_written"] == 40, mode
        assert result.state_of(f"stream_{mode}") == "success", (mode, result.ti_states)
    assert (calls.parent / (calls.name + ".env")).read_text().count("CG_NATS_") > 0  # they did travel, as env
    out = capfd.readouterr()
    # each application ran its query to its end (the source connected with the task's settings: a
    # refused connection fails the query, and the task)
    assert (out.out + out.err + caplog.text + _logs(airflow_env.home)).count("CG_APP_OFFSETS") >= len(modes)
    places = {
        "spark-submit command lines": calls.read_text(),
        "task logs and Spark output": out.out + out.err + caplog.text + _logs(airflow_env.home),
        "XComs and rendered fields": _all_xcoms_and_rendered("cg_secrets_everywhere"),
    }
    leaks = [f"{where}: secret #{i}" for where, text in places.items() for i, s in enumerate(secrets) if s in text]
    assert not leaks, leaks


def test_yarn_properties_file_is_private_and_removed(airflow_env, planted, tmp_path, monkeypatch):
    """A cluster master: the secrets ride in a 0600 properties file that exists only during
    the submit, and the command line the provider's hook builds has none of them."""
    from airflow_provider_cg.operators.spark import ConsumerGroupSparkSubmitOperator

    modes, secrets = planted
    airflow_env.add_connection("spark_yarn", "spark", host="yarn")
    for mode in modes:
        op = ConsumerGroupSparkSubmitOperator(task_id=f"y_{mode}", stream="ORDERS", group="g", member="m1",
                                              nats_conn_id=f"nats_{mode}", conn_id="spark_yarn", sink_path="/lake")
        spec = op.job_spec()
        hook, props = op.submit_hook(spec, spec.to_argv())
        try:
            cmd = " ".join(hook._build_spark_submit_command("cg_member_job.py"))
            assert not [s for s in secrets if s in cmd], mode
            assert stat.S_IMODE(Path(props).stat().st_mode) == 0o600
            text = Path(props).read_text()
            assert "spark.yarn.appMasterEnv.CG_NATS_" in text
            assert "spark.redaction.regex" in cmd and "CG_NATS_" in cmd.split("spark.redaction.regex=")[1]
        finally:
            os.unlink(props)
    # a real submit to a YARN master (which fails here: no Hadoop config) removes its file too
    import glob
    import tempfile

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    for var in ("HADOOP_CONF_DIR", "YARN_CONF_DIR"):
        monkeypatch.delenv(var, raising=False)
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "cg-spark-*.conf")))
    op = ConsumerGroupSparkSubmitOperator(task_id="y_submit", stream="ORDERS", group="g", member="m1",
                                          nats_conn_id="nats_user", conn_id="spark_yarn", sink_path="/lake",
                                          check_backlog=False)
    with pytest.raises(Exception, match="(?i)spark-submit|yarn"):
        op.execute({})
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "cg-spark-*.conf"))) == before


def test_the_spark_providers_log_masking_leaves_the_redaction_setting_readable(airflow_env):
    """The Spark provider logs the submit command after hiding the value that follows any word
    "secret" or "password"; the redaction pattern we add must not contain those words, or the
    masking eats the next argument and the logged command stops saying what ran."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from airflow_provider_cg.hooks.spark_submit import with_redaction

    regex = with_redaction({})["spark.redaction.regex"]
    cmd = ["spark-submit", "--conf", f"spark.redaction.regex={regex}", "--py-files", "cg_core.zip", "job.py"]
    hook = SparkSubmitHook.__new__(SparkSubmitHook)  # _mask_cmd reads no connection
    assert hook._mask_cmd(cmd) == " ".join(cmd)
    for name in ("CG_NATS_PASSWORD", "CG_PG_DSN", "CG_ICEBERG_CATALOG_URI", "CG_ICEBERG_CATALOG_TOKEN",
                 "CG_ICEBERG_CATALOG_CREDENTIAL", "AWS_SECRET_ACCESS_KEY",
                 "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID"):
        # Java reads an inline (?i) anywhere; Python only at the start
        assert re.search(regex.replace("(?i)", ""), f"spark.executorEnv.{name}", re.I), name
