"""The streaming source's planning side (``core/streaming/session.py``) against a real
nats-server, without Spark (Spark's calls made directly, as its planning process makes them):
a query on an empty member starts unpinned and is pinned by its first message; a second query
of the member waits as a standby and fails after ``pinTimeout`` naming the holder, or takes over
once the first gives the pin back; offsets plan at most what is asked, and only what Spark
committed is acknowledged; a pin moved and given back is a pin lost."""

from __future__ import annotations

import asyncio

import pytest

from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.streaming.session import PinNotHeld, SourceSession
from airflow_provider_cg.core.streaming.source_options import SourceOptions
from tests.support.member_job import create_group, publish_orders, wq_messages

pytestmark = [pytest.mark.integration]


def _session(url: str, **options: str) -> SourceSession:
    return SourceSession({"servers": [url]}, SourceOptions.parse({"stream": "ORD", "group": "g", "member": "m1",
                                                                  **options}))


async def test_a_query_on_an_empty_member_is_pinned_by_its_first_message(nc, nats_server):
    await create_group(nc, "ORD", "g", partitions=2, members=("m1",))
    s = await asyncio.to_thread(_session, nats_server.url)
    try:
        start = s.initial_offset()
        assert start == {"m1": {"*": 0}} and not s.holds["m1"].pinned()
        assert await asyncio.to_thread(s.latest_offset, start, 100) == start  # nothing yet: no batch
        await publish_orders(nc, "ORD", "g", 250, 7)
        end = await asyncio.to_thread(s.latest_offset, start, 100)  # pinned by the first message
        assert s.holds["m1"].pinned() and end["m1"]["*"] > 1
        splits = await asyncio.to_thread(s.partitions, start, end)
        assert splits and all('"fence"' in plan for plan, _ in splits)
        assert await wq_messages(nc, "ORD", "g") == 250  # planned, read: nothing acknowledged
        await asyncio.to_thread(s.commit, end)  # Spark committed it: acknowledged, and only it
        left = await wq_messages(nc, "ORD", "g")
        assert 250 - left <= 100 and left < 250
        after = await asyncio.to_thread(s.latest_offset, end, 10_000)
        await asyncio.to_thread(s.commit, after)
        assert await wq_messages(nc, "ORD", "g") == 0
    finally:
        await asyncio.to_thread(s.stop)


async def test_a_second_query_waits_as_a_standby_then_fails_naming_the_holder_or_takes_over(nc, nats_server):
    await create_group(nc, "ORD", "g", partitions=2, members=("m1",))
    await publish_orders(nc, "ORD", "g", 300, 7)
    first = await asyncio.to_thread(_session, nats_server.url)
    standby = None
    try:
        assert first.holds["m1"].pinned()
        standby = await asyncio.to_thread(_session, nats_server.url, pinTimeout="2")
        start = standby.initial_offset()
        with pytest.raises(PinNotHeld, match="another instance holds its pin"):
            for _ in range(20):  # plans wait for the pin, which the first query keeps
                await asyncio.to_thread(standby.latest_offset, start, 100)
                await asyncio.sleep(0.5)
        await asyncio.to_thread(standby.stop)
        standby = await asyncio.to_thread(_session, nats_server.url, pinTimeout="30")
        await asyncio.to_thread(first.stop)  # gives the pin back
        end = await asyncio.to_thread(standby.latest_offset, standby.initial_offset(), 100)
        assert standby.holds["m1"].pinned() and end["m1"]["*"] > 1
    finally:
        await asyncio.to_thread(first.stop)
        if standby is not None:
            await asyncio.to_thread(standby.stop)


async def test_a_pin_moved_and_given_back_is_lost(nc, nats_server):
    """Another instance pinned meanwhile (an unpin, then its pull), then nobody: the query
    must not plan or acknowledge again."""
    from airflow_provider_cg.core.jetstream.client import PriorityClient

    await create_group(nc, "ORD", "g", partitions=2, members=("m1",))
    await publish_orders(nc, "ORD", "g", 300, 7)
    s = await asyncio.to_thread(_session, nats_server.url)
    try:
        start = s.initial_offset()
        end = await asyncio.to_thread(s.latest_offset, start, 100)
        other = PriorityClient(nc, "ORD-g", "m1", "PCG")
        pulling = asyncio.create_task(other.pull(1, expires=5))
        await asyncio.sleep(0.3)
        await JsApi(nc).unpin("ORD-g", "m1", "PCG")
        assert await pulling and other.pin_id
        await other.unpin()  # and gives it back at once
        await other.close()
        with pytest.raises(PinNotHeld, match="pin moved"):
            await asyncio.to_thread(s.commit, end)
        assert await wq_messages(nc, "ORD", "g") == 300  # nothing acknowledged after the loss
    finally:
        await asyncio.to_thread(s.stop)


async def _make(nc, layout: str) -> tuple[str, str]:
    """The stream and the group of a layout: an elastic group in its work queue or partition
    streams, or a static group reading its origin; returns (stream, subject prefix)."""
    from airflow_provider_cg.core.groups.admin import ConsumerGroups
    from airflow_provider_cg.core.groups.config import (
        ElasticGroupConfig,
        PartitioningFilter,
        StaticGroupConfig,
    )

    api = JsApi(nc)
    if layout == "static":
        await api.add_stream({"name": "ORD", "subjects": ["bar.*"], "storage": "file", "allow_direct": True,
                              "subject_transform": {"src": "bar.*", "dest": "{{partition(2,1)}}.bar.{{wildcard(1)}}"}})
        await ConsumerGroups(nc).create("ORD", "g", StaticGroupConfig(2, ("bar.*",), members=("m1",)))
        return "ORD", "bar"
    await api.add_stream({"name": "ORD", "subjects": ["orders.*"], "storage": "file"})
    await ConsumerGroups(nc).create("ORD", "g", ElasticGroupConfig(
        2, (PartitioningFilter("orders.*", (1,)),), members=("m1",)), layout=layout)
    return "ORD", "orders"


