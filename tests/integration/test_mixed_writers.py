"""Every writer a user can point at one table, at once (``tests/support/mixed_writers.py``):
live members with standbys (some of them followers), backfills over random overlapping windows and ``cg reset``
replays, each job a spark-submit running one transformation (one that drops rows and routes
the rest into two tables, with records missing their merge key mixed in; one that aggregates),
under SIGKILL, SIGSTOP past the ack wait, step-downs, membership changes and nats-server
restarts (and object-store restarts for a table on MinIO). An independent reader then finds each input's effect exactly once, and
per-key order where rows map one to one. One run re-creates the origin mid-run.

The seed picks the table (Parquet lake, PostgreSQL, Delta or Iceberg, on local disk or MinIO):
a JVM per job makes every table in every run too slow for the suite. Replay or widen a run:

    pytest tests/integration/test_mixed_writers.py --chaos-seed N [--mixed-sink iceberg-s3]
    pytest tests/integration/test_mixed_writers.py --chaos-seconds 600 --chaos-messages 200000 --mixed-sink delta-s3
"""

from __future__ import annotations

import pytest

from tests.support.chaos import chaos_seed, with_chaos_options
from tests.support.mixed_writers import MixedConfig, MixedWritersRun, RoutedMixedRun

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SINKS = ("parquet", "postgres", "delta", "delta-s3", "iceberg", "iceberg-s3")


def _run(request, tmp_path, nc, nats_server, member_job_zip, **overrides) -> tuple[MixedWritersRun, dict]:
    seed = chaos_seed(request)
    rotate = overrides.pop("rotate", 0)
    kind = overrides.pop("run", MixedWritersRun)
    table = request.config.getoption("--mixed-sink") or SINKS[(seed + rotate) % len(SINKS)]
    sink, _, where = table.partition("-")
    cfg = with_chaos_options(request, MixedConfig(seed=seed, sink=sink, spark=True, members=("m1", "m2"),
                                                  partitions=4, server_restarts=1, followers=0.25,
                                                  store_restarts=1 if where else 0, **overrides))
    print(f"\nmixed writers seed {seed} ({table}, {cfg.transform}, {cfg.seconds:g}s, {cfg.messages} messages): "
          f"replay with --chaos-seed {seed} --mixed-sink {table}")
    extra: dict = {}
    if where:
        extra = {"object_store": request.getfixturevalue("minio_server"),
                 "bucket": request.getfixturevalue("s3_bucket")}
    pg = request.getfixturevalue("postgres_db") if sink == "postgres" else None
    if pg is not None:
        extra["sink_env"] = {"CG_PG_DSN": pg.dsn}
    run = kind(cfg, nc, [nats_server], tmp_path, member_job_zip, **extra)
    return run, {"pg_params": pg.conn_params() if pg else None}


async def test_every_writer_at_once_with_an_aggregation_and_a_re_created_origin(request, nc, nats_server,
                                                                                member_job_zip, tmp_path):
    run, kw = _run(request, tmp_path, nc, nats_server, member_job_zip, transform="aggregate", recreate=True,
                   seconds=8.0, messages=3_200, rotate=3)
    await run.run()
    stats = await run.check(kw["pg_params"])
    print(run.report(), stats)
    assert run.recreated and stats["refused"] >= 1, run.report()


async def test_every_writer_at_once_into_routed_tables_with_keyless_records(request, nc, nats_server, member_job_zip,
                                                                           tmp_path):
    """Routed by a column into two tables (the seed's kind appending the odd messages but for the
    one in ten the transformation drops, and an upsert by customer of the even ones), with ~3%
    of the payloads missing the customer:
    members, standbys, backfills and replays under the same faults; each table holds exactly its
    route's effect, and every keyless message of the upserted route is dead-lettered once."""
    run, kw = _run(request, tmp_path, nc, nats_server, member_job_zip, run=RoutedMixedRun, seconds=8.0,
                   messages=3_200)
    print(f"routes: all -> {run.config.sink}, latest -> {run.latest_kind}")
    await run.run()
    stats = await run.check(kw["pg_params"])
    print(run.report(), stats)
    assert stats["jobs"].get("backfill") and stats["dead_lettered"], run.report()
