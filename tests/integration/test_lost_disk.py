"""A server's disk lost for good under a running group (``tests/support/lost_disk.py``): three
nats-servers, the server holding the most partition streams SIGKILLed after a lull in traffic,
its store deleted and a replacement started empty, members' jobs SIGKILLed meanwhile. Every
message lands once and in per-key order, and the group is healthy again: in the
partition-streams layout (whose partition log is the copy of record: the lost partition streams
are rebuilt from it), through a move to the work-queue layout and back after the loss and then
two servers of three SIGKILLed at once (no quorum: the group stalls, named by the tools, and
goes on when they are back); and in the work-queue layout (everything R3) as the control. ``benchmarks/lost_disk.py`` runs it over
several seeds, with and without the lull."""

from __future__ import annotations

import os

from tests.support.lost_disk import LostDiskRun

SEED = int(os.environ.get("CG_LOST_DISK_SEED", "52"))


async def test_partition_streams_through_a_lost_disk_a_move_and_two_servers_down(nats_cluster, member_job_zip,
                                                                                  tmp_path):
    run = LostDiskRun("partition-streams", SEED, lull=True, move=True, two_down=True, messages=6000, seconds=15.0)
    try:
        await run.run(nats_cluster, member_job_zip, tmp_path)
    finally:
        print("\n".join(run.events))
    assert run.lost_server_streams, run.events  # the lost server held partition streams
    assert run.lost == 0 and run.healthy_after_s is not None and run.healthy_after_s < 60, run.events


async def test_the_work_queue_layout_through_a_lost_disk(nats_cluster, member_job_zip, tmp_path):
    run = LostDiskRun("work-queue", SEED, lull=True, messages=3000, seconds=8.0)
    try:
        await run.run(nats_cluster, member_job_zip, tmp_path)
    finally:
        print("\n".join(run.events))
    assert run.lost == 0 and run.healthy_after_s is not None and run.healthy_after_s < 60, run.events


async def test_a_server_gone_for_good_and_a_new_node_under_another_name(nats_cluster, member_job_zip, tmp_path):
    """The server holding partition streams never comes back (its store deleted) and a new node
    under another name joins: its streams are named as not served, the member's job exits 2
    naming the command that makes them again, and ``cg layout ... partition-streams`` rebuilds
    them from the log on the servers there are; every message lands once, in per-key order."""
    import asyncio
    import shutil
    import subprocess
    import sys
    import time

    from airflow_provider_cg.core.errors import ServerUnavailable
    from airflow_provider_cg.core.groups.admin import ConsumerGroups
    from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
    from airflow_provider_cg.core.groups.layouts import partition_streams as ps
    from airflow_provider_cg.core.jetstream.api import JsApi
    from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings
    from airflow_provider_cg.core.tools.server import EmbeddedNatsServer, free_port
    from tests.support.member_job import assert_exactly_once, parquet_landed, publish_orders, run_member_job

    nc = await NatsConnectionSettings(servers=nats_cluster.urls).connect()
    urls = ",".join(nats_cluster.urls)
    lake, api, wq = tmp_path / "lake", JsApi(nc), "ORD-g"
    new_node = None
    job = ["--batch-size", "300", "--ack-wait", "3", "--idle-timeout", "1", "--standby-timeout", "5"]

    async def status():  # a cluster that lost a node answers again once its streams elect leaders
        for _ in range(60):
            try:
                return await ConsumerGroups(nc).status("ORD", "g")
            except ServerUnavailable:
                await asyncio.sleep(0.5)
        return await ConsumerGroups(nc).status("ORD", "g")

    def land() -> object:
        return run_member_job(member_job_zip, tmp_path / "jobs", nats_servers=urls, stream="ORD", group="g",
                              member="m1", sink="parquet", sink_path=lake, args=job, spark=False, timeout=120)
    try:
        for _ in range(60):  # a fresh cluster elects its meta leader first
            try:
                await api.add_stream({"name": "ORD", "subjects": ["orders.*"], "num_replicas": 3})
                break
            except Exception:  # noqa: BLE001 - not yet
                await asyncio.sleep(0.5)
        await ConsumerGroups(nc).create("ORD", "g", ElasticGroupConfig(3, (PartitioningFilter("orders.*", (1,)),),
                                                                        members=("m1",)), layout=ps.PARTITION_STREAMS)
        expected = await publish_orders(nc, "ORD", "g", 900, 90)
        for _ in range(100):  # in the partition streams, the mirrors' acknowledgements given
            if sum((await ps.partition_streams_left(api, wq, 3)).values()) == 900:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(2.0)
        leaders = {p: (await api.stream_info(ps.partition_stream(wq, p)))["cluster"]["leader"] for p in range(3)}
        gone = next(s for s in nats_cluster.servers if s.name == leaders[0])
        gone.kill()
        shutil.rmtree(gone.store_dir)
        new_node = EmbeddedNatsServer(tmp_path / "n9", name="cg-n9", cluster_name="cg-cluster",
                                      cluster_port=free_port(), routes=[s.cluster_port for s in nats_cluster.servers])
        new_node.start()
        # Until the new node has caught up with the meta group and the lost node's streams have
        # elected leaders, a job meets unanswered requests (exit 2 too, Airflow's retry goes on),
        # or finds the member consumer it made lost again with the server that held it (revoked
        # after its standby time: exit 0, nothing landed, Airflow's next run tries again): how
        # long that takes depends on the machine, so the tries run against a deadline.
        deadline = time.monotonic() + 150
        while True:
            r = land()
            revoked = r.returncode == 0 and '"result":"revoked"' in r.stdout and '"messages_read":0' in r.stdout
            assert (r.returncode == 2 or revoked) and "Traceback" not in r.output, r.describe()
            if "partition-streams makes it again from the log" in r.output or time.monotonic() > deadline:
                break
            await asyncio.sleep(2.0)
        assert "partition-streams makes it again from the log" in r.output, r.output
        unserved = {p for p, n in leaders.items() if n == gone.name}
        assert unserved <= set((await status()).partition_problems)
        cmd = [sys.executable, "-m", "airflow_provider_cg.core.tools.cli", "layout", "ORD", "g", "partition-streams",
               "--server", urls]
        for _ in range(3):  # exit 2 on a slow answer: the operator runs it again
            out = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=180)
            assert out.returncode in (0, 2) and "Traceback" not in out.stderr, out.stdout + out.stderr
            if out.returncode == 0:
                break
        assert out.returncode == 0, out.stdout + out.stderr
        for p in unserved:  # made again where there is a server
            assert (await api.stream_info(ps.partition_stream(wq, p)))["cluster"]["leader"] != gone.name
        expected |= await publish_orders(nc, "ORD", "g", 300, 90)
        for _ in range(8):  # a job may still meet a slow answer there (exit 2: Airflow's retry goes on)
            r = land()
            assert r.returncode in (0, 2) and "Traceback" not in r.output, r.describe()
            if r.returncode == 0 and (await status()).backlog == 0:
                break
        st = await status()
        assert st.backlog == 0 and not st.partition_problems, st.partition_problems
        assert_exactly_once(parquet_landed(lake), expected)
    finally:
        await nc.close()
        if new_node is not None:
            new_node.cleanup()
