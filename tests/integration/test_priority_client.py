"""PriorityClient against a real nats-server: pinning, standby, hand-over, statuses, acks."""

from __future__ import annotations

import asyncio
import time

import pytest

from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.jetstream.client import PriorityClient
from airflow_provider_cg.core.jetstream.protocol import (
    AckOutcome,
    ConsumerGone,
    PinLost,
    PullEnd,
    PullRejected,
    PullTransient,
)

pytestmark = pytest.mark.integration

SEC = 1_000_000_000


async def _stream(nc, name="S", retention="limits") -> JsApi:
    api = JsApi(nc)
    await api.add_stream(
        {"name": name, "subjects": [f"{name.lower()}.>"], "retention": retention, "storage": "file"}
    )
    return api


async def _consumer(
    api: JsApi, stream="S", name="C", policy="pinned_client", timeout_s=30.0, **extra
) -> None:
    cfg = {
        "name": name,
        "durable_name": name,
        "ack_policy": "explicit",
        "ack_wait": 30 * SEC,
        "priority_groups": ["PCG"],
        "priority_policy": policy,
        **extra,
    }
    if policy == "pinned_client":
        cfg["priority_timeout"] = int(timeout_s * SEC)
    await api.create_consumer(stream, cfg)


async def _publish(nc, api: JsApi, n: int, stream="S", size=16, start=0) -> None:
    """JetStream publishes (acked, so none is dropped by a loaded server), 500 in flight."""
    js, prefix = nc.jetstream(), stream.lower()
    for lo in range(start, start + n, 500):
        hi = min(lo + 500, start + n)
        await asyncio.gather(
            *(js.publish(f"{prefix}.{i % 7}", str(i).encode().ljust(size, b".")) for i in range(lo, hi))
        )


async def _reconnected(nc, timeout=15.0) -> None:
    deadline = time.monotonic() + timeout
    while not nc.is_connected:
        assert time.monotonic() < deadline, "no reconnect"
        await asyncio.sleep(0.05)


@pytest.fixture(params=[True, False], ids=["fast", "plain"])
def fast_path(request) -> bool:
    return request.param


@pytest.fixture
async def nc2(nats_settings):
    client = await nats_settings.connect()
    yield client
    await client.close()


class Events(list):
    def pinned(self, name):
        return lambda pin: self.append((name, "pinned", pin))

    def unpinned(self, name):
        return lambda pin, why: self.append((name, "unpinned", pin, why))


async def test_pinned_client_gets_messages_and_a_pin_id(nc, fast_path):
    api = await _stream(nc)
    await _consumer(api)
    await _publish(nc, api, 10)
    state = (await api.consumer_info("S", "C"))["priority_groups"]
    assert state == [{"group": "PCG", "pinned_ts": "0001-01-01T00:00:00Z"}]  # nobody pinned yet

    ev = Events()
    async with PriorityClient(nc, "S", "C", on_pinned=ev.pinned("a"), fast_path=fast_path) as a:
        assert a.fast_path is fast_path and not a.is_pinned
        msgs = await a.pull(4, expires=2)
        assert [int(m.data.rstrip(b".")) for m in msgs] == [0, 1, 2, 3]
        assert a.last_end is PullEnd.BATCH_FULL and a.is_pinned
        assert ev == [("a", "pinned", a.pin_id)]
        m = msgs[0]
        assert m.pin_id == a.pin_id and m.headers == {"Nats-Pin-Id": a.pin_id}
        assert (m.stream, m.consumer, m.stream_seq, m.consumer_seq, m.num_delivered, m.num_pending) == (
            "S",
            "C",
            1,
            1,
            1,
            9,
        )
        assert m.timestamp_ns > 1_700_000_000 * SEC and m.reply.startswith("$JS.ACK.S.C.")

        more = await a.pull(100, expires=0.5)  # the rest, then 408 at expiry
        assert len(more) == 6 and a.last_end is PullEnd.EXPIRED and len(ev) == 1  # same pin throughout
        assert all(m.pin_id == a.pin_id for m in more)

        g = await a.group_state()
        assert g["group"] == "PCG" and g["pinned_client_id"] == a.pin_id and g["pinned_ts"].startswith("20")
        info = await a.consumer_info()
        assert info["num_ack_pending"] == 10 and info["config"]["priority_timeout"] == 30 * SEC

        await nc.jetstream().publish("s.h", b"h", headers={"Foo": "bar"})  # the pin is appended
        (m,) = await a.pull(1, expires=1)
        assert m.headers == {"Foo": "bar", "Nats-Pin-Id": a.pin_id} and m.pin_id == a.pin_id


