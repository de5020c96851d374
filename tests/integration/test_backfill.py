"""run_backfill against a real nats-server: exactly the window, idempotent, rows as live ones."""

from __future__ import annotations

import asyncio
import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter, StaticGroupConfig
from airflow_provider_cg.core.groups.partitioning import assign_partitions
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.jetstream.publish import publish_many
from airflow_provider_cg.core.landing import contract
from airflow_provider_cg.core.landing.contract import BatchOptions
from airflow_provider_cg.core.landing.pipeline.held_inputs import committed_inputs
from airflow_provider_cg.core.landing.pipeline.processing import ArrowPipeline, ProcessedBatch
from airflow_provider_cg.core.landing.run.backfill import _ns, run_backfill, window_has_messages
from airflow_provider_cg.core.landing.run.member import run_member_batch
from airflow_provider_cg.core.landing.sinks.lake.reader import read_committed
from airflow_provider_cg.core.landing.sinks.lake.writer import ParquetLakeSink
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import keys_by_stream
from airflow_provider_cg.core.tools.packaging import member_job_path

pytestmark = pytest.mark.integration

COMPARED = ["origin_stream", "origin_seq", "subject", "partition", "key", "payload", "headers", "group", "member"]
MEMBERS = ("m1", "m2")


def ts_ns(iso: str) -> int:
    """Nanoseconds since the epoch of an RFC 3339 time with up to 9 fraction digits."""
    head, _, frac = iso.rstrip("Z").partition(".")
    whole = dt.datetime.fromisoformat(head).replace(tzinfo=dt.UTC)
    return int(whole.timestamp()) * 10**9 + int((frac or "0").ljust(9, "0")[:9])


