"""Randomized outside faults while member jobs run (see ``tests/support/chaos.py``): SIGKILL,
SIGSTOP past the ack wait, step-downs, membership changes (a member dropped right after its
job was killed mid-batch included), nats-server restarts; then a clean drain. No failpoints.

Every run but the Spark tasks' starts part of its member jobs as followers (``--follow``: kept
pinned, landing what arrives), so the same faults meet followers mid-batch on every sink.
Each run prints its seed; ``pytest --chaos-seed N`` (or ``CG_CHAOS_SEED=N``) replays it,
``--chaos-seconds 600`` runs longer, ``--chaos-spark`` starts every job through spark-submit.
The lake tables run too: Delta on MinIO (restarted and killed under the writes), Iceberg.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from tests.support.chaos import ChaosConfig, ChaosRun, chaos_seed, with_chaos_options

pytestmark = [pytest.mark.integration]


def _config(request, **overrides) -> ChaosConfig:
    cfg = with_chaos_options(request, ChaosConfig(seed=chaos_seed(request), spark=request.config.getoption(
        "--chaos-spark"), **overrides))
    print(f"\nchaos seed {cfg.seed} ({cfg.sink}, {cfg.seconds:g}s, {cfg.messages} messages): "
          f"replay with --chaos-seed {cfg.seed}")
    return cfg


async def test_randomized_faults_into_parquet_moving_between_layouts(request, nc, nats_server, member_job_zip,
                                                                     tmp_path):
    """Into the Parquet lake, starting in the partition-streams layout, moved to the work-queue
    layout and back while the jobs run (``groups/moves.py``). (The other chaos tests run the
    work-queue layout.) The jobs route by subject: every message into the lake, those of 40 keys
    also into a second one (``routes``), each table exactly once and in per-key order."""
    run = ChaosRun(_config(request, seconds=10.0, messages=20_000, layout="partition-streams", layout_moves=2,
                           routed_keys=40, followers=0.5), nc, [nats_server], tmp_path, member_job_zip)
    await run.run()
    stats = await run.check()
    assert any("--follow" in j.cmd for _, j in run.jobs), run.report()  # followers among the writers
    assert any("layout -> work-queue" in e for e in run.events) and \
        any("layout -> partition-streams" in e for e in run.events), run.report()
    print(run.report(), stats)


async def test_randomized_faults_on_a_static_group(request, nc, nats_server, member_job_zip, tmp_path):
    """A static group read by direct gets from its origin, each batch acknowledged by moving the
    member's durable: kills, stalls, step-downs and server restarts must not lose, repeat or
    reorder anything, and the durables end with nothing pending."""
    run = ChaosRun(_config(request, static=True, seconds=11.0, messages=16_500, server_restarts=1, followers=0.5), nc,
                   [nats_server], tmp_path, member_job_zip)
    await run.run()
    stats = await run.check()
    paths = Counter(p for _, j in run.jobs for p in re.findall(r'"read_path":"(\w+)"', j.output_so_far()))
    assert paths["direct"], (paths, run.report())
    print(run.report(), stats, dict(paths))


@pytest.mark.spark
async def test_randomized_faults_with_spark_tasks_reading(request, nc, nats_server, member_job_zip, tmp_path):
    """Every job through spark-submit with --read executors: the batches' Spark tasks read NATS
    while their drivers are killed, stalled, stepped down and their server restarted. The seed
    also picks the group: elastic (the tasks read the work queue, the driver purges), elastic in
    the partition-streams layout (the tasks read the partition streams) or static (they read the
    origin, the driver moves the durables); a JVM per job makes all three in one run too slow
    for the suite, and ``--chaos-seed`` replays any."""
    cfg = _config(request, read="executors", seconds=5.0, messages=5_000, server_restarts=1,
                  members=("m1", "m2"), partitions=4)  # at most four JVMs on the test machine's two cores
    kind = ("static", "elastic", "elastic partition-streams")[cfg.seed % 3]
    cfg.spark, cfg.static = True, kind == "static"
    if kind.endswith("partition-streams"):
        cfg.layout = "partition-streams"
    print("group:", kind)
    run = ChaosRun(cfg, nc, [nats_server], tmp_path, member_job_zip)
    await run.run()
    stats = await run.check()
    paths = Counter(p for _, j in run.jobs for p in re.findall(r'"read_path":"(\w+)"', j.output_so_far()))
    assert paths["executors"], (paths, run.report())
    print(run.report(), stats, dict(paths))


async def test_randomized_faults_into_postgres(request, nc, nats_server, member_job_zip, tmp_path, postgres_db):
    cfg = _config(request, sink="postgres", seconds=14.0, messages=24_000, server_restarts=1, followers=0.4)
    run = ChaosRun(cfg, nc, [nats_server], tmp_path, member_job_zip, sink_env={"CG_PG_DSN": postgres_db.dsn})
    await run.run()
    stats = await run.check(postgres_db.conn_params())
    print(run.report(), stats)


async def test_randomized_faults_on_a_cluster_killing_the_stream_leader(request, nats_cluster, member_job_zip,
                                                                        tmp_path):
    """An R3 cluster whose group moves from the work-queue layout to partition streams and back
    while the jobs run (the partition streams created on a work queue that has moved on), with a
    server SIGKILLed or restarted in each layout: the work queue's leader, then a partition
    stream's leader. Everything lands once, in per-key order, and the group drains."""
    from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings

    nc = await NatsConnectionSettings(servers=nats_cluster.urls).connect()
    try:
        cfg = _config(request, replicas=3, seconds=10.0, messages=20_000, server_restarts=2, layout_moves=2,
                      restarts_on_schedule=True, followers=0.3)
        run = ChaosRun(cfg, nc, nats_cluster.servers, tmp_path, member_job_zip)
        await run.run()
        stats = await run.check()
        print(run.report(), stats)
    finally:
        await nc.close()