async def test_standby_gets_nothing_while_the_pinned_client_pulls(nc, nc2):
    api = await _stream(nc)
    await _consumer(api)
    await _publish(nc, api, 50)
    a, b = PriorityClient(nc, "S", "C"), PriorityClient(nc2, "S", "C")
    first = await a.pull(5, expires=1)
    assert len(first) == 5 and a.is_pinned

    standby = asyncio.create_task(b.pull(10, expires=1.5))
    got = list(first)
    while not standby.done():
        got += await a.pull(5, expires=0.5)
        await asyncio.sleep(0.1)
    assert await standby == [] and b.last_end is PullEnd.EXPIRED and not b.is_pinned
    assert [int(m.data.rstrip(b".")) for m in got] == list(range(len(got))) and len(got) > 10
    await a.close()
    await b.close()


async def test_unpin_hands_over_and_the_old_pin_gets_423(nc, nc2, fast_path):
    api = await _stream(nc)
    await _consumer(api)
    await _publish(nc, api, 6)
    ev = Events()
    a = PriorityClient(
        nc, "S", "C", on_pinned=ev.pinned("a"), on_unpinned=ev.unpinned("a"), fast_path=fast_path
    )
    b = PriorityClient(
        nc2, "S", "C", on_pinned=ev.pinned("b"), on_unpinned=ev.unpinned("b"), fast_path=fast_path
    )
    assert len(await a.pull(2, expires=1)) == 2
    old_pin = a.pin_id

    standby = asyncio.create_task(b.pull(2, expires=5))
    await asyncio.sleep(0.2)
    assert not standby.done()
    admin = PriorityClient(nc2, "S", "C")
    await admin.unpin()  # an operator, not one of the two instances
    taken = await standby
    assert [int(m.data.rstrip(b".")) for m in taken] == [2, 3] and b.is_pinned and b.pin_id != old_pin

    with pytest.raises(PinLost) as lost:
        await a.pull(2, expires=1)
    assert lost.value.code == 423 and lost.value.description == "Nats-Pin-Id mismatch"
    assert lost.value.pin_id == old_pin and lost.value.messages == [] and not a.is_pinned
    assert ev == [
        ("a", "pinned", old_pin),
        ("b", "pinned", b.pin_id),
        ("a", "unpinned", old_pin, "423 Nats-Pin-Id mismatch"),
    ]
    # Now a is a standby: its pulls (without id) wait and get nothing.
    assert await a.pull(2, expires=0.5) == [] and a.last_end is PullEnd.EXPIRED
    assert (await b.group_state())["pinned_client_id"] == b.pin_id
    for c in (a, b, admin):
        await c.close()


async def test_a_waiting_pull_with_an_old_id_gets_wrong_pin_id(nc, nc2):
    api = await _stream(nc)
    await _consumer(api)
    await _publish(nc, api, 1)
    a, b = PriorityClient(nc, "S", "C"), PriorityClient(nc2, "S", "C")
    assert len(await a.pull(1, expires=1)) == 1
    waiting_a = asyncio.create_task(a.pull(5, expires=5))  # waits with the id, stream drained
    await asyncio.sleep(0.1)
    waiting_b = asyncio.create_task(b.pull(5, expires=5))  # standby
    await asyncio.sleep(0.1)
    await b.unpin()  # b is not pinned, so this only clears the server's pin
    assert not waiting_a.done()  # the 423 waits for a message to deliver
    await _publish(nc, api, 1, start=1)
    with pytest.raises(PinLost) as lost:
        await waiting_a
    assert lost.value.description == "Nats-Wrong-Pin-Id" and not a.is_pinned
    await asyncio.sleep(0.2)
    assert b.is_pinned and not waiting_b.done()  # b got the message and waits for more
    await asyncio.wait_for(waiting_b, 6)
    assert b.last_end is PullEnd.EXPIRED
    await a.close()
    await b.close()


