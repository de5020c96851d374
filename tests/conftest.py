"""Shared fixtures: real nats-server processes on 127.0.0.1, each with a temp store dir,
stopped by the PID the fixture started."""

from __future__ import annotations

import pytest

from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings
from airflow_provider_cg.core.tools.server import EmbeddedNatsCluster, EmbeddedNatsServer

# Airflow tests share one isolated AIRFLOW_HOME per process; the plugin imports nothing from
# Airflow itself. tests.support.shared: what the processes of one run (xdist's workers) share;
# tests.support.ordering: the longest files first.
pytest_plugins = ["tests.support.shared", "tests.support.ordering", "tests.airflow_conftest"]


@pytest.fixture
def nats_server(tmp_path):
    """A fresh single nats-server with JetStream. ``nats_server.restart()`` keeps port and store."""
    server = EmbeddedNatsServer(tmp_path / "nats").start()
    yield server
    server.cleanup()


@pytest.fixture
def nats_settings(nats_server) -> NatsConnectionSettings:
    return NatsConnectionSettings(servers=[nats_server.url])


@pytest.fixture
async def nc(nats_settings):
    """A connected nats-py client on the ``nats_server``."""
    client = await nats_settings.connect()
    yield client
    await client.close()


@pytest.fixture
def nats_cluster(tmp_path):
    """Three nats-servers clustered on loopback, for R3 streams."""
    cluster = EmbeddedNatsCluster(3, tmp_path / "cluster").start()
    yield cluster
    cluster.cleanup()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``make test``'s ``-n auto``: one worker per core, two at least (one process keeps about
    60 % of two cores busy: its tests wait on ack waits, takeovers and server restarts) and four
    at most (each may run several Spark drivers at once)."""
    import os

    return min(4, max(2, len(os.sched_getaffinity(0))))


def pytest_addoption(parser):
    group = parser.getgroup("chaos", "randomized fault tests (tests/integration/test_member_job_chaos.py)")
    group.addoption("--chaos-seed", type=int, default=None,
                    help="replay a randomized fault run (default: $CG_CHAOS_SEED, else a new seed)")
    group.addoption("--chaos-seconds", type=float, default=None,
                    help="how long faults go on (default 40; a long run e.g. 600)")
    group.addoption("--chaos-messages", type=int, default=None, help="messages published (default 100000)")
    group.addoption("--chaos-spark", action="store_true",
                    help="run every member job through spark-submit instead of the plain Python driver")
    group.addoption("--chaos-storage", default=None, choices=("local", "s3"),
                    help="where the Delta and Iceberg chaos tables live (default: picked by the seed)")
    group.addoption("--mixed-sink", default=None,
                    choices=("parquet", "postgres", "delta", "delta-s3", "iceberg", "iceberg-s3"),
                    help="the table of tests/integration/test_mixed_writers.py (default: picked by the seed)")


@pytest.hookimpl(trylast=True)  # after -m / -k deselection: only what the selected tests use
def pytest_collection_modifyitems(config, items):
    import os

    if config.option.collectonly:
        return
    from tests.support.prebuild import start_for

    start_for(items)  # MinIO, orbit's programs, chromium: built meanwhile
    if "SPARK_SUBMIT_OPTS" in os.environ:
        return
    if any(item.get_closest_marker("spark") is not None for item in items):
        from tests.support.spark_cds import dump_in_background

        dump_in_background()


def pytest_runtest_setup(item):
    """Tests that run spark-submit (marked ``spark``) get a class-data-sharing archive of Spark's
    classes and the serial collector in ``SPARK_SUBMIT_OPTS``, which Spark's launcher adds to
    every driver JVM it starts (member jobs, operators, DAGs): about 3 s less per JVM start
    (``tests/support/spark_cds.py``; dumped in the background from collection on)."""
    import os

    if item.get_closest_marker("spark") is None or "SPARK_SUBMIT_OPTS" in os.environ:
        return
    from tests.support.spark_cds import spark_submit_opts

    os.environ["SPARK_SUBMIT_OPTS"] = spark_submit_opts()
