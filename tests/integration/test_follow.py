"""Followers (``--follow``): a member run that keeps its pin and lands new messages as they
arrive, in batches cut at the batch size or every ``--commit-interval``, until its follow time
has passed; then it commits and releases the pin. Real nats-server, the member job's own entry
point (its plain Python driver: the protocol is the same through spark-submit), the Parquet
lake read back by its commit log; every check is exactly once and per-key order."""

from __future__ import annotations

import asyncio
import re
import signal
import time

import pytest

from tests.support.member_job import (
    assert_exactly_once,
    create_group,
    parquet_landed,
    publish_orders,
    start_member_job,
    wq_messages,
)

pytestmark = [pytest.mark.integration]

STREAM, GROUP = "ORDERS", "live"


def _job(member_job_zip, tmp_path, nats_server, member: str, *args: str, name: str | None = None):
    return start_member_job(member_job_zip, tmp_path, nats_servers=nats_server.url, stream=STREAM, group=GROUP,
                            member=member, sink_path=tmp_path / "lake", spark=False, name=name,
                            args=["--batch-size", "2000", *args])


async def _rows(path) -> int:
    """Rows committed in the lake so far (none before its first commit)."""
    try:
        return len(await asyncio.to_thread(parquet_landed, path))
    except (FileNotFoundError, OSError):
        return 0


async def _rows_above(path, n: int, timeout: float) -> int:
    """Rows committed, once more than ``n`` (or after ``timeout``)."""
    deadline = time.monotonic() + timeout
    rows = await _rows(path)
    while rows <= n and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        rows = await _rows(path)
    return rows


async def _pull_waiting(nc, member: str, timeout: float = 60.0) -> None:
    from airflow_provider_cg.core.groups.names import work_queue_stream
    from airflow_provider_cg.core.jetstream.api import JsApi

    api, deadline = JsApi(nc), time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = await api.consumer_info(work_queue_stream(STREAM, GROUP), member)
        if info and int(info.get("num_waiting") or 0) > 0:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no pull of {member}'s job waited within {timeout:g} s")


async def _lag(nc) -> dict:
    from airflow_provider_cg.core.groups.lag import group_lag

    return (await group_lag(nc, STREAM, GROUP)).to_dict()


async def _landing_now(nc, member: str = "m1") -> dict | None:
    """What the consumer-groups page shows as landing now for ``member`` (None: nothing)."""
    from airflow_provider_cg.core.jetstream.api import DEFAULT_PREFIX
    from airflow_provider_cg.core.landing.run.board import landing_now

    lag = await _lag(nc)
    await landing_now(nc, DEFAULT_PREFIX, [lag])
    return next(m for m in lag["members"] if m["member"] == member).get("landing_now")


async def _page_group(nc, now: dict) -> dict:
    lag = await _lag(nc)
    lag["members"][0]["landing_now"] = now
    return lag