async def _publish(nc, prefix: str, n: int, tag: str, sourced_to: str | None) -> None:
    from airflow_provider_cg.core.jetstream.publish import publish_many

    first = int((await JsApi(nc).stream_info("ORD"))["state"]["last_seq"])
    assert (await publish_many(nc, [(f"{prefix}.k{i % 7}", f"{tag}{i}".encode()) for i in range(n)])).published == n
    for _ in range(200):  # until the group's streams sourced them
        if sourced_to is None or await _sourced(nc, sourced_to) >= first + n:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("not sourced")


async def _sourced(nc, stream: str) -> int:
    return int((await JsApi(nc).stream_info(stream))["state"]["last_seq"])


async def _left(nc, s: SourceSession) -> int:
    """The messages the member's streams hold (for an elastic group: not acknowledged)."""
    return sum([int((await JsApi(nc).stream_info(st))["state"]["messages"]) for st in s.holds["m1"].streams_read()])


@pytest.mark.parametrize("layout", ["work-queue", "partition-streams", "static"])
async def test_a_store_that_comes_back_older_stops_a_restarted_query_before_it_acknowledges(
        nats_server, nats_settings, tmp_path, layout):
    """A checkpoint read up to 800; the server comes back on a copy of its store taken at 500 and
    takes 300 other messages at 501-800. Acknowledging the checkpoint's offset would purge them
    unread (reading on from it would skip them): the query stops naming where the stream went
    back, nothing acknowledged. With failOnDataLoss false the query reads on from there: the 300
    new ones."""
    from airflow_provider_cg.core.streaming.session import StreamWentBack
    from tests.support.store_copy import StoreCopy

    nc = await nats_settings.connect()
    stream, prefix = await _make(nc, layout)
    s = await asyncio.to_thread(_session, nats_server.url)
    sourced = list(s.holds["m1"].streams_read())[0] if layout == "work-queue" else None

    async def land(session: SourceSession, start: dict) -> dict:
        end = await asyncio.to_thread(session.latest_offset, start, 100_000)
        assert await asyncio.to_thread(session.partitions, start, end)
        await asyncio.to_thread(session.commit, end)
        return end

    await _publish(nc, prefix, 500, "old", sourced)
    await asyncio.sleep(0.3)  # (partition streams: sourced through the log)
    checkpoint = await land(s, s.initial_offset())
    assert "@" in checkpoint["m1"]
    await asyncio.to_thread(s.stop)
    await nc.close()
    older = StoreCopy(nats_server, tmp_path / "older").take()

    nc = await nats_settings.connect()
    await _publish(nc, prefix, 300, "lost", sourced)
    await asyncio.sleep(0.3)
    s = await asyncio.to_thread(_session, nats_server.url)  # the query restarted from its checkpoint
    checkpoint = await land(s, checkpoint)
    await asyncio.to_thread(s.stop)
    await nc.close()

    older.put_back()
    nc = await nats_settings.connect()
    try:
        assert int((await JsApi(nc).stream_info(stream))["state"]["last_seq"]) == 500
        await _publish(nc, prefix, 300, "new", sourced)  # others, at 501-800 again
        await asyncio.sleep(0.5)
        s = await asyncio.to_thread(_session, nats_server.url, pinTimeout="5")
        try:
            before = await _left(nc, s)
            if layout != "static":
                assert before == 300
            with pytest.raises(StreamWentBack, match=r"went back to sequence \d+: this query's checkpoint") as e:
                await asyncio.to_thread(s.latest_offset, checkpoint, 100_000)
            assert e.value.field == "stream" and "Nothing was acknowledged" in str(e.value)
            if layout != "partition-streams":  # (a partition stream's sequences are its log's)
                assert e.value.to_seq == 500
            with pytest.raises(StreamWentBack):  # a batch Spark runs again is refused the same way
                await asyncio.to_thread(s.partitions, checkpoint, checkpoint)
            assert await _left(nc, s) == before  # nothing purged
            if layout == "static":
                info = await JsApi(nc).consumer_info(stream, s.holds["m1"].assignment.consumer)
                assert int(info["ack_floor"]["stream_seq"]) == 500  # the durable was not moved past them
        finally:
            await asyncio.to_thread(s.stop)
        # failOnDataLoss false: the same checkpoint reads on from where the stream went back,
        # the 300 new messages and nothing else
        s = await asyncio.to_thread(_session, nats_server.url, failOnDataLoss="false")
        try:
            end = await asyncio.to_thread(s.latest_offset, checkpoint, 100_000)
            hold = s.holds["m1"]
            assert hold.planned is not None
            first = min(r.first_seq for r in hold.planned[2])
            counted = sum(r.messages for r in hold.planned[2])
            if layout == "static":
                assert first == 501 and {r.last_seq for r in hold.planned[2]} == {800}
            else:
                assert counted == 300 and first > 0
            assert await asyncio.to_thread(s.partitions, checkpoint, end)
            await asyncio.to_thread(s.commit, end)
            if layout != "static":
                assert await _left(nc, s) == 0
            else:
                info = await JsApi(nc).consumer_info(stream, hold.assignment.consumer)
                assert int(info["ack_floor"]["stream_seq"]) == 800
        finally:
            await asyncio.to_thread(s.stop)
    finally:
        await nc.close()
