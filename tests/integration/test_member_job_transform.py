"""The user's transformation inside the exactly-once boundary, through real spark-submit:
a filter, an explode, a join with reference data, a per-batch aggregation (into PostgreSQL,
its rows committed with their input keys) and a SQL statement each land every message's
effect once (row-wise ones in per-key order) when the job is SIGKILLed at a step of a batch
(every step meets one kind), from outside at a random moment (the kinds whose output is not
one row per input: explode, aggregation), or, for the SQL statement, through a takeover and a
server restart; a failing transformation fails the batch before any acknowledgement."""

from __future__ import annotations

import asyncio
import json
import random
import re
import signal
from collections import Counter
from pathlib import Path

import pytest

from airflow_provider_cg.core.landing.sinks.lake.reader import read_committed
from tests.support.member_job import (
    assert_each_order_counted_once,
    create_group,
    publish_orders,
    start_member_job,
    wq_messages,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

TRANSFORMS = Path(__file__).resolve().parents[1] / "support" / "transforms.py"
SCHEMA = "order_id BIGINT, customer STRING, amount DOUBLE, status STRING, items ARRAY<STRING>"
N = 1200


def _order(i: int) -> bytes:
    rnd = random.Random(i)
    return json.dumps({"order_id": i, "customer": f"c{i % 30}", "amount": round(rnd.uniform(1, 100), 2),
                       "status": "cancelled" if i % 10 == 3 else "paid",
                       "items": [f"sku{rnd.randrange(50)}" for _ in range(rnd.randrange(4))]}).encode()


async def _setup(nc, stream: str):
    await create_group(nc, stream, "g", partitions=3, members=("m1",), subjects_prefix=stream.lower())
    expected = await publish_orders(nc, stream, "g", N, 30, subjects_prefix=stream.lower(), payload=_order)
    orders = {seq: json.loads(_order(i)) for i, (_, seq) in enumerate(sorted(expected))}
    return orders


def _job(zip_path, tmp_path, nats_server, stream, transform_args, failpoint=None, name=None, env=None):
    """One spark-submit of m1; the Parquet lake unless ``transform_args`` name another sink."""
    sink_path = None if "--sink" in transform_args else tmp_path / "lake"
    return start_member_job(zip_path, tmp_path / (name or "run"), nats_servers=nats_server.url, stream=stream,
                            group="g", member="m1", sink_path=sink_path, py_files=[TRANSFORMS],
                            args=["--payload-format", "json", "--json-schema", SCHEMA, "--batch-size", "300",
                                  "--standby-timeout", "30", *transform_args],
                            env={**(env or {}), **({"CG_FAILPOINT": failpoint} if failpoint else {})})


STEPS = ("mid_prepare", "after_prepare", "mid_ack", "before_commit")
#: Every step is the same two-phase code (core/landing/protocol/two_phase.py) whatever the transformation;
#: what a kind changes is what lands (output rows, input keys). So each kind is killed at one
#: step, every step at one kind (4 crash runs instead of 16: the chain of JVM starts is what
#: these tests cost); the kinds whose rows are not one per input (explode, the aggregation) are
#: then SIGKILLed from outside at a random moment too.
STEPS_OF = {"filter": ("mid_prepare",), "explode": ("after_prepare",), "join": ("mid_ack",),
            "aggregation": ("before_commit",)}
assert Counter(s for steps in STEPS_OF.values() for s in steps) == dict.fromkeys(STEPS, 1)


async def _through_every_fault(nc, nats_server, zip_path, tmp_path, stream, transform_args, seed, steps,
                               outside_kill: bool = True, env=None):
    """SIGKILL at the given steps of a batch (one run per step, each recovering the previous one's
    write), then (``outside_kill``) a run SIGKILLed from outside at a random moment once it is
    landing, then a run to the end: every message acknowledged, no traceback."""
    for step in steps:
        crashed = await asyncio.to_thread(_job(zip_path, tmp_path, nats_server, stream, transform_args, step,
                                               f"crash-{step}", env).wait, 240)
        assert crashed.returncode != 0 and f"cg failpoint {step}" in crashed.output, crashed.describe()
    if outside_kill:
        await _killed_at_random(nc, nats_server, zip_path, tmp_path, stream, transform_args, seed, env)
    rerun = await asyncio.to_thread(_job(zip_path, tmp_path, nats_server, stream, transform_args, None,
                                         "rerun", env).wait, 240)
    assert rerun.returncode == 0 and "Traceback" not in rerun.output, rerun.describe()
    assert await wq_messages(nc, stream, "g") == 0  # every message acknowledged
    # it talked from its first second: a progress line before Spark's session had started
    lines = rerun.output.splitlines()
    talked = [i for i, ln in enumerate(lines) if "cg progress" in ln]
    started = [i for i, ln in enumerate(lines) if "cg Spark session started in" in ln]
    assert talked and started and talked[0] < started[0], "\n".join(lines[:40])
    assert re.search(r"waiting=(start|spark)$", lines[talked[0]]), lines[talked[0]]
    return rerun.summary


async def _killed_at_random(nc, nats_server, zip_path, tmp_path, stream, transform_args, seed, env=None):
    rnd = random.Random(seed)
    left = await wq_messages(nc, stream, "g")
    victim = _job(zip_path, tmp_path, nats_server, stream, transform_args, None, "killed", env)
    for _ in range(1200):  # until it landed a batch, then a random moment later
        if await wq_messages(nc, stream, "g") < left or not victim.running():
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(rnd.uniform(0, 0.5))
    victim.signal(signal.SIGKILL)
    await asyncio.to_thread(victim.wait, 60)


def _per_key_order(out) -> None:
    """Rows of one key appear in non-decreasing origin_seq (an explode repeats one) in commit order."""
    last: dict[str, int] = {}
    for key, seq in zip(out.column("key").to_pylist(), out.column("origin_seq").to_pylist(), strict=True):
        assert seq >= last.get(key, 0), f"key {key}: origin_seq {seq} after {last[key]}"
        last[key] = seq


async def test_filter_with_a_derived_column_through_every_fault(nc, nats_server, member_job_zip, tmp_path):
    orders = await _setup(nc, "TF")
    await _through_every_fault(nc, nats_server, member_job_zip, tmp_path, "TF", ["--transform", "transforms:keep_paid"],
                               11, STEPS_OF["filter"], outside_kill=False)
    out = read_committed(tmp_path / "lake")
    seqs = out.column("origin_seq").to_pylist()
    assert sorted(seqs) == sorted(s for s, o in orders.items() if o["status"] != "cancelled")  # once each
    _per_key_order(out)
    gross = dict(zip(seqs, out.column("gross").to_pylist(), strict=True))
    assert all(abs(gross[s] - orders[s]["amount"] * 1.2) < 1e-9 for s in seqs)


async def test_explode_through_every_fault(nc, nats_server, member_job_zip, tmp_path):
    orders = await _setup(nc, "TE")
    await _through_every_fault(nc, nats_server, member_job_zip, tmp_path, "TE",
                               ["--transform", "transforms:explode_items"], 12, STEPS_OF["explode"])
    out = read_committed(tmp_path / "lake")
    got = Counter(zip(out.column("origin_seq").to_pylist(), out.column("item").to_pylist(), strict=True))
    want = Counter((s, item) for s, o in orders.items() for item in o["items"])
    assert got == want  # every item of every order once: nothing lost, nothing twice
    _per_key_order(out)


async def test_join_with_reference_data_through_every_fault(nc, nats_server, member_job_zip, tmp_path):
    orders = await _setup(nc, "TJ")
    await _through_every_fault(nc, nats_server, member_job_zip, tmp_path, "TJ",
                               ["--transform", "transforms:join_regions"], 13, STEPS_OF["join"], outside_kill=False)
    out = read_committed(tmp_path / "lake")
    seqs = out.column("origin_seq").to_pylist()
    assert sorted(seqs) == sorted(orders)
    region = dict(zip(seqs, out.column("region").to_pylist(), strict=True))
    assert all(region[s] == ("north" if int(orders[s]["customer"][1:]) % 2 else "south") for s in seqs)


async def test_per_batch_aggregation_into_postgres_through_every_fault(nc, nats_server, member_job_zip, tmp_path,
                                                                    postgres_db):
    """The PostgreSQL sink: a transformation's rows into a table of its own columns, the input
    keys committed with them in the same prepared transaction, through a crash before the
    commit and a kill from outside."""
    import psycopg2

    orders = await _setup(nc, "TA")
    args = ["--sink", "postgres", "--pg-table", "customer_totals", "--transform", "transforms:totals_per_customer"]
    await _through_every_fault(nc, nats_server, member_job_zip, tmp_path, "TA", args, 14, STEPS_OF["aggregation"],
                               env={"CG_PG_DSN": postgres_db.dsn})
    with psycopg2.connect(**postgres_db.conn_params()) as conn, conn.cursor() as cur:
        cur.execute("SELECT customer, sum(orders), sum(total) FROM customer_totals GROUP BY customer")
        got = {c: (int(n), float(t)) for c, n, t in cur.fetchall()}
        cur.execute("SELECT count(*) FROM customer_totals")
        rows = cur.fetchone()[0]
        cur.execute("SELECT count(*), count(DISTINCT origin_seq) FROM cg_committed_inputs WHERE origin_stream = 'TA'")
        assert cur.fetchone() == (N, N)
    want: dict[str, list] = {}
    for o in orders.values():
        w = want.setdefault(o["customer"], [0, 0.0])
        w[0] += 1
        w[1] += o["amount"]
    assert {c: n for c, (n, _) in got.items()} == {c: n for c, (n, _) in want.items()}  # each order once
    assert all(abs(got[c][1] - want[c][1]) < 1e-6 for c in want)
    assert rows > len(want)  # per batch: a customer's row in every batch that had their orders


async def test_a_failing_transformation_fails_the_batch_before_any_ack(nc, nats_server, member_job_zip, tmp_path):
    await _setup(nc, "TB")
    r = await asyncio.to_thread(_job(member_job_zip, tmp_path, nats_server, "TB",
                                     ["--transform", "transforms:broken"]).wait, 240)
    assert r.returncode == 1, r.describe()
    assert "cg_member_job: error: transform: RuntimeError: this transformation is broken on purpose" in r.output
    assert "Traceback" not in r.output.split("cg_member_job: error:")[-1]
    assert await wq_messages(nc, "TB", "g") == N  # nothing acknowledged: the next run gets them all
    assert not (tmp_path / "lake").exists() or read_committed(tmp_path / "lake").num_rows == 0


async def test_sql_aggregation_through_a_takeover_and_a_server_restart(nc, nats_server, member_job_zip, tmp_path):
    """A per-batch aggregation in a SQL statement (``--transform-sql``) while the pin moves (a
    step-down: the pinned run stops, the next one takes over) and then, in that next run, the
    nats-server restarts mid-batch (one test for both faults, to spare JVM starts): every order
    counted once across the runs."""
    from airflow_provider_cg.core.groups.admin import ConsumerGroups

    stream, n = "TK", 3000  # 15 batches: three before the step-down, the restart a few batches into the next run
    await create_group(nc, stream, "g", partitions=3, members=("m1",), subjects_prefix=stream.lower())
    expected = await publish_orders(nc, stream, "g", n, 30, subjects_prefix=stream.lower(), payload=_order)
    orders = {seq: json.loads(_order(i)) for i, (_, seq) in enumerate(sorted(expected))}
    args = ["--transform-sql", "SELECT value.customer AS customer, count(*) AS orders, sum(value.amount) AS total "
                               "FROM batch GROUP BY value.customer", "--batch-size", "200", "--ack-wait", "10"]

    async def until_landed(job, count: int) -> None:
        for _ in range(600):  # until that many landed (some batches)
            if await wq_messages(nc, stream, "g") <= n - count or not job.running():
                return
            await asyncio.sleep(0.1)

    first = _job(member_job_zip, tmp_path, nats_server, stream, args, None, "first")
    await until_landed(first, 600)
    await ConsumerGroups(nc).step_down(stream, "g", "m1")
    r1 = await asyncio.to_thread(first.wait, 240)
    assert "Traceback" not in r1.output.split("cg pinned")[-1], r1.describe()
    left = await wq_messages(nc, stream, "g")
    assert left > 0, "the first run landed everything before the step-down: the fault hit nothing"
    second = _job(member_job_zip, tmp_path, nats_server, stream, args, None, "second")
    await until_landed(second, n - left + 600)
    assert second.running(), "the second run ended before the server restart\n" + second.wait(5).describe()
    await asyncio.to_thread(nats_server.restart)
    r2 = await asyncio.to_thread(second.wait, 240)
    assert "Traceback" not in r2.output.split("cg pinned")[-1], r2.describe()
    if await wq_messages(nc, stream, "g") > 0:
        r3 = await asyncio.to_thread(_job(member_job_zip, tmp_path, nats_server, stream, args, None, "third").wait, 240)
        assert r3.returncode == 0, r3.describe()
    assert await wq_messages(nc, stream, "g") == 0
    out = read_committed(tmp_path / "lake")
    assert_each_order_counted_once(out, orders)