@pytest.mark.parametrize("read", ["auto", "consumer"])
async def test_a_follower_lands_what_arrives_while_it_runs(nc, nats_server, member_job_zip, tmp_path, read):
    await create_group(nc, STREAM, GROUP, partitions=4, members=("m1",))
    job = _job(member_job_zip, tmp_path, nats_server, "m1", "--follow", "8", "--commit-interval", "0.3",
               "--read", read, "--progress-interval", "0.5")
    expected: dict = {}
    lake = tmp_path / "lake"
    landed_while_running, on_the_page = [], []
    # publishing begins once the follower's pull waits on its member consumer (for the first
    # message, and with it the pin), not after a guess at its process's start-up, which a loaded
    # machine makes seconds long
    await _pull_waiting(nc, "m1")
    for _ in range(4):  # a round every 1.2 s: each lands while the follower runs, none waits for the next run
        expected |= await publish_orders(nc, STREAM, GROUP, 300, 40, wait_sourced=False)
        await asyncio.sleep(1.2)
        landed_while_running.append(await _rows(lake))
        on_the_page.append(await _landing_now(nc))
    result = await asyncio.to_thread(job.wait, 60)
    assert result.returncode == 0, result.describe()
    s = result.summary
    # its progress was on the page while it ran (the progress board), growing; gone at its end
    assert all(on_the_page), on_the_page
    now = on_the_page[-1]
    assert now["pin_id"] == s["pin_id"] and now["follow_until"] and now["state"] == "landing", now
    assert 0 < on_the_page[0]["messages_read"] < now["messages_read"] <= 1200, on_the_page
    assert await _landing_now(nc) is None
    from airflow_provider_cg.ui.app import render

    html = render(["nats_default"], "nats_default", [await _page_group(nc, now)], None)
    assert "following until" in html and f'{now["messages_read"]:,} messages' in html, html[-3000:]
    assert s["result"] == "committed" and s["stop_reason"] == "follow ended", s
    assert s["duration_s"] >= 8 and s["messages_read"] == 1200, s
    assert s["batches"] >= 4, s  # landed as the rounds came, not in one batch at the end
    assert landed_while_running[0] > 0 and landed_while_running[-1] > landed_while_running[0], landed_while_running
    assert_exactly_once(parquet_landed(lake), expected)
    assert await wq_messages(nc, STREAM, GROUP) == 0


async def test_a_follower_waits_for_its_first_message_and_releases_the_pin_at_its_end(
        nc, nats_server, member_job_zip, tmp_path):
    """Started on an empty group it does not end as "empty": it lands what comes. At its end it
    unpins, so the next run of the member lands at once (no wait for a priority timeout)."""
    await create_group(nc, STREAM, GROUP, partitions=2, members=("m1",))
    first = _job(member_job_zip, tmp_path, nats_server, "m1", "--follow", "4", name="first")
    await asyncio.sleep(1.5)
    expected = await publish_orders(nc, STREAM, GROUP, 200, 10, wait_sourced=False)
    r1 = await asyncio.to_thread(first.wait, 60)
    assert r1.returncode == 0 and r1.summary["result"] == "committed", r1.describe()
    assert r1.summary["messages_read"] == 200
    expected |= await publish_orders(nc, STREAM, GROUP, 100, 10)
    second = _job(member_job_zip, tmp_path, nats_server, "m1", name="second")
    r2 = await asyncio.to_thread(second.wait, 60)
    assert r2.returncode == 0 and r2.summary["messages_read"] == 100, r2.describe()
    # the run's own time (its interpreter's start-up, which another test's load stretches, left
    # out): a pin left to lapse would add the ack wait, 5 s
    assert r2.summary["duration_s"] < 4.0, f"the next run waited for the follower's pin to lapse: {r2.describe()}"
    assert_exactly_once(parquet_landed(tmp_path / "lake"), expected)


async def test_a_standby_takes_over_a_killed_follower_within_the_ack_wait(nc, nats_server, member_job_zip, tmp_path):
    """SIGKILL of the pinned follower mid-stream: the standby follower (started beside it) is
    pinned within the ack wait (orbit's 5 s) and lands the rest, the killed one's last batch
    included, once and in per-key order."""
    await create_group(nc, STREAM, GROUP, partitions=4, members=("m1",))
    lake = tmp_path / "lake"
    expected = await publish_orders(nc, STREAM, GROUP, 500, 30)
    active = _job(member_job_zip, tmp_path, nats_server, "m1", "--follow", "30", name="active")
    await _rows_above(lake, 0, 30)
    standby = _job(member_job_zip, tmp_path, nats_server, "m1", "--follow", "14", "--standby-timeout", "14",
                   "--progress-interval", "0.5", name="standby")
    await asyncio.sleep(2.5)
    expected |= await publish_orders(nc, STREAM, GROUP, 300, 30, wait_sourced=False)
    active.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    expected |= await publish_orders(nc, STREAM, GROUP, 300, 30, wait_sourced=False)
    await _rows_above(lake, await _rows(lake), 12)
    took_over = time.monotonic() - killed_at
    result = await asyncio.to_thread(standby.wait, 60)
    assert result.returncode == 0 and result.summary["result"] == "committed", result.describe()
    assert took_over < 5 + 2.5, f"the standby landed {took_over:.1f} s after the kill"
    assert_exactly_once(parquet_landed(lake), expected)
    assert await wq_messages(nc, STREAM, GROUP) == 0
    # the standby talked while it waited for the pin, and its rate is what it read since the line before
    lines = [ln for ln in result.output.splitlines() if "cg progress" in ln]
    waiting = [ln for ln in lines if ln.endswith("waiting=pin")]
    assert len(waiting) >= 4, lines  # about every 0.5 s of the 2.5 s and more before the kill
    rates = [int(re.search(r" rate=(\d+) msg/s", ln).group(1)) for ln in lines]
    assert all(r == 0 for r in rates[:len(waiting)]) and any(r > 0 for r in rates[len(waiting):]), lines