def from_ns(ns: int) -> dt.datetime:
    """A datetime at or before ``ns`` (microsecond precision)."""
    return dt.datetime.fromtimestamp(ns // 1000 / 1e6, dt.UTC)


async def make_group(nc, kind: str) -> tuple[str, str]:
    api = JsApi(nc)
    if kind == "elastic":
        await api.add_stream({"name": "O", "subjects": ["foo.*"], "storage": "file"})
        cfg = ElasticGroupConfig(4, (PartitioningFilter("foo.*", (1,)),), members=MEMBERS)
        await ConsumerGroups(nc).create("O", "g", cfg)
        return "O", "foo"
    await api.add_stream({"name": "S", "subjects": ["bar.*"], "storage": "file",
                          "subject_transform": {"src": "bar.*", "dest": "{{partition(4,1)}}.bar.{{wildcard(1)}}"}})
    await ConsumerGroups(nc).create("S", "g", StaticGroupConfig(4, ("bar.*",), members=MEMBERS))
    return "S", "bar"


async def publish_phases(nc, prefix: str, per_phase: int = 12) -> None:
    for phase in range(3):
        msgs = []
        for i in range(per_phase):
            headers = {"X-Phase": str(phase)} if i % 3 == 0 else None
            msgs.append((f"{prefix}.k{phase}{i % 5}", f"{phase}-{i}".encode(), headers) if headers
                        else (f"{prefix}.k{phase}{i % 5}", f"{phase}-{i}".encode()))
        await publish_many(nc, msgs)
        await asyncio.sleep(0.4)


async def stored_times(nc, stream: str) -> dict[int, int]:
    api = JsApi(nc)
    last = (await api.stream_info(stream))["state"]["last_seq"]
    return {seq: ts_ns((await api.get_msg(stream, seq))["time"]) for seq in range(1, last + 1)}


async def live_consume(nc, sink, stream: str) -> int:
    done = 0
    for m in MEMBERS:
        opts = BatchOptions(stream=stream, group="g", member=m, batch_size=7, standby_timeout=5, idle_timeout=0.5)
        done += (await run_member_batch(nc, sink, opts)).messages_read
    return done


def rows_by_seq(path) -> dict[int, dict]:
    table = read_committed(path)
    assert len(set(table.column("origin_seq").to_pylist())) == table.num_rows, "duplicate rows"
    return {r["origin_seq"]: {k: r[k] for k in COMPARED} for r in table.select(COMPARED).to_pylist()}


@pytest.mark.parametrize("kind", ["elastic", "static"])
async def test_backfill_window_is_exact_idempotent_and_equal_to_live_rows(nc, tmp_path, kind):
    stream, prefix = await make_group(nc, kind)
    await publish_phases(nc, prefix)
    times = await stored_times(nc, stream)
    seqs = sorted(times)
    # The window starts at the first phase-2 message and ends at the first phase-3 one.
    start, end = from_ns(times[seqs[12]]), from_ns(times[seqs[24]])
    expected = {q for q, t in times.items() if _ns(start) <= t < _ns(end)}
    assert expected == set(seqs[12:24])

    # Whether a window holds messages is known without reading it (no Spark for empty ones).
    assert await window_has_messages(nc, stream, "g", start, end)
    assert await window_has_messages(nc, stream, "g", start, start + dt.timedelta(microseconds=1))
    gap = from_ns(times[seqs[11]] + 1000), start  # between phases 1 and 2 (0.4 s apart)
    assert not await window_has_messages(nc, stream, "g", *gap)
    assert not await window_has_messages(nc, stream, "g", from_ns(times[seqs[-1]] + 1000),
                                         dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))

    lake = tmp_path / "backfill"
    sink = ParquetLakeSink(lake, fsync=False)
    # Nothing consumed yet: every partition's position is before the window, so the window's
    # messages are left to the members (who land them in order), none landed here.
    s0 = await run_backfill(nc, sink, stream, "g", start, end, batch_size=5)
    assert (s0.rows_written, s0.left_to_members, s0.messages_read) == (0, 12, 12)

    # Live consumption of the whole stream into another lake; the window then holds only
    # messages the group has passed.
    live_lake = tmp_path / "live"
    assert await live_consume(nc, ParquetLakeSink(live_lake, fsync=False), stream) == 36
    s1 = await run_backfill(nc, sink, stream, "g", start, end, batch_size=5)
    assert (s1.result, s1.rows_written, s1.messages_read, s1.batches) == ("committed", 12, 12, 3)
    assert s1.left_to_members == 0
    assert s1.stop_reason == "window end"
    landed = rows_by_seq(lake)
    assert set(landed) == expected

    # Re-running the window (string bounds this time) adds nothing.
    s2 = await run_backfill(nc, sink, stream, "g", start.isoformat(), end.isoformat())
    assert (s2.rows_written, s2.duplicates_skipped) == (0, 12)
    assert rows_by_seq(lake) == landed

    # Live consumption landed the same rows.
    live = rows_by_seq(live_lake)
    assert set(live) == set(seqs)
    assert {q: live[q] for q in expected} == landed
    assert any(r["headers"] for r in landed.values())
    owners = {p: m for m, ps in assign_partitions((await ConsumerGroups(nc).get(stream, "g")).config).items()
              for p in ps}
    assert all(r["member"] == owners[r["partition"]] for r in landed.values())

    # A window open at the end stops at the origin's last sequence; everything already there.
    s3 = await run_backfill(nc, sink, stream, "g", from_ns(times[seqs[0]]), dt.datetime.now(dt.UTC)
                            + dt.timedelta(hours=1))
    assert (s3.rows_written, s3.duplicates_skipped) == (24, 12)
    assert set(rows_by_seq(lake)) == set(seqs)


async def test_backfill_overlapping_live_consumption_adds_no_duplicates(nc, tmp_path):
    stream, prefix = await make_group(nc, "elastic")
    await publish_phases(nc, prefix, per_phase=6)
    times = await stored_times(nc, stream)
    lake = tmp_path / "lake"
    sink = ParquetLakeSink(lake, fsync=False)
    assert await live_consume(nc, sink, stream) == 18
    s = await run_backfill(nc, sink, stream, "g", from_ns(min(times.values())), from_ns(max(times.values()) + 1000))
    assert (s.messages_read, s.rows_written, s.duplicates_skipped) == (18, 0, 18)
    table = read_committed(lake)
    assert table.num_rows == 18
    assert pc.count_distinct(table.column("origin_seq")).as_py() == 18


