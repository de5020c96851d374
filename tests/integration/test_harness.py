"""The harness itself: real servers start, serve JetStream, restart with their store, stop by PID."""

from __future__ import annotations

import asyncio
import os

import nats
import pytest

pytestmark = pytest.mark.integration


async def test_server_serves_jetstream_and_survives_restart(nats_server, nats_settings):
    nc = await nats_settings.connect()
    js = nc.jetstream()
    await js.add_stream(name="H", subjects=["h.>"])
    await js.publish("h.1", b"x")
    await nc.close()

    pid = nats_server.pid
    nats_server.restart()
    assert nats_server.pid != pid

    nc = await nats_settings.connect()
    info = await nc.jetstream().stream_info("H")
    assert info.state.messages == 1  # the store survived the restart
    await nc.close()


def test_stop_kills_only_our_pid(nats_server):
    pid = nats_server.pid
    os.kill(pid, 0)  # alive
    nats_server.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_cluster_runs_r3_streams(nats_cluster):
    nc = await nats.connect(servers=nats_cluster.urls)
    js = nc.jetstream()
    for _ in range(100):  # the meta leader needs a moment after start
        try:
            await js.add_stream(name="R3", subjects=["r3.>"], num_replicas=3)
            break
        except Exception:
            await asyncio.sleep(0.2)
    info = await js.stream_info("R3")
    assert info.config.num_replicas == 3
    assert len(info.cluster.replicas or []) == 2
    await nc.close()
