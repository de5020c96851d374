"""Shared fixtures: real nats-server processes on 127.0.0.1, each with a temp store dir,
stopped by the PID the fixture started."""

from __future__ import annotations

import pytest

from airflow_provider_cg.core.connection import NatsConnectionSettings
from airflow_provider_cg.core.server import EmbeddedNatsCluster, EmbeddedNatsServer

# Airflow tests share one isolated AIRFLOW_HOME; the plugin imports nothing from Airflow itself.
pytest_plugins = ["tests.airflow_conftest"]


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