@pytest.mark.parametrize("sink", ["delta", "iceberg"])
async def test_randomized_faults_into_a_lake_table(request, sink, nc, nats_server, member_job_zip, tmp_path):
    """Delta and Iceberg, on local disk or on MinIO, in either layout, as the seed picks
    (``--chaos-storage`` chooses the storage; the mixed-writer runs land into both too); on
    MinIO the object store itself is stopped or SIGKILLed under the jobs' writes, and comes
    back. On local disk most kills aim at the job holding the newest table commit slot,
    most likely committing the other members' batches at that moment."""
    pytest.importorskip("deltalake" if sink == "delta" else "pyiceberg")
    cfg = _config(request, sink=sink, seconds=8.0, messages=9_600, server_restarts=1, followers=0.4)
    storage = request.config.getoption("--chaos-storage") or ("s3", "local")[(cfg.seed + (sink == "iceberg")) % 2]
    cfg.layout = ("work-queue", "partition-streams")[(cfg.seed // 2) % 2]
    print("storage:", storage, "layout:", cfg.layout)
    store = request.getfixturevalue("minio_server") if storage == "s3" else None
    bucket = request.getfixturevalue("s3_bucket") if storage == "s3" else None
    cfg.store_restarts = 2 if store else 0
    run = ChaosRun(cfg, nc, [nats_server], tmp_path, member_job_zip, object_store=store, bucket=bucket)
    await run.run()
    stats = await run.check()
    # group commit: the jobs that ended made no more table commits than they committed batches
    ended = [j.result().summary or {} for _, j in run.jobs if j.result().returncode == 0]
    commits, batches = sum(s.get("table_commits", 0) for s in ended), sum(s.get("batches", 0) for s in ended)
    assert commits <= batches + sum(s.get("recovered_committed", 0) for s in ended), (commits, batches)
    print(run.report(), stats, f"table commits {commits} for {batches} batches")


async def test_randomized_faults_upserting_a_change_stream(request, nc, nats_server, member_job_zip, tmp_path):
    """A change stream over 1,000 keys (inserts, updates, about 1 in 8 a delete) upserted by key
    (``--merge-keys key --delete-when "payload_text = 'deleted'"``) through SIGKILL, SIGSTOP,
    step-downs, membership changes and a server restart: the table equals the last state per
    key computed here from what was published. The seed picks the table: Delta, Iceberg or
    PostgreSQL (``--mixed-sink`` chooses)."""
    cfg = _config(request, seconds=8.0, messages=6_000, keys=1_000, server_restarts=1, merge=True, followers=0.4)
    sink = request.config.getoption("--mixed-sink") or ("delta", "iceberg", "postgres")[cfg.seed % 3]
    if sink not in ("delta", "iceberg", "postgres"):
        pytest.skip(f"upserts go into delta, iceberg or postgres (not {sink})")
    cfg.sink = sink
    print(f"upserts into {sink} (seed {cfg.seed})")
    pg = request.getfixturevalue("postgres_db") if sink == "postgres" else None
    run = ChaosRun(cfg, nc, [nats_server], tmp_path, member_job_zip,
                   sink_env={"CG_PG_DSN": pg.dsn} if pg else {})
    await run.run()
    stats = await run.check(pg.conn_params() if pg else None)
    print(run.report(), stats)