async def test_the_standby_takes_over_when_the_pinned_client_stops_pulling(nc, nc2):
    api = await _stream(nc)
    await _consumer(api, timeout_s=1.0)
    await _publish(nc, api, 10)
    ev = Events()
    a = PriorityClient(nc, "S", "C", on_unpinned=ev.unpinned("a"))
    b = PriorityClient(nc2, "S", "C", on_pinned=ev.pinned("b"))
    assert len(await a.pull(3, expires=0.5)) == 3
    old = a.pin_id
    t0 = time.monotonic()
    taken = await b.pull(3, expires=4)  # a does not pull again: after priority_timeout b is pinned
    waited = time.monotonic() - t0
    assert len(taken) == 3 and b.is_pinned and b.pin_id != old and 0.5 < waited < 3.0
    with pytest.raises(PinLost):
        await a.pull(3, expires=0.5)
    assert ev == [("b", "pinned", b.pin_id), ("a", "unpinned", old, "423 Nats-Pin-Id mismatch")]
    await a.close()
    await b.close()


async def test_a_pull_longer_than_priority_timeout_loses_the_pin_mid_pull(nc):
    """The server resets the pin timer only on new pulls carrying the id, not on deliveries."""
    api = await _stream(nc)
    await _consumer(api, timeout_s=1.0)
    await _publish(nc, api, 3)
    a = PriorityClient(nc, "S", "C")
    assert len(await a.pull(1, expires=0.5)) == 1
    long_pull = asyncio.create_task(a.pull(100, expires=4))  # gets 2 now, then waits past 1 s
    await asyncio.sleep(1.8)
    assert "pinned_client_id" not in await a.group_state()
    await _publish(nc, api, 1, start=3)  # the next delivery finds the stale id: 423
    with pytest.raises(PinLost) as lost:
        await long_pull
    assert lost.value.description == "Nats-Wrong-Pin-Id" and len(lost.value.messages) == 2
    await a.close()


async def test_a_pin_switch_does_not_wait_for_unacked_messages_and_the_old_pin_can_still_ack(nc, nc2):
    api = await _stream(nc)
    await _consumer(api)
    await _publish(nc, api, 6)
    a, b = PriorityClient(nc, "S", "C"), PriorityClient(nc2, "S", "C")
    held = await a.pull(3, expires=1)  # in flight, not acked
    standby = asyncio.create_task(b.pull(3, expires=3))
    await asyncio.sleep(0.2)
    t0 = time.monotonic()
    await api.unpin("S", "C", "PCG")
    assert len(await standby) == 3 and time.monotonic() - t0 < 0.5  # no wait for a's 3 acks
    assert (await a.consumer_info())["num_ack_pending"] == 6
    res = await a.ack_sync_many(held)  # acks carry no pin: the old instance can still settle
    assert res.all_acked
    info = await a.consumer_info()
    assert info["num_ack_pending"] == 3 and info["ack_floor"]["stream_seq"] == 3
    await a.close()
    await b.close()


@pytest.mark.parametrize("retention", ["workqueue", "limits"])
async def test_ack_sync_many_acks_everything(nc, retention, fast_path):
    api = await _stream(nc, retention=retention)
    await _consumer(api, max_ack_pending=-1)  # the default (1000) would stall the pulls
    n = 3000
    await _publish(nc, api, n, size=200)
    async with PriorityClient(nc, "S", "C", fast_path=fast_path) as c:
        msgs = []
        while len(msgs) < n:
            msgs += await c.pull(1000, expires=2)
        assert [m.stream_seq for m in msgs] == list(range(1, n + 1))
        res = await c.ack_sync_many(msgs, timeout=10)
        assert len(res) == n and res.all_acked and res.details == {}
        again = await c.ack_sync_many(msgs[:10], timeout=5)  # idempotent: answered again
        assert again.all_acked
        info = await c.consumer_info()
        assert info["num_ack_pending"] == 0 and info["ack_floor"]["stream_seq"] == n
    st = (await api.stream_info("S"))["state"]
    assert st["messages"] == (0 if retention == "workqueue" else n)


async def test_ack_outcomes_time_out_while_the_server_is_down(nats_server, nc):
    api = await _stream(nc)
    await _consumer(api)
    await _publish(nc, api, 200)
    c = PriorityClient(nc, "S", "C")
    msgs = await c.pull(200, expires=2)
    assert len(msgs) == 200
    nats_server.stop()
    t0 = time.monotonic()
    res = await c.ack_sync_many(msgs, timeout=1.0)
    assert time.monotonic() - t0 < 3
    assert set(res) <= {AckOutcome.TIMEOUT, AckOutcome.ERROR} and AckOutcome.ACKED not in res
    assert all(not o.acked for o in res)
    nats_server.start()
    await _reconnected(nc)
    # A timed-out ack proves nothing either way; re-acking is safe and settles it.
    for _ in range(50):
        res = await c.ack_sync_many(msgs, timeout=2)
        if res.all_acked:
            break
        await asyncio.sleep(0.2)
    assert res.all_acked
    info = await c.consumer_info()
    assert info["num_ack_pending"] == 0 and info["ack_floor"]["stream_seq"] == 200
    await c.close()


