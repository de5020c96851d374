"""The member job through a real ``spark-submit --master local[2]``: elastic groups (50,000
messages over 500 keys, 4 partitions, 2 members, per sink) landed into
the Parquet lake and PostgreSQL exactly once and in per-key order, exclusive pinning, poison
messages in the dead-letter stream, and invalid input (exit status, field names, no secrets)."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets

import pytest

from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.jetstream.publish import publish_many
from airflow_provider_cg.core.tools.server import EmbeddedNatsServer, free_port
from tests.support.member_job import (
    assert_exactly_once,
    create_group,
    parquet_landed,
    postgres_landed,
    publish_orders,
    start_member_job,
    wq_messages,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

STREAM, GROUP = "ORDERS", "g1"


def _wait_all(*jobs, timeout: float = 240.0):
    return [job.wait(timeout) for job in jobs]


async def _wait_jobs(*jobs, timeout: float = 240.0):
    return await asyncio.to_thread(_wait_all, *jobs, timeout=timeout)


def _assert_ok(result, expect: str = "committed") -> dict:
    assert result.returncode == 0, result.describe()
    summary = result.summary
    assert summary is not None, result.describe()
    assert summary["result"] == expect, result.describe()
    return summary


async def test_two_members_land_50k_messages_in_parquet_exactly_once(nc, nats_server, member_job_zip, tmp_path):
    await create_group(nc, STREAM, GROUP, partitions=4, members=("m1", "m2"))
    expected = await publish_orders(nc, STREAM, GROUP, 50_000, 500)
    lake = tmp_path / "lake"
    jobs = [start_member_job(member_job_zip, tmp_path, nats_servers=nats_server.url, stream=STREAM, group=GROUP,
                             member=m, sink_path=lake, args=["--batch-size", "10000"]) for m in ("m1", "m2")]
    results = await _wait_jobs(*jobs)
    summaries = [_assert_ok(r) for r in results]

    assert_exactly_once(parquet_landed(lake), expected)
    assert sum(s["rows_written"] for s in summaries) == 50_000
    assert all(s["messages_read"] > 0 and s["duplicates_skipped"] == 0 for s in summaries)
    # m1 and m2 share the four partitions: each landed its own two
    parts = [set(s["partitions"]) for s in summaries]
    assert parts[0].isdisjoint(parts[1]) and parts[0] | parts[1] == {"0", "1", "2", "3"}
    assert await wq_messages(nc, STREAM, GROUP) == 0


@pytest.mark.postgres
async def test_two_members_land_in_postgres_exactly_once(nc, nats_server, member_job_zip, tmp_path, postgres_db):
    n = 50_000
    await create_group(nc, STREAM, GROUP, partitions=4, members=("m1", "m2"))
    expected = await publish_orders(nc, STREAM, GROUP, n, 500)
    env = {"CG_PG_DSN": postgres_db.dsn}
    jobs = [start_member_job(member_job_zip, tmp_path, nats_servers=nats_server.url, stream=STREAM, group=GROUP,
                             member=m, sink="postgres", args=["--batch-size", "10000", "--pg-table", "orders"],
                             env=env) for m in ("m1", "m2")]
    summaries = [_assert_ok(r) for r in await _wait_jobs(*jobs)]

    assert_exactly_once(postgres_landed(postgres_db.conn_params(), "orders"), expected)
    assert sum(s["rows_written"] for s in summaries) == n
    assert all(s["batches"] >= 2 for s in summaries)
    assert await wq_messages(nc, STREAM, GROUP) == 0
    for r in summaries:
        assert r["recovered_committed"] == r["recovered_aborted"] == 0


async def test_two_instances_of_one_member_only_one_consumes(nc, nats_server, member_job_zip, tmp_path):
    await create_group(nc, STREAM, GROUP, partitions=2, members=("m1",))
    expected = await publish_orders(nc, STREAM, GROUP, 5_000, 50)
    lake = tmp_path / "lake"
    # the pin decides, not Spark: both instances as plain Python drivers (--no-spark)
    jobs = [start_member_job(member_job_zip, tmp_path, nats_servers=nats_server.url, stream=STREAM, group=GROUP,
                             member="m1", sink_path=lake, args=["--standby-timeout", "4", "--batch-size", "1000"],
                             spark=False)
            for _ in range(2)]
    results = await _wait_jobs(*jobs)
    for r in results:
        assert r.returncode == 0, r.describe()
    outcomes = sorted(r.summary["result"] for r in results)
    # the loser waits as a standby: not-pinned, or empty once the winner released the pin at its end
    assert outcomes[0] == "committed" and outcomes[1] in ("empty", "not-pinned"), [r.summary for r in results]
    winner, loser = sorted((r.summary for r in results), key=lambda s: s["result"] != "committed")
    assert winner["rows_written"] == 5_000 and winner["pin_id"]
    assert loser["messages_read"] == loser["rows_written"] == 0
    assert_exactly_once(parquet_landed(lake), expected)
    assert await wq_messages(nc, STREAM, GROUP) == 0


@pytest.mark.parametrize("read", ["auto", "consumer"])  # executors: test_executor_reads.py
async def test_poison_message_is_dead_lettered_and_the_rest_commits(nc, nats_server, member_job_zip, tmp_path, read):
    """Direct reads dead-letter a message that fails to decode at once (a direct get is no
    delivery; decoding is deterministic); reads through the consumer retry it up to
    max_deliver first."""
    await create_group(nc, STREAM, GROUP, partitions=2, members=("m1",))
    n, poison_at = 300, 137
    expected = await publish_orders(
        nc, STREAM, GROUP, n, 10, payload=lambda i: b"{not json" if i == poison_at else b'{"id":%d}' % i)
    poison_key = (STREAM, min(seq for _, seq in expected) + poison_at)
    del expected[poison_key]
    lake = tmp_path / "lake"
    job = start_member_job(member_job_zip, tmp_path, nats_servers=nats_server.url, stream=STREAM, group=GROUP,
                           member="m1", sink_path=lake,
                           args=["--payload-format", "json", "--json-schema", "id BIGINT NOT NULL",
                                 "--max-deliver", "3", "--batch-size", "100", "--read", read])
    (result,) = await _wait_jobs(job)
    summary = _assert_ok(result)
    assert summary["read_path"] == ("direct" if read == "auto" else read), summary
    deliveries = 3 if read == "consumer" else 1
    assert summary["dead_lettered"] == 1 and summary["poison_deliveries"] == deliveries, summary
    assert summary["rows_written"] == n - 1
    assert_exactly_once(parquet_landed(lake), expected)
    assert await wq_messages(nc, STREAM, GROUP) == 0

    api = JsApi(nc)
    dlq = await api.stream_info(f"{STREAM}-{GROUP}-dlq")
    assert dlq["state"]["messages"] == 1
    msg = await api.get_msg(f"{STREAM}-{GROUP}-dlq", dlq["state"]["first_seq"])
    assert base64.b64decode(msg["data"]) == b"{not json"
    headers = base64.b64decode(msg["hdrs"]).decode()
    assert f"Cg-Origin-Seq: {poison_key[1]}" in headers
    assert f"Cg-Origin-Stream: {STREAM}" in headers
    assert read != "consumer" or "Cg-Deliveries: 3" in headers
    error = next(line for line in headers.splitlines() if line.startswith("Cg-Error:"))
    assert len(error) > len("Cg-Error: "), headers


async def test_invalid_input_exit_codes_and_no_secret_in_output(member_job_zip, tmp_path):
    marker = "pw-" + secrets.token_hex(12)
    wrong = "wrong-" + secrets.token_hex(12)
    with EmbeddedNatsServer(tmp_path / "auth-nats",
                            config_extra=f'authorization {{ user: "u", password: "{marker}" }}') as server:
        from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings

        nc = await NatsConnectionSettings(servers=[server.url], user="u", password=marker).connect()
        try:
            await create_group(nc, STREAM, GROUP, partitions=2, members=("m1",))
            expected = await publish_orders(nc, STREAM, GROUP, 500, 20)
        finally:
            await nc.close()
        auth = {"CG_NATS_USER": "u", "CG_NATS_PASSWORD": marker}
        common = dict(stream=STREAM, group=GROUP, member="m1")
        no_path = start_member_job(member_job_zip, tmp_path / "nopath", nats_servers=server.url, env=auth, **common)
        down = start_member_job(member_job_zip, tmp_path / "down", nats_servers=f"nats://127.0.0.1:{free_port()}",
                                sink_path=tmp_path / "lake-down", env=auth, **common)
        bad_pw = start_member_job(member_job_zip, tmp_path / "badpw", nats_servers=server.url,
                                  sink_path=tmp_path / "lake-bad", env={"CG_NATS_USER": "u", "CG_NATS_PASSWORD": wrong},
                                  **common)
        good = start_member_job(member_job_zip, tmp_path / "good", nats_servers=server.url,
                                sink_path=tmp_path / "lake", env=auth, **common)
        r_no_path, r_down, r_bad, r_good = await _wait_jobs(no_path, down, bad_pw, good)

    assert r_no_path.returncode == 1, r_no_path.describe()
    assert "sink-path: required" in r_no_path.output and r_no_path.summary is None
    assert r_down.returncode == 2, r_down.describe()
    assert "cannot reach NATS at nats://127.0.0.1:" in r_down.output and "connection refused" in r_down.output
    assert r_bad.returncode == 2, r_bad.describe()
    _assert_ok(r_good)
    assert_exactly_once(parquet_landed(tmp_path / "lake"), expected)
    for r, secret in ((r_no_path, marker), (r_down, marker), (r_bad, wrong), (r_good, marker)):
        assert secret not in r.stdout and secret not in r.stderr, r.describe()
        assert not any(secret in arg for arg in r.cmd)
    assert json.dumps(r_good.summary).find(marker) == -1



@pytest.mark.parametrize("direct", [True, False], ids=["direct-gets", "consumer"])
async def test_static_group_keeps_its_position_across_runs(direct, nc, nats_server, member_job_zip, tmp_path):
    """A static member's durable is created without an inactivity threshold (the server would
    delete it when idle, and a new one replays the stream): a second run, started right after
    the first (which released its pin), takes only what came since, exactly once and in order.
    With direct gets on the origin the job reads past its durable and moves it after each
    batch; either way the durable ends where orbit's tools expect it: everything acked. The
    stream also stores subjects outside the group (``x.st.*``, which a member holding every
    partition's ``*.st.*`` read matches): they are not the group's and are not landed. With
    direct gets the second run is ``--read executors``: Spark's tasks read the origin
    unfiltered and drop those themselves. The first runs are the Python driver alone (the
    protocol is the same; a JVM start each would only cost time)."""
    from airflow_provider_cg.core.groups.config import StaticGroupConfig

    await JsApi(nc).add_stream({"name": "ST", "subjects": ["st.*", "x.st.*"], "allow_direct": direct,
                                "subject_transform": {"src": "st.*", "dest": "{{Partition(2,1)}}.st.{{Wildcard(1)}}"}})
    await ConsumerGroups(nc).create("ST", "g", StaticGroupConfig(2, ("st.*",), members=("m1",)))
    lake = tmp_path / "lake"

    async def publish(n: int, prefix: str = "st") -> dict:
        res = await publish_many(nc, ((f"{prefix}.k{i % 20}", b'{"i":%d}' % i) for i in range(n)))
        assert res.published == n
        return {("ST", res.first_seq + i): f"st.k{i % 20}" for i in range(n)}  # static: the key is the subject

    async def durable_done(last: int) -> None:
        info = await JsApi(nc).consumer_info("ST", "g-m1")
        assert info is not None and not info["config"].get("inactive_threshold"), info["config"]
        assert (info["num_pending"], info["num_ack_pending"], info["ack_floor"]["stream_seq"]) == (0, 0, last), info

    expected = await publish(250)
    await publish(50, "x.st")  # not the group's
    expected |= await publish(250)
    (r1,) = await _wait_jobs(start_member_job(member_job_zip, tmp_path, nats_servers=nats_server.url, stream="ST",
                                              group="g", member="m1", sink_path=lake, spark=False,
                                              args=["--batch-size", "120"]))
    s1 = _assert_ok(r1)
    assert s1["messages_read"] == 500 and s1["read_path"] == ("direct" if direct else "consumer"), s1
    if not direct:  # no silent slow path: a warning and the summary say why, and what to do
        assert "allow_direct is off" in s1["read_path_reason"] and "--allow-direct" in s1["read_path_reason"], s1
        assert "reads through the consumer, the slow path" in r1.output, r1.describe()
    else:
        assert s1["read_path_reason"] is None, s1
    await durable_done(550)
    expected |= await publish(20)
    await publish(10, "x.st")
    expected |= await publish(10)
    read = "executors" if direct else "consumer"
    (r2,) = await _wait_jobs(start_member_job(member_job_zip, tmp_path, nats_servers=nats_server.url, stream="ST",
                                              group="g", member="m1", sink_path=lake, spark=direct,
                                              args=["--read", read]))
    s2 = _assert_ok(r2)
    assert s2["messages_read"] == 30 and s2["duplicates_skipped"] == 0 and s2["read_path"] == read, s2
    await durable_done(590)
    assert_exactly_once(parquet_landed(lake), expected)


async def test_a_static_durable_that_cannot_be_moved_is_read_through(nc, nats_server, member_job_zip, tmp_path):
    """A member's durable made by someone else with ``deliver_policy: new`` refuses to be moved
    (the server allows a reset only from ``all`` or a start sequence/time): the job reads it
    through the consumer instead, landing what the durable delivers, exactly once."""
    from airflow_provider_cg.core.groups.config import StaticGroupConfig

    api, groups = JsApi(nc), ConsumerGroups(nc)
    await api.add_stream({"name": "SN", "subjects": ["sn.*"], "allow_direct": True,
                          "subject_transform": {"src": "sn.*", "dest": "{{Partition(2,1)}}.sn.{{Wildcard(1)}}"}})
    config = StaticGroupConfig(2, ("sn.*",), members=("m1",))
    await groups.create("SN", "g", config)
    await publish_many(nc, ((f"sn.k{i}", b"{}") for i in range(20)))  # before the durable: not delivered
    _, cc = groups.member_consumer_config("SN", "g", "m1", config, ack_wait=5.0)
    await api.create_consumer("SN", {**cc, "deliver_policy": "new"})
    res = await publish_many(nc, ((f"sn.k{i % 7}", b"{}") for i in range(90)))
    expected = {("SN", res.first_seq + i): f"sn.k{i % 7}" for i in range(90)}
    (r,) = await _wait_jobs(start_member_job(member_job_zip, tmp_path, nats_servers=nats_server.url, stream="SN",
                                             group="g", member="m1", sink_path=tmp_path / "lake", spark=False))
    s = _assert_ok(r)
    assert s["read_path"] == "consumer" and s["messages_read"] == 90, s
    assert "cannot be moved" in r.output, r.describe()
    assert "cannot be moved" in s["read_path_reason"] and "deliver_policy all" in s["read_path_reason"], s
    assert_exactly_once(parquet_landed(tmp_path / "lake"), expected)


async def test_the_job_closes_its_sink_when_the_run_ends_and_when_it_fails(nc, nats_server, tmp_path, monkeypatch):
    """The job's process ends without the interpreter's teardown (``_end``), so nothing may rely on
    it: the sink (a database session, for one) is closed by the run itself, also when it fails."""
    import importlib.util

    from airflow_provider_cg.core.errors import ConsumerGroupError
    from airflow_provider_cg.core.landing.contract import MemberJobSpec
    from airflow_provider_cg.core.landing.pipeline.processing import ArrowPipeline
    from airflow_provider_cg.core.landing.sinks import ParquetLakeSink
    from airflow_provider_cg.core.tools.packaging import member_job_path

    loaded = importlib.util.spec_from_file_location("cg_member_job_under_test", member_job_path())
    job = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(job)
    await create_group(nc, STREAM, GROUP, partitions=2, members=("m1",))
    expected = await publish_orders(nc, STREAM, GROUP, 300, 20)
    monkeypatch.setenv("CG_NATS_SERVERS", nats_server.url)
    lake = tmp_path / "lake"
    closed: list[str] = []

    class Recorded(ParquetLakeSink):
        failing = False

        def stream_life(self, *args, **kwargs):  # the run's first look at the table, before the pin
            if self.failing:
                raise ConsumerGroupError("the table went away")
            return super().stream_life(*args, **kwargs)

        def close(self) -> None:
            closed.append("failed" if self.failing else "ended")

    def spec(*extra: str):
        return MemberJobSpec.from_argv(["--stream", STREAM, "--group", GROUP, "--member", "m1", "--sink", "parquet",
                                        "--sink-path", str(lake), "--no-spark", *extra])

    broken = Recorded(lake)
    broken.failing = True
    with pytest.raises(ConsumerGroupError, match="went away"):
        await job._run(spec("--max-seconds", "20"), lambda: broken, ArrowPipeline())
    summary = await job._run(spec(), lambda: Recorded(lake), ArrowPipeline())
    assert closed == ["failed", "ended"]
    assert summary.result == "committed" and summary.messages_read == 300, summary
    assert_exactly_once(parquet_landed(lake), expected)