async def test_a_follower_gives_up_revoked_partitions_at_a_batch_boundary(nc, nats_server, member_job_zip, tmp_path):
    """A member added while m1 follows: m1 lands its batch in flight, goes on with the partitions
    it keeps, and m2's follower lands the others; every message once, in per-key order."""
    from airflow_provider_cg.core.groups.admin import ConsumerGroups

    await create_group(nc, STREAM, GROUP, partitions=4, members=("m1",))
    expected = await publish_orders(nc, STREAM, GROUP, 400, 30)
    m1 = _job(member_job_zip, tmp_path, nats_server, "m1", "--follow", "9", name="m1")
    await asyncio.sleep(2)
    await ConsumerGroups(nc).add_members(STREAM, GROUP, ["m2"])
    m2 = _job(member_job_zip, tmp_path, nats_server, "m2", "--follow", "6", name="m2")
    for _ in range(3):
        expected |= await publish_orders(nc, STREAM, GROUP, 200, 30, wait_sourced=False)
        await asyncio.sleep(1)
    r1, r2 = await asyncio.to_thread(lambda: (m1.wait(60), m2.wait(60)))
    for r in (r1, r2):
        assert r.returncode == 0 and r.summary["result"] == "committed", r.describe()
    assert set(r2.summary["partitions"]) <= {"2", "3"} and r2.summary["messages_read"] > 0, r2.summary
    assert_exactly_once(parquet_landed(tmp_path / "lake"), expected)
    assert await wq_messages(nc, STREAM, GROUP) == 0


def test_follow_is_refused_for_a_backfill():
    from airflow_provider_cg.core.errors import ConfigError
    from airflow_provider_cg.core.landing.contract import MemberJobSpec

    with pytest.raises(ConfigError) as e:
        MemberJobSpec.build({"stream": "S", "group": "g", "backfill_start": "2026-01-01T00:00:00Z",
                             "backfill_end": "2026-01-01T01:00:00Z", "follow": "10"})
    assert e.value.field == "follow" and "backfill" in str(e.value)


