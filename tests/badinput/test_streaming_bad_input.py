"""Bad input to the streaming pieces: the example application refuses a bad member or option
with one line and exit 1, before Spark starts; the streaming operator refuses bad arguments
naming the field; a failed query's Spark text is reduced to the provider's own error."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.streaming import DeltaBatches, SinkBatches, failure_of
from airflow_provider_cg.core.tools.packaging import spark_app_path

pytest_plugins = ["tests.airflow_conftest"]


@pytest.mark.parametrize("env,args,field", [
    ({"CG_STREAM": "ORDERS", "CG_GROUP": "lake"}, [], "CG_MEMBER"),
    ({"CG_STREAM": "ORDERS", "CG_GROUP": "lake", "CG_MEMBER": "m.1"}, [], "member"),
    ({"CG_STREAM": "ORDERS", "CG_GROUP": "lake", "CG_MEMBER": "m1"}, ["--max-messages-per-trigger", "0"],
     "maxMessagesPerTrigger"),
    ({"CG_STREAM": "ORDERS", "CG_GROUP": "lake", "CG_MEMBER": "m1"}, ["--trigger", "soon"], "--trigger"),
])
def test_the_example_application_refuses_bad_input_in_one_line(tmp_path, env, args, field):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CG_")}
    r = subprocess.run([sys.executable, str(spark_app_path("cg_stream_windows.py")), "--table", str(tmp_path / "t"),
                        "--checkpoint", str(tmp_path / "c"), *args], env={**clean, **env}, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1, (r.returncode, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "t").exists() and not (tmp_path / "c").exists()  # nothing written


def test_a_failed_querys_text_comes_down_to_the_providers_error():
    spark_text = ("[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source perform "
                  "latestOffset: Traceback (most recent call last):\n  File \"x.py\", line 3, in y\n"
                  "airflow_provider_cg.core.streaming.session.PinNotHeld: member 'm1' of group 'g': its pin moved to "
                  "another instance; the query stops\n\tat org.apache.spark...")
    assert failure_of(RuntimeError(spark_text)) == (
        "member 'm1' of group 'g': its pin moved to another instance; the query stops", False)
    bad = "...\nairflow_provider_cg.core.errors.ConfigError: maxMessagesPerTrigger: must be a positive integer\n"
    assert failure_of(Exception(bad)) == ("maxMessagesPerTrigger: must be a positive integer", True)
    assert failure_of(Exception("Spark said no\nmore")) == ("Spark said no", False)


@pytest.mark.airflow
def test_the_streaming_operator_refuses_bad_arguments(airflow_env, tmp_path):
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_cg.operators.streaming import ConsumerGroupStreamingAppOperator

    def op(**kw):
        return ConsumerGroupStreamingAppOperator(**{"task_id": "t", "stream": "S", "group": "g", "member": "m1",
                                                    "application": str(tmp_path / "app.py"), **kw})

    for kw, field in [({"stream": "S S"}, "stream"), ({"group": "g.x"}, "group"), ({"member": ""}, "member")]:
        with pytest.raises(ConfigError) as e:
            op(**kw)
        assert e.value.field == field
    airflow_env.add_connection("spark_local", "spark", host="local[1]")
    with pytest.raises(AirflowFailException, match="application: no such file"):
        op(conn_id="spark_local").execute({})


@pytest.mark.parametrize("make,field", [
    (lambda: SinkBatches(stream="ORDERS", group="lake", member="m1", stream_life="back:3", sink="parquet",
                         sink_path="/nowhere"), "stream_life"),
    (lambda: SinkBatches(stream="ORDERS", group="lake", member="m1", sink="nowhere"), "sink"),
    (lambda: DeltaBatches("/nowhere", ""), "app_id"),
])
def test_a_writer_refuses_bad_arguments_naming_them_before_any_batch(make, field):
    with pytest.raises(ConfigError) as e:
        make()
    assert e.value.field == field, str(e.value)