async def test_404_and_408(nc, fast_path):
    api = await _stream(nc)
    await _consumer(api)
    async with PriorityClient(nc, "S", "C", fast_path=fast_path) as c:
        t0 = time.monotonic()
        assert await c.pull(10, no_wait=True, expires=None) == [] and c.last_end is PullEnd.NO_MESSAGES
        assert time.monotonic() - t0 < 0.5
        t0 = time.monotonic()
        assert await c.pull(10, expires=0.4) == [] and c.last_end is PullEnd.EXPIRED
        assert 0.3 < time.monotonic() - t0 < 1.3
        await _publish(nc, api, 3)
        # A stored message reaches the consumer's pending count a moment after the publish ack:
        # a no_wait pull in between gets a 404 (seen once on a loaded machine). Wait for it.
        for _ in range(100):
            if int((await api.consumer_info("S", "C"))["num_pending"]) == 3:
                break
            await asyncio.sleep(0.02)
        got = await c.pull(10, no_wait=True, expires=None)  # what there is, then 404
        assert len(got) == 3 and c.last_end is PullEnd.NO_MESSAGES
        assert await c.pull(10, no_wait=True, expires=0.5) == [] and c.last_end is PullEnd.EXPIRED
        # Idle heartbeats are consumed silently and keep the pull alive.
        t0 = time.monotonic()
        assert await c.pull(10, expires=1.5, idle_heartbeat=0.2) == [] and c.last_end is PullEnd.EXPIRED
        assert time.monotonic() - t0 > 1.3


async def test_max_bytes(nc, fast_path):
    api = await _stream(nc)
    await _consumer(api)
    await _publish(nc, api, 5, size=100)
    async with PriorityClient(nc, "S", "C", fast_path=fast_path) as c:
        t0 = time.monotonic()
        assert await c.pull(5, max_bytes=50, expires=3) == [] and c.last_end is PullEnd.MAX_BYTES  # 409
        got = await c.pull(5, max_bytes=300, expires=3)  # ~145 bytes each on the wire
        assert len(got) == 2 and c.last_end is PullEnd.MAX_BYTES and time.monotonic() - t0 < 1.5
        assert len(await c.pull(3, max_bytes=100_000, expires=3)) == 3 and c.last_end is PullEnd.BATCH_FULL


async def test_overflow_min_pending_gates_delivery(nc, fast_path):
    api = await _stream(nc)
    await _consumer(api, policy="overflow")
    await _publish(nc, api, 10)
    async with PriorityClient(nc, "S", "C", fast_path=fast_path) as c:
        assert await c.pull(5, expires=0.5, min_pending=11) == [] and c.last_end is PullEnd.EXPIRED
        # Checked per message: delivered while num_pending (this one included) >= 7: 10, 9, 8, 7.
        got = await c.pull(10, expires=0.5, min_pending=7)
        assert len(got) == 4 and c.last_end is PullEnd.EXPIRED
        assert not c.is_pinned and got[0].pin_id is None and got[0].headers is None
        # 6 pending, 4 unacked: min_pending 7 waits; OR-ed min_ack_pending 4 is satisfied.
        assert await c.pull(5, expires=0.5, min_pending=7) == []
        assert len(await c.pull(2, expires=1, min_pending=7, min_ack_pending=4)) == 2
        assert len(await c.pull(10, expires=0.5)) == 4  # no thresholds: plain delivery
        with pytest.raises(PullRejected) as rej:  # an id on a non-pinned consumer
            c._pin_id = "bogus"
            await c.pull(1, expires=0.5)
        assert rej.value.code == 400 and "Pinned" in rej.value.description
        c._pin_id = None


async def test_requests_the_server_refuses(nc):
    api = await _stream(nc)
    await _consumer(api)
    c = PriorityClient(nc, "S", "C")
    with pytest.raises(PullRejected) as rej:
        await c.pull(1, expires=0.5, min_pending=5)
    assert rej.value.description == "Bad Request - Not a Overflow Priority consumer"
    with pytest.raises(PullRejected) as rej:
        await PriorityClient(nc, "S", "C", group="OTHER").pull(1, expires=0.5)
    assert rej.value.description == "Bad Request - Invalid Priority Group"
    with pytest.raises(ValueError):
        await c.pull(1, expires=1, idle_heartbeat=1)
    await c.close()


