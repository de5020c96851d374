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
