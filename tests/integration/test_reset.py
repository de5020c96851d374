"""``cg reset`` against a real nats-server, with real member jobs landing before and after:
each mode on static and elastic groups, the positions before and after, what the next jobs
land (a replay lands nothing twice: the sink drops what it holds), and the refusals.

Jobs run as the plain Python driver (``spark=False``): the protocol is the same.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import signal

import pytest

from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import StaticGroupConfig
from airflow_provider_cg.core.jetstream.api import JsApi
from tests.support.badinput import acg
from tests.support.member_job import (
    assert_exactly_once,
    create_group,
    parquet_landed,
    publish_orders,
    start_member_job,
)

pytestmark = [pytest.mark.integration]

KEYS = 20


async def _cg(url: str, *args: str) -> tuple[int, str, str]:
    a = await acg(*args, "--server", url)
    return a.rc, a.out, a.err


async def _reset(url: str, stream: str, group: str, *args: str) -> dict:
    code, out, err = await _cg(url, "reset", stream, group, *args, "--json")
    assert code == 0, err
    return json.loads(out)


async def _land(zip_path, tmp_path, url, stream, group, members, *args) -> list[dict]:
    """One job per member, in turn, each landing its backlog; their summaries."""
    out = []
    for m in members:
        job = start_member_job(zip_path, tmp_path / "jobs", nats_servers=url, stream=stream, group=group, member=m,
                               sink_path=tmp_path / "lake", spark=False,
                               args=["--idle-timeout", "1", "--standby-timeout", "5", *args])
        r = await asyncio.to_thread(job.wait, 120)
        assert r.returncode == 0 and "Traceback" not in r.output, r.describe()
        out.append(r.summary)
    return out


def _positions(plan: dict) -> dict[tuple[str, int], tuple[int, int]]:
    return {(c["member"], c["partitions"][0]): (c["current"], c["new"]) for c in plan["changes"]}


async def _static_group(nc) -> None:
    # direct gets on: the jobs read past their durables and move them, as a reset does
    await JsApi(nc).add_stream({"name": "S", "subjects": ["orders.*"], "storage": "file", "allow_direct": True,
                                "subject_transform": {"src": "orders.*",
                                                      "dest": "{{partition(4,1)}}.orders.{{wildcard(1)}}"}})
    await ConsumerGroups(nc).create("S", "g", StaticGroupConfig(4, ("orders.*",), members=("a", "b")))


async def _publish_static(nc, first: int, n: int) -> dict[tuple[str, int], str]:
    js = nc.jetstream()
    out = {}
    for i in range(n):
        ack = await js.publish(f"orders.k{(first + i) % KEYS}", b"{}")
        out[("S", ack.seq)] = f"orders.k{(first + i) % KEYS}"
    return out


async def test_static_reset_back_forward_and_by_time(nc, nats_server, member_job_zip, tmp_path):
    await _static_group(nc)
    url = nats_server.url
    expected = await _publish_static(nc, 0, 120)
    await _land(member_job_zip, tmp_path, url, "S", "g", ("a", "b"))
    api = JsApi(nc)

    # back to sequence 61: the plan counts what each member lands again, changes nothing
    plan = await _reset(url, "S", "g", "--to-seq", "61")
    assert not plan["executed"] and {c["member"]: (c["current"], c["new"]) for c in plan["changes"]} == {
        "a": (121, 61), "b": (121, 61)}
    assert plan["replay"] == 60 and plan["skip"] == 0
    assert (await api.consumer_info("S", "g-a"))["ack_floor"]["stream_seq"] == 120
    done = await _reset(url, "S", "g", "--to-seq", "61", "--execute")
    assert done["executed"] and done["replay"] == 60
    for m in ("a", "b"):
        info = await api.consumer_info("S", f"g-{m}")
        assert info["ack_floor"]["stream_seq"] == 60 and info["num_pending"] == next(
            c["replay"] for c in plan["changes"] if c["member"] == m)
    replayed = await _land(member_job_zip, tmp_path, url, "S", "g", ("a", "b"))
    assert sum(s["messages_read"] for s in replayed) == 60 and sum(s["rows_written"] for s in replayed) == 0
    assert sum(s["duplicates_skipped"] for s in replayed) == 60
    assert_exactly_once(parquet_landed(tmp_path / "lake"), expected)

    # forward past a burst for member a only: its share is skipped, b lands its own
    burst = await _publish_static(nc, 120, 40)
    plan = await _reset(url, "S", "g", "--member", "a", "--to-latest", "--execute")
    (change,) = plan["changes"]
    assert change["member"] == "a" and (change["current"], change["new"]) == (121, 161) and change["skip"] > 0
    a_parts = set(change["partitions"])
    after = await _land(member_job_zip, tmp_path, url, "S", "g", ("a", "b"))
    assert after[0]["messages_read"] == 0 and after[1]["messages_read"] == 40 - change["skip"]
    landed = parquet_landed(tmp_path / "lake")
    held = {(r.origin_stream, r.origin_seq) for r in landed}
    skipped = {k: v for k, v in burst.items() if k not in held}
    assert len(skipped) == change["skip"]
    for (_, seq) in skipped:  # the origin's stored subject starts with the partition
        assert int((await api.get_msg("S", seq))["subject"].split(".")[0]) in a_parts
    assert_exactly_once(landed, {**expected, **{k: v for k, v in burst.items() if k not in skipped}})

    # by time: back to the start of the burst, for member a
    first_burst = (await api.get_msg("S", 121))["time"]
    plan = await _reset(url, "S", "g", "--member", "a", "--to-datetime", first_burst, "--execute")
    assert plan["changes"][0]["new"] == 121 and plan["changes"][0]["replay"] == change["skip"]
    again = await _land(member_job_zip, tmp_path, url, "S", "g", ("a",))
    assert again[0]["rows_written"] == change["skip"]
    assert_exactly_once(parquet_landed(tmp_path / "lake"), {**expected, **burst})

    # shift: two of member b's messages back
    plan = await _reset(url, "S", "g", "--member", "b", "--shift-by", "-2", "--execute")
    assert plan["changes"][0]["replay"] == 2 and plan["changes"][0]["new"] < 161
    again = await _land(member_job_zip, tmp_path, url, "S", "g", ("b",))
    assert again[0]["messages_read"] == 2 and again[0]["duplicates_skipped"] == 2


async def test_elastic_reset_replays_from_the_origin_and_skips_forward(nc, nats_server, member_job_zip, tmp_path):
    url = nats_server.url
    await create_group(nc, "ORDERS", "g", partitions=4, members=("m1", "m2"))
    expected = await publish_orders(nc, "ORDERS", "g", 200, KEYS)
    await _land(member_job_zip, tmp_path, url, "ORDERS", "g", ("m1", "m2"))
    pending = await publish_orders(nc, "ORDERS", "g", 100, KEYS)  # 201..300, not landed yet

    # back to 151: every partition replays its messages of 151..200 from the origin
    plan = await _reset(url, "ORDERS", "g", "--to-seq", "151")
    assert {new for (_, new) in _positions(plan).values()} == {151}
    assert plan["replay"] == 50 and plan["skip"] == 0
    assert int((await JsApi(nc).stream_info("ORDERS-g"))["state"]["messages"]) == 100  # a plan changes nothing
    done = await _reset(url, "ORDERS", "g", "--to-seq", "151", "--execute")
    assert done["executed"]
    wq = (await JsApi(nc).stream_info("ORDERS-g"))
    assert int(wq["state"]["messages"]) == 150 and wq["config"]["sources"][0]["name"] == "ORDERS"
    after = await _land(member_job_zip, tmp_path, url, "ORDERS", "g", ("m1", "m2"))
    assert sum(s["messages_read"] for s in after) == 150 and sum(s["duplicates_skipped"] for s in after) == 50
    assert_exactly_once(parquet_landed(tmp_path / "lake"), {**expected, **pending})
    # sourcing goes on after a reset
    more = await publish_orders(nc, "ORDERS", "g", 30, KEYS)

    # forward: m1 skips its share of the new burst; m2 lands its own
    plan = await _reset(url, "ORDERS", "g", "--member", "m1", "--to-latest", "--execute")
    skipped = plan["skip"]
    assert skipped > 0 and all(c["member"] == "m1" and c["new"] == 331 for c in plan["changes"])
    after = await _land(member_job_zip, tmp_path, url, "ORDERS", "g", ("m1", "m2"))
    assert after[0]["messages_read"] == 0 and after[1]["messages_read"] == 30 - skipped
    landed = parquet_landed(tmp_path / "lake")
    held = {(r.origin_stream, r.origin_seq) for r in landed}
    assert_exactly_once(landed, {**expected, **pending, **{k: v for k, v in more.items() if k in held}})
    assert len(set(more) - held) == skipped

    # back for m1 only, while m2 has a backlog: m2's partitions keep their positions
    burst2 = await publish_orders(nc, "ORDERS", "g", 20, KEYS)
    before = await ConsumerGroups(nc).status("ORDERS", "g")
    plan = await _reset(url, "ORDERS", "g", "--member", "m1", "--to-seq", "281", "--execute")
    assert plan["changes"] and all(c["member"] == "m1" and c["new"] == 281 for c in plan["changes"])
    after_status = await ConsumerGroups(nc).status("ORDERS", "g")
    m1_parts = {p for c in plan["changes"] for p in c["partitions"]}
    for p_, n in before.partitions.items():
        if p_ not in m1_parts:
            assert after_status.partitions[p_] == n, (p_, before.partitions, after_status.partitions)
    assert sum(after_status.partitions[p_] for p_ in m1_parts) == sum(before.partitions[p_] for p_ in m1_parts) \
        + plan["replay"]
    replayed = await _land(member_job_zip, tmp_path, url, "ORDERS", "g", ("m1", "m2"))
    landed = parquet_landed(tmp_path / "lake")
    held = {(r.origin_stream, r.origin_seq) for r in landed}
    # 281..330 is read again: 281..300 were landed (no-ops now), m1's share of 301..330 was
    # skipped by the forward reset above and lands now
    assert sum(s["duplicates_skipped"] for s in replayed) == plan["replay"] - skipped
    assert_exactly_once(landed, {**expected, **pending, **more, **burst2})

    # a shift forward: 3 messages of each of m2's partitions
    await publish_orders(nc, "ORDERS", "g", 40, KEYS)
    m2 = next(m for m in (await ConsumerGroups(nc).status("ORDERS", "g")).members if m.member == "m2")
    plan = await _reset(url, "ORDERS", "g", "--member", "m2", "--shift-by", "3", "--execute")
    assert [c["skip"] for c in plan["changes"]] == [3] * len(m2.partitions), plan
    after = await _land(member_job_zip, tmp_path, url, "ORDERS", "g", ("m2",))
    assert after[0]["messages_read"] == m2.backlog - 3 * len(m2.partitions)


async def test_reset_refused_while_a_job_is_pinned_unless_forced(nc, nats_server, member_job_zip, tmp_path):
    url = nats_server.url
    await create_group(nc, "ORDERS", "g", partitions=2, members=("m1",))
    expected = await publish_orders(nc, "ORDERS", "g", 300, KEYS)
    job = start_member_job(member_job_zip, tmp_path / "jobs", nats_servers=url, stream="ORDERS", group="g",
                           member="m1", sink_path=tmp_path / "lake", spark=False,
                           env={"CG_FAILPOINT": "stop:after_prepare"}, args=["--batch-size", "100"])
    try:
        assert await asyncio.to_thread(job.wait_for_log, "failpoint stop:after_prepare", 60), job.wait(5).describe()
        code, out, err = await _cg(url, "reset", "ORDERS", "g", "--to-earliest", "--execute")
        assert code == 2 and err.startswith("cg: error: reset: member(s) m1 have a running (pinned) instance"), err
        assert int((await JsApi(nc).stream_info("ORDERS-g"))["state"]["messages"]) == 300  # nothing changed
        code, out, err = await _cg(url, "reset", "ORDERS", "g", "--to-earliest")
        assert code == 0 and "running (pinned): m1" in out, out
        code, out, err = await _cg(url, "reset", "ORDERS", "g", "--to-earliest", "--execute", "--force")
        assert code == 0 and "done" in out, err
        while job.running():  # the stepped-down job finishes (nobody else was pinned) or rolls back
            job.signal(signal.SIGCONT)
            await asyncio.sleep(0.2)
        r = job.wait(5)
        assert r.returncode == 0 and "Traceback" not in r.output, r.describe()
    finally:
        job.kill()
    after = await _land(member_job_zip, tmp_path, url, "ORDERS", "g", ("m1",))
    assert after[0]["messages_read"] == 300  # all of them again, from the earliest
    assert after[0]["duplicates_skipped"] == r.summary["rows_written"]
    assert_exactly_once(parquet_landed(tmp_path / "lake"), expected)


@pytest.mark.parametrize("args,field", [
    ((), "reset"),
    (("--to-earliest", "--to-latest"), "reset"),
    (("--to-datetime", "yesterday"), "to_datetime"),
    (("--by-duration", "10 minutes"), "by_duration"),
    (("--by-duration", "0s"), "by_duration"),
    (("--to-seq", "0"), "to_seq"),
    (("--to-seq", "ten"), "to_seq"),
    (("--shift-by", "0"), "shift_by"),
    (("--to-latest", "--member", "a.b"), "member"),
    (("--to-latest", "--member", "nobody"), "member"),
])
async def test_reset_bad_input_names_the_field_and_changes_nothing(nc, nats_server, args, field):
    await create_group(nc, "ORDERS", "g", partitions=2, members=("m1",))
    await publish_orders(nc, "ORDERS", "g", 10, KEYS)
    code, out, err = await _cg(nats_server.url, "reset", "ORDERS", "g", *args, "--execute")
    assert code == 1 and err.startswith(f"cg: error: {field}: ") and err.count("\n") == 1, (code, err)
    assert "Traceback" not in err and out == ""
    assert int((await JsApi(nc).stream_info("ORDERS-g"))["state"]["messages"]) == 10


async def test_elastic_shift_back_is_refused_with_the_way_to_do_it(nc, nats_server):
    await create_group(nc, "ORDERS", "g", partitions=2, members=("m1",))
    await publish_orders(nc, "ORDERS", "g", 10, KEYS)
    code, out, err = await _cg(nats_server.url, "reset", "ORDERS", "g", "--shift-by", "-5")
    assert code == 1 and err.startswith("cg: error: shift_by: ") and "--to-seq" in err, err


def test_a_datetime_is_read_as_utc():
    from airflow_provider_cg.core.groups.reset_plan import ResetTarget

    t = ResetTarget.parse(to_datetime="2026-11-25T09:00:00")
    assert t.value == dt.datetime(2026, 11, 25, 9, tzinfo=dt.UTC)
    assert ResetTarget.parse(by_duration="1h30m").value == 5400


async def test_a_reset_killed_after_stopping_sourcing_is_finished_by_the_next(nc, nats_server, member_job_zip,
                                                                              tmp_path):
    from airflow_provider_cg.core.groups import sourcing

    url = nats_server.url
    await create_group(nc, "ORDERS", "g", partitions=2, members=("m1",))
    expected = await publish_orders(nc, "ORDERS", "g", 100, KEYS)
    await _land(member_job_zip, tmp_path, url, "ORDERS", "g", ("m1",))
    # a reset that died right after it stopped sourcing (as a SIGKILLed cg would leave it)
    await sourcing.stop(JsApi(nc), "ORDERS-g", {"op": "reset", "target": "--to-seq 51"})
    more = await publish_orders(nc, "ORDERS", "g", 20, KEYS, wait_sourced=False)
    code, out, err = await _cg(url, "status", "ORDERS", "g")
    assert "STOPPED after origin sequence 100 by a reset (--to-seq 51)" in out, out
    plan = await _reset(url, "ORDERS", "g", "--to-seq", "51", "--execute")
    assert plan["executed"] and plan["replay"] == 50
    wq = await JsApi(nc).stream_info("ORDERS-g")
    assert "metadata" not in wq["config"] or sourcing.STOPPED_KEY not in wq["config"]["metadata"]
    after = await _land(member_job_zip, tmp_path, url, "ORDERS", "g", ("m1",))
    assert after[0]["messages_read"] == 70 and after[0]["duplicates_skipped"] == 50
    assert_exactly_once(parquet_landed(tmp_path / "lake"), {**expected, **more})


async def test_time_modes_on_an_elastic_group(nc, nats_server, member_job_zip, tmp_path):
    """--to-datetime and --by-duration (and --to-earliest, --by-duration on a static group
    below): each plan's positions against the stored messages' times, each replay landing
    nothing twice."""
    url = nats_server.url
    api = JsApi(nc)
    await create_group(nc, "ORDERS", "g", partitions=2, members=("m1",))
    early = await publish_orders(nc, "ORDERS", "g", 60, KEYS)
    await asyncio.sleep(1.1)
    late = await publish_orders(nc, "ORDERS", "g", 40, KEYS)
    await _land(member_job_zip, tmp_path, url, "ORDERS", "g", ("m1",))
    first_late = min(s for _, s in late)
    when = (await api.get_msg("ORDERS", first_late))["time"]
    plan = await _reset(url, "ORDERS", "g", "--to-datetime", when, "--execute")
    assert {c["new"] for c in plan["changes"]} == {first_late} and plan["replay"] == 40
    again = await _land(member_job_zip, tmp_path, url, "ORDERS", "g", ("m1",))
    assert again[0]["messages_read"] == 40 and again[0]["rows_written"] == 0
    plan = await _reset(url, "ORDERS", "g", "--by-duration", "1h")  # everything is newer: the first message
    assert {c["new"] for c in plan["changes"]} == {1} and plan["replay"] == 100 and not plan["executed"]
    assert_exactly_once(parquet_landed(tmp_path / "lake"), {**early, **late})


async def test_earliest_and_duration_on_a_static_group(nc, nats_server, member_job_zip, tmp_path):
    url = nats_server.url
    await _static_group(nc)
    expected = await _publish_static(nc, 0, 30)
    await _land(member_job_zip, tmp_path / "s", url, "S", "g", ("a", "b"))
    for args in (("--to-earliest",), ("--by-duration", "1h")):
        plan = await _reset(url, "S", "g", *args)
        assert {c["new"] for c in plan["changes"]} == {1} and plan["replay"] == 30, (args, plan)
    plan = await _reset(url, "S", "g", "--to-earliest", "--execute")
    replayed = await _land(member_job_zip, tmp_path / "s", url, "S", "g", ("a", "b"))
    assert sum(r["messages_read"] for r in replayed) == 30 and sum(r["rows_written"] for r in replayed) == 0
    assert_exactly_once(parquet_landed(tmp_path / "s" / "lake"), expected)


async def test_a_static_member_reset_before_its_first_job(nc, nats_server, member_job_zip, tmp_path):
    """--to-latest before any job ran: the member's durable is created as its job would create
    it, at the new position; its first job lands only what came after."""
    url = nats_server.url
    await _static_group(nc)
    await _publish_static(nc, 0, 20)
    plan = await _reset(url, "S", "g", "--member", "a", "--to-latest", "--execute")
    assert plan["changes"][0]["new"] == 21 and plan["changes"][0]["skip"] > 0
    info = await JsApi(nc).consumer_info("S", "g-a")
    assert info["config"]["ack_wait"] == 60 * 10**9 and info["config"]["max_ack_pending"] == 300_000
    later = await _publish_static(nc, 20, 10)
    (summary,) = await _land(member_job_zip, tmp_path, url, "S", "g", ("a",))
    landed = parquet_landed(tmp_path / "lake")
    assert summary["messages_read"] == len(landed) > 0 and {r.origin_seq for r in landed} <= {s for _, s in later}