async def test_empty_window_and_bad_bounds(nc, tmp_path):
    stream, prefix = await make_group(nc, "elastic")
    sink = ParquetLakeSink(tmp_path / "lake", fsync=False)
    t0 = dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)
    s = await run_backfill(nc, sink, stream, "g", t0, t0 + dt.timedelta(hours=1))
    assert (s.result, s.messages_read) == ("empty", 0)
    await publish_many(nc, [(f"{prefix}.a", b"x")])
    s = await run_backfill(nc, sink, stream, "g", t0, t0 + dt.timedelta(hours=1))
    assert (s.result, s.messages_read, s.stop_reason) == ("empty", 0, "window end")
    from airflow_provider_cg.core.errors import ConfigError

    with pytest.raises(ConfigError):
        await run_backfill(nc, sink, stream, "g", t0, t0)
    # No consumer is left behind on the origin.
    assert await JsApi(nc).list_consumers(stream) == []


def _job():
    import importlib.util

    path = member_job_path()
    spec = importlib.util.spec_from_file_location("cg_member_job_backfill_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_job_backfill_mode_arguments(tmp_path):
    from airflow_provider_cg.core.errors import ConfigError
    from airflow_provider_cg.core.landing.contract import MemberJobSpec

    lake = ["--sink-path", str(tmp_path / "lake")]
    spec = MemberJobSpec.from_argv(["--stream", "O", "--group", "g", "--backfill-start", "2026-01-01T00:00:00Z",
                                    "--backfill-end", "2026-01-01T01:00:00Z", *lake])
    assert spec.backfill and spec.member is None
    assert not MemberJobSpec.from_argv(["--stream", "O", "--group", "g", "--member", "m1", *lake]).backfill
    for argv, field in ((["--stream", "O", "--group", "g", *lake], "member"),
                        (["--stream", "O", "--group", "g", "--backfill-start", "2026-01-01T00:00:00Z", *lake],
                         "backfill_end"),
                        (["--stream", "O", "--group", "g", "--backfill-start", "yesterday",
                          "--backfill-end", "2026-01-01T01:00:00Z", *lake], "backfill_start")):
        with pytest.raises(ConfigError) as e:  # exit 1 (invalid input), one line, from main()
            MemberJobSpec.from_argv(argv)
        assert e.value.field == field, e.value


async def test_job_backfill_mode_lands_the_window(nc, nats_settings, tmp_path, monkeypatch, capsys):
    import json

    stream, prefix = await make_group(nc, "elastic")
    await publish_phases(nc, prefix, per_phase=5)
    times = await stored_times(nc, stream)
    seqs = sorted(times)
    start, end = from_ns(times[seqs[5]]), from_ns(times[seqs[10]])
    await live_consume(nc, ParquetLakeSink(tmp_path / "live", fsync=False), stream)  # the group passed the window
    for k, v in nats_settings.to_env().items():
        monkeypatch.setenv(k, v)
    lake = tmp_path / "lake"
    argv = ["--stream", stream, "--group", "g", "--backfill-start", start.isoformat(),
            "--backfill-end", end.isoformat(), "--sink-path", str(lake), "--no-spark"]
    job = _job()
    rc = await asyncio.to_thread(job.main, argv)
    assert rc == contract.EXIT_OK
    line = capsys.readouterr().out.strip().splitlines()[-1]
    summary = json.loads(line.removeprefix(contract.SUMMARY_PREFIX))
    assert (summary["result"], summary["rows_written"], summary["member"]) == ("committed", 5, "backfill")
    assert summary["window_start"] == start.isoformat() and summary["window_end"] == end.isoformat()
    assert set(rows_by_seq(lake)) == set(seqs[5:10])
    # Bad bounds are invalid input (exit 1), not a crash.
    bad = [*argv[:4], "--backfill-start", end.isoformat(), "--backfill-end", start.isoformat(), *argv[8:]]
    assert await asyncio.to_thread(job.main, bad) == contract.EXIT_INVALID
    other = tmp_path / "lake-bad"
    for start_text in ("yesterday", end.isoformat()):  # not a time; after the end: nothing is created
        argv = ["--stream", stream, "--group", "g", "--backfill-start", start_text, "--backfill-end",
                start.isoformat(), "--sink-path", str(other), "--no-spark"]
        assert await asyncio.to_thread(job.main, argv) == contract.EXIT_INVALID
        assert not other.exists()
    assert "--backfill-start: must be an ISO 8601 date-time" in capsys.readouterr().err


async def test_a_window_of_only_poison_messages_is_skipped_not_a_crash(nc, tmp_path):
    """Every message of the window fails to decode (invalid UTF-8 for the text decoder): the
    backfill counts them skipped and ends with a summary; nothing is written."""
    from airflow_provider_cg.core.landing.pipeline.decode import text_decoder

    stream, prefix = await make_group(nc, "elastic")
    await publish_many(nc, [(f"{prefix}.k{i % 3}", b"\xff\xfe bad " + bytes([i])) for i in range(7)])
    times = await stored_times(nc, stream)
    lake = tmp_path / "lake"
    sink = ParquetLakeSink(lake, fsync=False)
    s = await run_backfill(nc, sink, stream, "g", from_ns(min(times.values())),
                           from_ns(max(times.values()) + 1000), batch_size=3, pipeline=ArrowPipeline(text_decoder()))
    assert (s.messages_read, s.skipped, s.rows_written, s.poison_deliveries) == (7, 7, 0, 7)
    assert read_committed(lake).num_rows == 0


class _CountPerKey:
    """A pipeline with a per-batch aggregation in the driver (no Spark in-process): messages per
    key, exactly-once per input as ``SparkPipeline`` keeps it."""

    def process(self, sink, table, batch_id):
        drop = committed_inputs(sink, table)
        fresh = table.filter(pa.array(~drop))
        counts: dict[str, int] = {}
        for k in fresh.column("key").to_pylist():
            counts[k] = counts.get(k, 0) + 1
        out = pa.table({"key": list(counts), "n": list(counts.values()), "batch": [batch_id.gid] * len(counts)})
        keys = {s: np.asarray(q, dtype=np.int64) for s, q in keys_by_stream(fresh).items()} if fresh.num_rows else {}
        return ProcessedBatch(out, {}, keys, int(drop.sum()))


async def test_backfill_with_a_transformation_never_counts_a_landed_message_twice(nc, tmp_path):
    """Live consumption lands the stream through an aggregation; a backfill of an overlapping
    window with the same transformation skips what live landed (its inputs), and a second
    backfill skips what the first landed: the counts stay exact."""
    stream, prefix = await make_group(nc, "elastic")
    await publish_phases(nc, prefix, per_phase=10)
    times = await stored_times(nc, stream)
    lake = tmp_path / "lake"
    sink = ParquetLakeSink(lake, fsync=False)
    first_half = sorted(times)[: len(times) // 2]
    # live consumption of the first half only: publish order is time order, so a window works
    for m in MEMBERS:
        opts = BatchOptions(stream=stream, group="g", member=m, batch_size=4, standby_timeout=5, idle_timeout=0.5,
                            max_messages=len(first_half))
        await run_member_batch(nc, sink, opts, _CountPerKey())
    live = sum(read_committed(lake).column("n").to_pylist())
    assert 0 < live <= len(times)
    window = (from_ns(min(times.values())), from_ns(max(times.values()) + 1000))
    s1 = await run_backfill(nc, sink, stream, "g", *window, batch_size=6, pipeline=_CountPerKey())
    assert s1.duplicates_skipped == live and s1.messages_read == len(times)
    s2 = await run_backfill(nc, sink, stream, "g", *window, batch_size=6, pipeline=_CountPerKey())
    assert s2.duplicates_skipped == len(times) and s2.rows_written == 0
    table = read_committed(lake)
    assert sum(table.column("n").to_pylist()) == len(times)  # every message counted once


class _Slow(ArrowPipeline):
    """Rows as read, each batch held back a while (a Spark job on a busy machine)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def process(self, sink, table, batch_id):
        import time

        time.sleep(self.seconds)
        return super().process(sink, table, batch_id)


async def test_a_backfill_whose_batches_outlast_its_reader_beside_live_members(nc, nats_server, nats_settings,
                                                                                tmp_path):
    """The backfill's reader (an ephemeral consumer) is removed while a slow batch lands (as
    its inactivity threshold, or a server restart, removes it), and then the server restarts
    under it: the backfill makes it again where it was and lands the whole window, beside live
    members landing the same messages; every message is in the table once and in per-key order."""
    from airflow_provider_cg.core.landing.sinks.delta.writer import DeltaLakeSink
    from tests.support.member_job import assert_exactly_once, delta_landed

    stream, prefix = await make_group(nc, "elastic")
    res = await publish_many(nc, [(f"{prefix}.k{i % 9}", b"%d" % i) for i in range(600)])
    expected = {(stream, res.first_seq + i): f"k{i % 9}" for i in range(600)}
    times = await stored_times(nc, stream)
    where = str(tmp_path / "delta")
    api = JsApi(nc)

    async def lose_the_reader() -> int:
        removed = 0
        for _ in range(600):
            for c in await api.list_consumers(stream):
                name = c["name"]
                if name.startswith("cg-backfill-") and removed == 0:
                    await api.delete_consumer(stream, name)
                    removed += 1
            if removed:
                return removed
            await asyncio.sleep(0.05)
        return removed

    async def backfill():
        sink = DeltaLakeSink(where)
        try:
            return await run_backfill(nc, sink, stream, "g", from_ns(min(times.values())),
                                      from_ns(max(times.values()) + 1000), batch_size=100, pipeline=_Slow(1.0))
        finally:
            sink.close()

    async def live(member: str):
        sink = DeltaLakeSink(where)
        try:
            return await run_member_batch(nc, sink, BatchOptions(stream=stream, group="g", member=member,
                                                                 batch_size=50, standby_timeout=5, idle_timeout=0.5))
        finally:
            sink.close()

    removed, summary, *lives = await asyncio.gather(lose_the_reader(), backfill(), live("m1"), live("m2"))
    assert removed == 1 and summary.result == contract.RESULT_COMMITTED, summary
    assert summary.messages_read >= 1 and not any(isinstance(x, Exception) for x in lives)
    assert_exactly_once(delta_landed(where), expected)

    # a server restart under a slow backfill (its in-memory reader is gone with it)
    await nc.close()
    nc2 = await nats_settings.connect()
    try:
        more = await publish_many(nc2, [(f"{prefix}.k{i % 9}", b"m%d" % i) for i in range(300)])
        expected |= {(stream, more.first_seq + i): f"k{i % 9}" for i in range(300)}
        restart_at = asyncio.get_running_loop().time() + 1.5

        async def restart() -> None:
            await asyncio.sleep(max(0.0, restart_at - asyncio.get_running_loop().time()))
            await asyncio.to_thread(nats_server.restart)

        sink = DeltaLakeSink(where)
        try:
            _, s = await asyncio.gather(restart(), run_backfill(
                nc2, sink, stream, "g", from_ns(min(times.values())), dt.datetime.now(dt.UTC) + dt.timedelta(hours=1),
                batch_size=100, pipeline=_Slow(1.0)))
        finally:
            sink.close()
        assert s.result == contract.RESULT_COMMITTED
        assert_exactly_once(delta_landed(where), expected)
    finally:
        await nc2.close()


async def test_a_backfill_keeps_its_pulls_within_the_batch_budget(nc, tmp_path):
    """``batch_bytes`` is the server's pull budget: with a budget below one message each batch
    is one message (read alone, never mistaken for the window's end); with a few messages'
    worth, batches of a few. The window lands once either way."""
    stream, prefix = await make_group(nc, "elastic")
    await publish_phases(nc, prefix, per_phase=6)
    times = await stored_times(nc, stream)
    from airflow_provider_cg.core.errors import ConfigError

    window = from_ns(min(times.values())), from_ns(max(times.values()) + 1000)
    assert await live_consume(nc, ParquetLakeSink(tmp_path / "live", fsync=False), stream) == 18
    for budget, batches in ((1, 18), (600, range(3, 12)), (10_000_000, 1)):
        lake = tmp_path / f"lake-{budget}"
        s = await run_backfill(nc, ParquetLakeSink(lake, fsync=False), stream, "g", *window, batch_bytes=budget)
        assert (s.messages_read, s.rows_written) == (18, 18), s
        assert s.batches == batches if isinstance(batches, int) else s.batches in batches, (budget, s.batches)
        assert set(rows_by_seq(lake)) == set(times)
    with pytest.raises(ConfigError, match="batch_bytes"):
        await run_backfill(nc, ParquetLakeSink(tmp_path / "no", fsync=False), stream, "g", *window, batch_bytes=0)