async def test_consumer_deleted(nc, fast_path):
    api = await _stream(nc)
    await _consumer(api)
    await _publish(nc, api, 2)
    c = PriorityClient(nc, "S", "C", fast_path=fast_path)
    msgs = await c.pull(2, expires=1)
    waiting = asyncio.create_task(c.pull(5, expires=5))
    await asyncio.sleep(0.2)
    await api.delete_consumer("S", "C")
    with pytest.raises(ConsumerGone) as gone:
        await waiting
    assert (gone.value.code, gone.value.description) == (409, "Consumer Deleted") and not gone.value.retryable
    with pytest.raises(ConsumerGone) as gone:  # nobody serves the pull subject any more
        await c.pull(5, expires=1)
    assert gone.value.code == 503
    res = await c.ack_sync_many(msgs, timeout=2)
    assert list(res) == [AckOutcome.ERROR, AckOutcome.ERROR] and res.details[0] == "503 No Responders"
    with pytest.raises(ConsumerGone):
        await c.consumer_info()
    await c.close()


async def test_iter_batches_prefetches_and_never_overfetches(nc, fast_path):
    api = await _stream(nc)
    await _consumer(api)
    await _publish(nc, api, 2500)
    async with PriorityClient(nc, "S", "C", fast_path=fast_path) as c:
        seen = []
        async for batch in c.iter_batches(1000, max_messages=2200, expires=2):
            assert len(batch) <= 1000
            seen += [m.stream_seq for m in batch]
            assert (await c.ack_sync_many(batch)).all_acked
        assert seen == list(range(1, 2201)) and c.buffered == 0
        info = await c.consumer_info()
        assert info["delivered"]["stream_seq"] == 2200 and info["num_ack_pending"] == 0

        # until_empty: stops after the first pull that does not fill its batch
        sizes = [len(b) async for b in c.iter_batches(200, expires=0.5)]
        assert sizes == [200, 100]


async def test_iter_batches_early_exit_keeps_the_prefetched_batch_and_close_naks_it(nc):
    api = await _stream(nc)
    await _consumer(api)
    await _publish(nc, api, 40)
    c = PriorityClient(nc, "S", "C")
    async for batch in c.iter_batches(10, expires=1):
        assert len(batch) == 10
        await asyncio.sleep(0.2)  # the prefetched pull completes meanwhile
        break
    assert c.buffered == 10  # parked in the client, not lost
    nxt = await c.pull(15, expires=0.5)
    assert [m.stream_seq for m in nxt] == list(range(11, 26)) and c.buffered == 0
    async for batch in c.iter_batches(5, expires=1):
        assert [m.stream_seq for m in batch] == list(range(26, 31))
        await asyncio.sleep(0.2)
        break
    assert c.buffered == 5
    await c.close()  # naks the 5 nobody saw: redelivered at once, not after ack_wait
    info = await api.consumer_info("S", "C")
    assert info["delivered"]["stream_seq"] == 35  # (nak'ed ones still count as ack pending)
    await api.unpin("S", "C", "PCG")
    d = PriorityClient(nc, "S", "C")
    again = await d.pull(5, expires=1)
    assert [(m.stream_seq, m.num_delivered) for m in again] == [(s, 2) for s in range(31, 36)]
    await d.close()


async def test_a_cancelled_pull_keeps_late_messages_for_the_next_pull(nc):
    api = await _stream(nc)
    await _consumer(api)
    c = PriorityClient(nc, "S", "C")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(c.pull(3, expires=3), 0.3)
    await _publish(nc, api, 3)  # delivered to the abandoned (still waiting) server-side pull
    await asyncio.sleep(0.3)
    assert c.buffered == 3
    got = await c.pull(3, expires=1)
    assert len(got) == 3 and c.last_end is PullEnd.BUFFERED
    await c.close()