async def test_the_progress_board_belongs_to_the_latest_pinned_run(nc):
    """A predecessor that writes after its successor began (its last write, or a stalled run
    that comes back) does not overwrite the successor's figures; an ended run leaves the page."""
    from airflow_provider_cg.core.jetstream.api import DEFAULT_PREFIX
    from airflow_provider_cg.core.landing.contract import Summary
    from airflow_provider_cg.core.landing.run.board import BUCKET, ProgressBoard, board_key

    def board(owner: str, pin: str) -> ProgressBoard:
        s = Summary("S-1", "g#1", "m.1")  # names a KV key cannot hold as they are
        s.pin_id = pin
        return ProgressBoard(nc, DEFAULT_PREFIX, s, owner=owner, interval=1.0)

    old, new = board("m.1/old", "p1"), board("m.1/new", "p2")
    await old._write(old.report("landing"))
    old.summary.messages_read = 10
    await old._write(old.report("landing"))  # conditional on its own last write: holds
    await new._write(new.report("landing"))
    await old.close()  # the predecessor's last write comes after: refused, not written
    kv = await nc.jetstream().key_value(BUCKET)
    key = board_key("S-1", "g#1", "m.1")
    assert key.count(".") == 2 and "#" not in key, key
    import json

    assert json.loads((await kv.get(key)).value)["owner"] == "m.1/new"
    await new.close()
    entry = json.loads((await kv.get(key)).value)
    assert entry["owner"] == "m.1/new" and entry["state"] == "ended", entry


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
async def test_followers_into_a_table_share_one_table_commit_per_interval(nc, nats_server, member_job_zip, tmp_path,
                                                                          fmt):
    """Three followers into one Delta or Iceberg table, batches every 0.3 s, a table commit
    interval of 1 s: the table gets about one commit a second for all of them (not one per
    batch), the jobs' summaries count every table commit the table shows, each follower ends
    on time with its last batches readable, and everything lands once, in per-key order."""
    from tests.support.member_job import delta_landed, iceberg_landed

    pytest.importorskip("deltalake" if fmt == "delta" else "pyiceberg")
    members = ("m1", "m2", "m3")
    await create_group(nc, STREAM, GROUP, partitions=6, members=members)
    catalog = f"sqlite:///{tmp_path}/catalog.db"
    table = ["--sink", "delta", "--sink-path", str(tmp_path / "orders")] if fmt == "delta" else \
        ["--sink", "iceberg", "--iceberg-table", "lake.orders", "--iceberg-catalog-uri", catalog,
         "--iceberg-warehouse", str(tmp_path / "warehouse")]
    jobs = [start_member_job(member_job_zip, tmp_path, nats_servers=nats_server.url, stream=STREAM, group=GROUP,
                             member=m, spark=False, args=["--batch-size", "2000", "--follow", "9", "--commit-interval",
                                                          "0.3", "--table-commit-interval", "1",
                                                          "--progress-interval", "0.5", *table]) for m in members]
    for m in members:
        await _pull_waiting(nc, m)
    expected: dict = {}
    started = time.time()
    for _ in range(6):
        expected |= await publish_orders(nc, STREAM, GROUP, 200, 60, wait_sourced=False)
        await asyncio.sleep(0.8)
    results = [await asyncio.to_thread(j.wait, 90) for j in jobs]
    elapsed = time.time() - started
    for r in results:
        assert r.returncode == 0, r.describe()
        assert r.summary["stop_reason"] == "follow ended" and r.summary["duration_s"] < 9 + 5, r.summary
    summaries = [r.summary for r in results]
    batches = sum(s["batches"] for s in summaries)
    made = sum(s["table_commits"] for s in summaries)
    if fmt == "delta":
        from deltalake import DeltaTable

        commits = sum(1 for h in DeltaTable(str(tmp_path / "orders")).history() if "cg.position" in h)
        landed = delta_landed(str(tmp_path / "orders"))
    else:
        from pyiceberg.catalog.sql import SqlCatalog

        commits = SqlCatalog("default", uri=catalog).load_table("lake.orders").metadata.last_sequence_number
        landed = iceberg_landed(catalog, "lake.orders")
    assert made == commits, (made, commits, summaries)
    assert commits <= elapsed / 1.0 + 3, (commits, elapsed)
    assert batches >= 2 * commits, (batches, commits)  # several members' batches per table commit
    assert any("table_commits=" in r.output for r in results), results[0].output[-2000:]
    assert_exactly_once(landed, expected)
    assert await wq_messages(nc, STREAM, GROUP) == 0


