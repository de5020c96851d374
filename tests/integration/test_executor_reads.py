"""Batches read by Spark's tasks (``--read executors``): the driver's plans against a real
nats-server (every message in exactly one planned range, never more than asked), and through
real spark-submit a batch whose ack did not take effect before a crash, computed again
without its committed inputs (an aggregation: each order counted once), a poison message
dead-lettered by the tasks, and credentials that Spark never shows. The randomized fault
runs with executor reads are in ``test_member_job_chaos.py``."""

from __future__ import annotations

import asyncio
import base64
import json
import random
from pathlib import Path

import pytest

from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.jetstream.direct_gets import (
    ALL,
    PartitionReader,
    ReadRange,
    plan_ranges,
    subject_filter,
)
from airflow_provider_cg.core.jetstream.publish import publish_many
from airflow_provider_cg.core.landing.sinks.lake.reader import read_committed
from tests.support.member_job import (
    assert_each_order_counted_once,
    create_group,
    publish_orders,
    start_member_job,
    wq_messages,
)

pytestmark = [pytest.mark.integration]

TRANSFORMS = Path(__file__).resolve().parents[1] / "support" / "transforms.py"
SCHEMA = "order_id BIGINT, customer STRING, amount DOUBLE, status STRING, items ARRAY<STRING>"


async def _plan_all(reader: PartitionReader, starts: dict[int, tuple[str, int]], count: int, splits: int):
    """Plan batch after batch until nothing is left; read every range in ``splits`` parts as
    the tasks do. Returns the sequences read per partition, in reading order."""
    got: dict[int, list[int]] = {p: [] for p in starts}
    starts = dict(starts)
    last = int((await JsApi(reader.nc).stream_info(reader.stream))["state"]["last_seq"])
    batches = 0
    while True:
        ranges, cut = await plan_ranges(reader, starts, count, last)
        if not ranges:
            return got, batches
        batches += 1
        assert 0 < sum(r.messages for r in ranges) <= count
        for r in ranges:
            assert r.last_seq == cut and r.first_seq >= starts[r.partition][1]
            read = 0
            for part in r.split(splits):
                b = await reader.read_range(part.subject, part.first_seq, part.last_seq, part.messages)
                seqs = [int(h.split(b"Nats-Sequence: ")[1].split(b"\r\n")[0]) for h in b.hdrs]
                assert all(part.first_seq <= q <= part.last_seq for q in seqs)
                got[r.partition] += seqs
                read += len(seqs)
            assert read == r.messages  # nothing stored meanwhile: the server's count is exact
        starts = {p: (s, cut + 1) for p, (s, _) in starts.items()}


async def test_planned_ranges_hold_every_message_once_and_never_more_than_asked(nc):
    await create_group(nc, "PL", "g", partitions=6, members=("m1", "m2", "m3"), subjects_prefix="pl")
    await publish_orders(nc, "PL", "g", 5_000, 97, subjects_prefix="pl")
    reader = PartitionReader(nc, "PL-g")
    try:
        # a member holding everything reads the stream unfiltered; a partial one its partitions
        whole, batches = await _plan_all(reader, {ALL: (subject_filter(ALL), 0)}, 700, 3)
        assert whole[ALL] == list(range(1, 5_001)) and batches == 8
        partial, _ = await _plan_all(reader, {0: ("0.>", 0), 3: ("3.>", 0)}, 450, 2)
        for p, seqs in partial.items():
            b = await reader.read(p, 0, 10_000)
            want = [int(h.split(b"Nats-Sequence: ")[1].split(b"\r\n")[0]) for h in b.hdrs]
            assert seqs == want and want  # in stream order, each once
        # an origin with other subjects among the member's (a static member's filter subjects)
        await nc.jetstream().add_stream(name="ST", subjects=["st.>", "x.>"], allow_direct=True)
        rnd = random.Random(5)
        subjects = [rnd.choice(["st.a.1", "st.b.2", "x.c", "st.a.9"]) for _ in range(3_000)]
        await publish_many(nc, ((s, b"%d" % i) for i, s in enumerate(subjects)))
        origin = PartitionReader(nc, "ST")
        try:
            got, _ = await _plan_all(origin, {0: ("st.a.*", 0), 1: ("st.b.2", 0)}, 333, 4)
        finally:
            await origin.close()
        assert got[0] == [i + 1 for i, s in enumerate(subjects) if s.startswith("st.a.")]
        assert got[1] == [i + 1 for i, s in enumerate(subjects) if s == "st.b.2"]
    finally:
        await reader.close()


def _order(i: int) -> bytes:
    if i == POISON_AT:
        return b'{"order_id": "not a number"'
    rnd = random.Random(i)
    return json.dumps({"order_id": i, "customer": f"c{i % 30}", "amount": round(rnd.uniform(1, 100), 2),
                       "status": "paid", "items": []}).encode()


POISON_AT = 501
PASSWORD = "pw-EXEC-5e1c7a9d03b2"