async def test_one_pull_at_a_time_and_plain_acks(nc):
    api = await _stream(nc)
    await _consumer(api, ack_wait=1 * SEC)
    await _publish(nc, api, 4)
    c = PriorityClient(nc, "S", "C")
    first = asyncio.create_task(c.pull(10, expires=0.5))
    await asyncio.sleep(0.05)
    with pytest.raises(RuntimeError):
        await c.pull(1)
    msgs = await first
    assert len(msgs) == 4
    await c.ack(msgs[0])
    await c.term(msgs[1], reason="poison")
    await c.in_progress(msgs[2])
    await c.nak(msgs[3], delay=0.3)
    await c.flush()
    again = await c.pull(2, expires=1.5)
    # msgs[3] comes back after its nak delay; msgs[2] after its renewed ack wait (1 s)
    assert [m.stream_seq for m in again] == [4, 3] and [m.num_delivered for m in again] == [2, 2]
    await c.ack_many(again)
    await asyncio.sleep(0.1)
    info = await c.consumer_info()
    assert info["num_ack_pending"] == 0 and info["ack_floor"]["stream_seq"] == 4
    await c.close()


async def test_server_shutdown_and_crash_during_a_pull(nats_server, nc):
    api = await _stream(nc)
    await _consumer(api)
    c = PriorityClient(nc, "S", "C")
    waiting = asyncio.create_task(c.pull(5, expires=1.5))
    await asyncio.sleep(0.2)
    nats_server.stop()  # SIGTERM: the server tells waiting pulls
    with pytest.raises(PullTransient) as down:
        await waiting
    assert (down.value.code, down.value.description) == (409, "Server Shutdown") and down.value.retryable
    nats_server.start()
    await _reconnected(nc)

    waiting = asyncio.create_task(c.pull(5, expires=1.5))
    await asyncio.sleep(0.2)
    nats_server.kill()  # a crash says nothing: the local deadline (expires + 1 s) ends the pull
    t0 = time.monotonic()
    assert await waiting == [] and c.last_end is PullEnd.TIMEOUT
    assert time.monotonic() - t0 < 3.5
    nats_server.start()
    await _publish(nc, api, 2)  # works again once reconnected (same subscriptions)
    assert len(await c.pull(2, expires=2)) == 2
    await c.close()


async def test_missed_idle_heartbeats_end_the_pull_early(nats_server, nc):
    api = await _stream(nc)
    await _consumer(api)
    c = PriorityClient(nc, "S", "C")
    waiting = asyncio.create_task(c.pull(5, expires=10, idle_heartbeat=0.25))
    await asyncio.sleep(0.8)  # heartbeats flow: still waiting
    assert not waiting.done()
    nats_server.kill()
    t0 = time.monotonic()
    with pytest.raises(PullTransient) as dead:
        await waiting
    assert dead.value.description == "missed idle heartbeats" and time.monotonic() - t0 < 2.0
    nats_server.start()
    await c.close()


async def test_fast_path_hook_is_shared_per_connection_and_removed_with_the_last_client(nc):
    api = await _stream(nc)
    await _consumer(api)
    await _publish(nc, api, 2)
    plain_sub_msgs = []

    async def cb(msg):
        plain_sub_msgs.append(msg)

    other = await nc.subscribe("other.>", cb=cb)  # untouched by the hook
    a, b = PriorityClient(nc, "S", "C"), PriorityClient(nc, "S", "C", fast_path=False)
    await a.start()
    await b.start()
    assert a.fast_path and not b.fast_path and "_process_msg" in nc.__dict__
    assert len(await a.pull(2, expires=1)) == 2
    await nc.publish("other.x", b"hello")
    await nc.flush()
    await asyncio.sleep(0.1)
    assert [m.data for m in plain_sub_msgs] == [b"hello"]
    await a.close()
    assert "_process_msg" not in nc.__dict__  # the last fast client restored nats-py's method
    await b.close()
    await other.unsubscribe()


async def test_untested_nats_py_version_falls_back_to_the_public_api(nc, monkeypatch):
    """The fast path touches nats-py internals only for the versions it was built against."""
    from airflow_provider_cg.core.jetstream import fastpath as nats_fastpath

    monkeypatch.setattr(nats_fastpath, "_nats_py_version", lambda: (3, 1))
    api = await _stream(nc)
    await _consumer(api)
    await _publish(nc, api, 3)
    async with PriorityClient(nc, "S", "C") as c:
        msgs = await c.pull(3, expires=1)
        assert not c.fast_path and "_process_msg" not in nc.__dict__
        assert len(msgs) == 3 and c.is_pinned
        assert (await c.ack_sync_many(msgs)).all_acked
        assert await c.pull(1, expires=0.3) == []  # a 408/404 status still ends the pull