async def test_a_follower_hands_over_to_its_warm_successor_without_a_gap(nc, tmp_path):
    """The member's next follower starts after the first one's follow time is over (its Spark
    start on a busy machine): the first goes on landing (``handover_wait``) until the next one
    waits warm for the pin and says so (the progress board), then hands the pin over within a
    batch. Messages arrive all along: the table's commits never stop for more than 2 s, every
    message lands once and in per-key order."""
    from airflow_provider_cg.core.landing.contract import BatchOptions
    from airflow_provider_cg.core.landing.run.member import run_member_batch
    from airflow_provider_cg.core.landing.sinks import ParquetLakeSink
    from airflow_provider_cg.core.landing.sinks.lake.protocol_log import CommitLog
    from airflow_provider_cg.core.landing.sinks.lake.storage import open_storage

    await create_group(nc, STREAM, GROUP, partitions=2, members=("m1",))
    lake = tmp_path / "lake"
    expected: dict = {}

    async def publish(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            expected.update(await publish_orders(nc, STREAM, GROUP, 40, 20, wait_sourced=False))
            await asyncio.sleep(0.2)

    async def follower(delay: float, follow: float, wait: float):
        await asyncio.sleep(delay)
        sink = ParquetLakeSink(lake, fsync=False)
        try:
            return await run_member_batch(nc, sink, BatchOptions(
                stream=STREAM, group=GROUP, member="m1", batch_size=500, standby_timeout=10, idle_timeout=0.5,
                follow=follow, commit_interval=0.3, handover_wait=wait, progress_interval=0.5))
        finally:
            sink.close()

    first, second, _ = await asyncio.gather(follower(0.0, 3.0, 20.0), follower(5.5, 4.0, 0.0), publish(9.0))
    assert first.stop_reason == "handed over to its successor" and 5.5 < first.duration_s < 9, first
    assert second.stop_reason == "follow ended" and second.messages_read > 0, second
    assert_exactly_once(parquet_landed(lake), expected)
    log = CommitLog(open_storage(str(lake)))
    log.refresh()
    from datetime import datetime

    at = sorted(datetime.fromisoformat(r["committed_at"]).timestamp() for r in log.commits.values())
    gaps = [b - a for a, b in zip(at, at[1:], strict=False)]
    # while orders arrive (every 0.2 s), a commit at least every 2 s, through the hand-over
    assert max(gaps) < 2.0, f"the table's commits stopped for {max(gaps):.1f} s (commits at {at})"


async def test_an_overflow_member_joins_warm_and_leaves_without_leaving_a_partition_unserved(nc, tmp_path):
    """Two followers serve a group of four partitions while orders arrive; an overflow member
    (``join``, following for 4 s) starts beside them: once warm it adds itself to the group,
    the followers hand it the partitions it takes within a batch, it lands them, then drops
    itself and they take them back. Sampled all along, no message waits more than 3 s (a partition without a
    server would grow its oldest message's age without bound); every message once, in per-key
    order; the membership is the followers' again at the end."""
    from airflow_provider_cg.core.groups.admin import ConsumerGroups
    from airflow_provider_cg.core.groups.lag import group_lag
    from airflow_provider_cg.core.landing.contract import BatchOptions
    from airflow_provider_cg.core.landing.run.member import run_member_batch
    from airflow_provider_cg.core.landing.sinks import ParquetLakeSink

    await create_group(nc, STREAM, GROUP, partitions=4, members=("m1", "m2"))
    lake = tmp_path / "lake"
    expected: dict = {}
    oldest: list[tuple[float, float]] = []
    publishing = asyncio.Event()

    async def publish(seconds: float) -> None:
        publishing.set()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            expected.update(await publish_orders(nc, STREAM, GROUP, 40, 20, wait_sourced=False))
            await asyncio.sleep(0.2)

    async def watch(seconds: float) -> None:
        await publishing.wait()
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            lag = await group_lag(nc, STREAM, GROUP)
            oldest.append((time.monotonic() - start, lag.oldest_pending_age_s or 0.0))
            await asyncio.sleep(0.3)

    async def run(member: str, delay: float, **kw):
        await asyncio.sleep(delay)
        sink = ParquetLakeSink(lake, fsync=False)
        try:
            return await run_member_batch(nc, sink, BatchOptions(
                stream=STREAM, group=GROUP, member=member, batch_size=500, standby_timeout=10, idle_timeout=0.5,
                commit_interval=0.3, progress_interval=0.5, **kw))
        finally:
            sink.close()

    m1, m2, ox1, _, _ = await asyncio.gather(run("m1", 0.0, follow=11.0), run("m2", 0.0, follow=11.0),
                                             run("ox1", 2.0, join=True, follow=4.0), publish(9.0),
                                             watch(9.0))
    assert ox1.messages_read > 0 and ox1.result == "committed" and ox1.stop_reason == "follow ended", ox1
    assert m1.messages_read > 0 and m2.messages_read > 0
    assert (await ConsumerGroups(nc).get(STREAM, GROUP)).config.members == ("m1", "m2")
    assert_exactly_once(parquet_landed(lake), expected)
    worst = max(oldest, key=lambda t: t[1])
    print(f"oldest pending at most {worst[1]:.2f} s (at {worst[0]:.1f} s); ox1 read {ox1.messages_read}")
    assert worst[1] < 3.0, f"a message waited {worst[1]:.1f} s at {worst[0]:.1f} s: {oldest}"


@pytest.mark.parametrize("read", ["auto", "consumer"])
async def test_a_follower_behind_reads_full_batches_within_its_byte_budget(nc, tmp_path, read):
    """Admission control: a follower that finds a backlog reads batches of about ``batch_bytes``
    of payload (the first one, unmeasured, at most 1,000 messages), not ``batch_size``; caught
    up, it cuts what trickles in at its commit interval. Every message once, in per-key order."""
    from airflow_provider_cg.core.landing.contract import BatchOptions
    from airflow_provider_cg.core.landing.run.member import run_member_batch
    from airflow_provider_cg.core.landing.sinks import ParquetLakeSink
    from airflow_provider_cg.core.landing.sinks.lake.protocol_log import CommitLog
    from airflow_provider_cg.core.landing.sinks.lake.storage import open_storage

    await create_group(nc, STREAM, GROUP, partitions=2, members=("m1",))
    lake = tmp_path / "lake"

    def payload(i: int) -> bytes:  # about 1,000 bytes each
        return b'{"id":%d,"pad":"%s"}' % (i, b"x" * 980)

    expected = await publish_orders(nc, STREAM, GROUP, 6_000, 20, payload=payload)
    budget = 200_000  # about 200 messages

    async def trickle() -> None:  # once the backlog has landed (however long a busy machine takes)
        await _rows_above(lake, len(expected) - 1, 12.0)
        for _ in range(8):
            expected.update(await publish_orders(nc, STREAM, GROUP, 5, 20, payload=payload, wait_sourced=False))
            await asyncio.sleep(0.3)

    sink = ParquetLakeSink(lake, fsync=False)
    try:
        summary, _ = await asyncio.gather(run_member_batch(nc, sink, BatchOptions(
            stream=STREAM, group=GROUP, member="m1", batch_size=100_000, batch_bytes=budget, standby_timeout=10,
            follow=30.0, commit_interval=0.5, read=read, max_messages=6_000 + 8 * 5)), trickle())
    finally:
        sink.close()
    assert_exactly_once(parquet_landed(lake), expected)
    log = CommitLog(open_storage(str(lake)))
    log.refresh()
    sizes = [r["rows_written"] for r in sorted(log.commits.values(), key=lambda r: r["committed_at"])]
    assert sizes[0] <= 1_000, sizes
    behind = [n for n in sizes[1:] if n > 50]  # the backlog's batches, after the measured first
    odd = [n for n in behind[:-1] if not 150 <= n <= 260]  # the last one: what the backlog had left
    assert behind and not odd, f"{odd} of {sizes}"
    assert sum(behind) + sizes[0] >= 6_000 - 260, sizes  # the backlog went in budget-sized batches
    assert max(sizes[-5:]) <= 50, sizes  # caught up: the trickle's small batches
    assert summary.batches == len(sizes), (summary.batches, sizes)