@pytest.mark.spark
async def test_a_batch_whose_ack_did_not_take_effect_is_computed_again_without_its_committed_inputs(
        member_job_zip, tmp_path):
    """m1 holds two of four partitions: killed between their two purges, its batch is committed
    by the next run's recovery while one partition's range is still in the work queue. The next
    run's tasks read that range again; the batch's inputs turn out committed, and it is computed
    without them, so every order is counted once by the per-batch aggregation. A message that
    is not JSON of the schema goes to the dead-letter stream from the tasks, raw. The server
    wants a password: the tasks get it with the job's pickled source, not through options,
    properties or environment, so neither the jobs' output nor Spark's event log (properties,
    plans, task metrics) holds it."""
    from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings
    from airflow_provider_cg.core.tools.server import EmbeddedNatsServer

    server = EmbeddedNatsServer(tmp_path / "nats",
                                config_extra=f'authorization {{ user: "u1", password: "{PASSWORD}" }}').start()
    events = tmp_path / "events"
    events.mkdir()

    def job(member, name, failpoint=None):
        env = {"CG_NATS_USER": "u1", "CG_NATS_PASSWORD": PASSWORD, **({"CG_FAILPOINT": failpoint} if failpoint else {})}
        return start_member_job(member_job_zip, tmp_path / name, nats_servers=server.url, stream="TX",
                                group="g", member=member, sink_path=tmp_path / "lake", py_files=[TRANSFORMS],
                                args=["--payload-format", "json", "--json-schema", SCHEMA, "--batch-size", "250",
                                      "--standby-timeout", "30", "--read", "executors",
                                      "--transform", "transforms:totals_per_customer"], env=env,
                                spark_options=["--conf", "spark.eventLog.enabled=true", "--conf",
                                               f"spark.eventLog.dir={events}", "--conf", "spark.eventLog.compress=false"])

    nc = await NatsConnectionSettings(servers=[server.url], user="u1", password=PASSWORD).connect()
    try:
        await create_group(nc, "TX", "g", partitions=4, members=("m1", "m2"), subjects_prefix="tx")
        expected = await publish_orders(nc, "TX", "g", 1_200, 40, subjects_prefix="tx", payload=_order)
        seqs = sorted(seq for _, seq in expected)
        orders = {seq: json.loads(_order(i)) for i, seq in enumerate(seqs) if i != POISON_AT}

        crashed = await asyncio.to_thread(job("m1", "crash", "mid_ack").wait, 240)
        assert crashed.returncode != 0 and "cg failpoint mid_ack" in crashed.output, crashed.describe()
        rerun, other = await asyncio.gather(asyncio.to_thread(job("m1", "rerun").wait, 240),
                                            asyncio.to_thread(job("m2", "m2").wait, 240))
        for r in (rerun, other):
            assert r.returncode == 0 and "Traceback" not in r.output, r.describe()
            assert r.summary["read_path"] == "executors", r.summary
            assert PASSWORD not in r.output
        assert rerun.summary["recovered_committed"] == 1 and rerun.summary["duplicates_skipped"] > 0, rerun.summary
        assert "computing it without them" in rerun.output
        assert await wq_messages(nc, "TX", "g") == 0

        api = JsApi(nc)
        assert sum(r.summary["dead_lettered"] for r in (crashed, rerun, other) if r.summary) == 1
        dlq = await api.stream_info("TX-g-dlq")
        assert dlq["state"]["messages"] == 1
        msg = await api.get_msg("TX-g-dlq", dlq["state"]["first_seq"])
        assert base64.b64decode(msg["data"]) == _order(POISON_AT)
        assert f"Cg-Origin-Seq: {seqs[POISON_AT]}" in base64.b64decode(msg["hdrs"]).decode()
    finally:
        await nc.close()
        server.cleanup()

    out = read_committed(tmp_path / "lake")
    assert_each_order_counted_once(out, orders)
    log = "".join(f.read_text(errors="replace") for f in events.rglob("*") if f.is_file())
    assert "cg_nats_ranges" in log and PASSWORD not in log


def test_a_workers_tasks_keep_one_connection_across_batches_and_replace_a_broken_one(nats_server, nats_settings):
    """Spark reuses its Python workers: a follower's tasks, batch after batch, read on the
    worker's one connection; after a server restart the next task connects again and reads all."""
    from airflow_provider_cg.core.landing.pipeline.nats_source import WORKER, batch_plan, read_split

    async def publish():
        nc = await nats_settings.connect()
        await JsApi(nc).add_stream({"name": "T", "subjects": ["0.t.*", "1.t.*", "2.t.*"], "storage": "file",
                                      "allow_direct": True})
        assert (await publish_many(nc, [(f"{i % 3}.t.k{i % 7}", b"x%d" % i) for i in range(300)])).published == 300
        await nc.close()

    asyncio.run(publish())
    settings = nats_settings.portable().to_dict()

    def read(first: int, last: int) -> list[int]:
        plan = json.loads(batch_plan([ReadRange(ALL, ">", first, last, last - first + 1)], stream="T", origin="T",
                                     group="g", member="m1", key_rules=[("*.t.*", (2,))], js_prefix="$JS.API",
                                     only=None, parallelism=1))
        return [s for b in read_split(plan, settings, plan["splits"][0]) for s in b.column("origin_seq").to_pylist()]

    connects = WORKER.connects
    try:
        assert read(1, 100) == list(range(1, 101))
        assert read(101, 200) == list(range(101, 201))
        assert WORKER.connects == connects + 1  # the second task used the first one's connection
        nats_server.restart()
        assert read(201, 300) == list(range(201, 301))  # the broken connection replaced, nothing lost
        assert WORKER.connects == connects + 2
    finally:
        WORKER.close()
