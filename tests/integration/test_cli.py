"""Every server command of ``cg`` through ``main([...])`` against a real nats-server."""

from __future__ import annotations

import asyncio
import io
import json
import os

import pytest

from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings
from airflow_provider_cg.core.tools.cli import main
from airflow_provider_cg.core.tools.server import EmbeddedNatsServer, free_port

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith("CG_NATS_"):
            monkeypatch.delenv(k)


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = main(list(argv), stdout=out, stderr=err)
    return rc, out.getvalue(), err.getvalue()


def ok(*argv: str) -> str:
    rc, out, err = run(*argv)
    assert (rc, err) == (0, ""), err
    return out


def js(*argv: str):
    return json.loads(ok(*argv, "--json"))


def on_server(url: str, fn):
    """Run ``fn(nc)`` (async) on a fresh connection."""

    async def go():
        nc = await NatsConnectionSettings(servers=[url]).connect()
        try:
            return await fn(nc)
        finally:
            await nc.close()

    return asyncio.run(go())


def make_streams(url: str) -> None:
    async def fn(nc):
        api = JsApi(nc)
        await api.add_stream({"name": "O", "subjects": ["foo.*"]})
        await api.add_stream({"name": "S", "subjects": ["bar.*"], "subject_transform": {
            "src": "bar.*", "dest": "{{partition(2,1)}}.bar.{{wildcard(1)}}"}})

    on_server(url, fn)


@pytest.fixture
def url(nats_server) -> str:
    make_streams(nats_server.url)
    return nats_server.url


def test_create_info_ls_rm(url):
    s = ("-s", url)
    out = ok("create", "elastic", "O", "g", "--max-members", "4", "--filter", "foo.*", "--wildcards", "1",
             "--max-buffered-msgs", "100", "--members", "m1,m2", *s)
    assert out.startswith("created elastic group g on stream O")
    data = js("create", "elastic", "O", "g", "--max-members", "4", "--filter", "foo.*", "--wildcards", "1",
              "--max-buffered-msgs", "100", *s)
    assert data["created"] is False and data["config"]["members"] == ["m1", "m2"]
    assert data["config"]["partitioning_filters"] == [{"filter": "foo.*", "partitioning_wildcards": [1]}]
    js("create", "static", "S", "st", "--max-members", "2", "--filter", "bar.*", "--mappings", '{"a":[0],"b":[1]}', *s)

    out = ok("info", "O", "g", *s)
    assert "group:        g on stream O (elastic, revision 1)" in out
    assert "work queue:   O-g" in out and "members:      m1, m2" in out
    assert "m1      0-1         no      -" in out
    info = js("info", "S", "st", *s)
    assert info["kind"] == "static" and info["assignment"] == {"a": [0], "b": [1]} and info["active_members"] == []

    assert ok("ls", *s).splitlines() == ["KIND     STREAM  GROUP", "elastic  O       g", "static   S       st"]
    assert js("ls", "S", *s) == [{"kind": "static", "stream": "S", "group": "st"}]

    assert js("rm", "O", "g", *s) == {"deleted": True, "kind": "elastic", "stream": "O", "group": "g"}
    assert ok("rm", "S", "st", *s) == "deleted static group st on stream S\n"
    assert ok("ls", *s) == "no consumer groups\n"
    assert js("ls", *s) == []


def test_membership_commands(url):
    s = ("-s", url)
    ok("create", "elastic", "O", "g", "--max-members", "2", "--filter", "foo.*", "--wildcards", "1", *s)
    assert js("add", "O", "g", "m2", "m1", *s)["config"]["members"] == ["m2", "m1"]
    data = js("add", "O", "g", "m3,m4", *s)
    assert data["assignment"] == {"m1": [0], "m2": [1], "m3": [], "m4": []}
    assert js("drop", "O", "g", "m1", "m4", *s)["config"]["members"] == ["m2", "m3"]
    out = ok("mapping", "set", "O", "g", '[{"member":"x","partitions":[0,1]}]', *s)
    assert "mappings:     x=0-1" in out
    rc, _, err = run("add", "O", "g", "m9", *s)
    assert rc == 1 and err.startswith("cg: error: members: the group uses member_mappings")
    data = js("mapping", "rm", "O", "g", *s)
    assert "members" not in data["config"] and "member_mappings" not in data["config"]

    async def stored(nc):
        kv = await nc.jetstream().key_value("elastic-consumer-groups")
        return (await kv.get("O.g")).value

    assert on_server(url, stored) == (
        b'{"max_members":2,"partitioning_filters":[{"filter":"foo.*","partitioning_wildcards":[1]}]}'
    )


def test_members_status_step_down_reconcile(url):
    s = ("-s", url)
    ok("create", "elastic", "O", "g", "--max-members", "2", "--filter", "foo.*", "--wildcards", "1",
       "--members", "m1,m2", *s)

    async def setup(nc):
        cg = ConsumerGroups(nc)
        await cg.ensure_member_consumer("O", "g", "m1")
        for k in range(20):
            await nc.jetstream().publish(f"foo.{k}", b"x")
        api = JsApi(nc)
        for _ in range(100):  # sourced into the work queue, and counted by m1's consumer
            if (await api.stream_info("O-g"))["state"]["messages"] == 20 and \
                    (await api.consumer_info("O-g", "m1"))["num_pending"] == 10:
                return
            await asyncio.sleep(0.05)

    on_server(url, setup)
    members = js("members", "O", "g", *s)
    assert [(m["member"], m["partitions"], m["consumer_exists"], m["num_pending"]) for m in members] == [
        ("m1", [0], True, 10), ("m2", [1], False, 0)
    ]
    out = ok("members", "O", "g", *s)
    assert out.splitlines()[0].split() == ["MEMBER", "PARTITIONS", "CONSUMER", "PINNED", "PENDING", "ACK_PENDING",
                                           "REDELIVERED", "WAITING"]
    st = js("status", "O", "g", *s)
    assert st["backlog"] == 20 and st["partitions"] == {"0": 10, "1": 10} and st["inactive_members"] == ["m2"]
    out = ok("status", "O", "g", *s)
    assert "backlog:      20" in out and "no consumer:  m2" in out
    assert "PARTITION  MEMBER  BACKLOG" in out

    assert js("step-down", "O", "g", "m1", *s) == {"stepped_down": "m1", "stream": "O", "group": "g"}
    rc, _, err = run("step-down", "O", "g", "m2", *s)
    assert rc == 1 and err.startswith("cg: error: member: 'm2' has no consumer")

    # a consumer left with stale filters is put right by reconcile
    async def stale(nc):
        kv = await nc.jetstream().key_value("elastic-consumer-groups")
        await kv.put("O.g", b'{"max_members":2,"partitioning_filters":[{"filter":"foo.*",'
                            b'"partitioning_wildcards":[1]}],"members":["m1"]}')

    on_server(url, stale)
    assert js("reconcile", "O", "g", *s) == {"deleted": ["m1"], "recreated": ["m1"]}
    assert js("members", "O", "g", *s)[0]["partitions"] == [0, 1]
    assert js("members", "O", "g", *s)[0]["num_pending"] == 20


def test_sticky_membership_changes_move_only_what_must_move(url):
    s = ("-s", url)
    ok("create", "elastic", "O", "g", "--max-members", "6", "--filter", "foo.*", "--wildcards", "1",
       "--members", "m1,m2,m3", *s)

    def owners(assignment):
        return {p: m for m, ps in assignment.items() for p in ps}

    before = owners(js("info", "O", "g", *s)["assignment"])
    added = js("add", "O", "g", "m4", "--assignment", "sticky", *s)
    after = owners(added["assignment"])
    assert sorted(after) == list(range(6)) and sum(before[p] != after[p] for p in range(6)) == 1  # block: 3
    assert [mm["member"] for mm in added["config"]["member_mappings"]] == ["m1", "m2", "m3", "m4"]
    dropped = js("drop", "O", "g", "m2", "--assignment", "sticky", *s)
    final = owners(dropped["assignment"])
    assert {p for p in range(6) if after[p] != final.get(p)} == {p for p in range(6) if after[p] == "m2"}
    assert sorted(len(ps) for ps in dropped["assignment"].values()) == [2, 2, 2]

    async def stored(nc):  # what orbit reads: member_mappings, no members
        kv = await nc.jetstream().key_value("elastic-consumer-groups")
        return json.loads((await kv.get("O.g")).value)

    cfg = on_server(url, stored)
    assert "members" not in cfg and {mm["member"] for mm in cfg["member_mappings"]} == {"m1", "m3", "m4"}
    rc, _, err = run("add", "O", "g", "m9", "--assignment", "nearest", *s)
    assert rc == 1 and "assignment" in err


def test_lag_per_member_with_the_oldest_pending_age(url):
    """Elastic: the oldest message still in a member's partitions of the work queue; static:
    the oldest after the member consumer's ack floor. Ages measured against the publish time."""
    import time

    s = ("-s", url)
    ok("create", "elastic", "O", "g", "--max-members", "2", "--filter", "foo.*", "--wildcards", "1",
       "--members", "m1,m2", *s)
    ok("create", "static", "S", "st", "--max-members", "2", "--filter", "bar.*", "--members", "a,b", *s)

    async def publish(nc):
        cg = ConsumerGroups(nc)
        for k in range(20):
            await nc.jetstream().publish(f"foo.{k}", b"x")
            await nc.jetstream().publish(f"bar.{k}", b"y")
        await cg.ensure_member_consumer("S", "st", "a")
        api = JsApi(nc)
        for _ in range(100):
            if (await api.stream_info("O-g"))["state"]["messages"] == 20:
                return time.time()
            await asyncio.sleep(0.05)

    published = on_server(url, publish)
    time.sleep(1.2)
    lag = js("lag", "O", "g", *s)
    assert lag["backlog"] == 20 and [(m["member"], m["backlog"]) for m in lag["members"]] == [("m1", 10), ("m2", 10)]
    for m in lag["members"]:
        assert 1.2 <= m["oldest_pending_age_s"] <= time.time() - published + 2.0, m
        (p, part), = m["by_partition"].items()  # 2 partitions, one each
        assert [int(p)] == m["partitions"] and part["stored"] == 10
        assert part["oldest_pending_age_s"] == m["oldest_pending_age_s"]
    static = js("lag", "S", "st", *s)
    by = {m["member"]: m for m in static["members"]}
    assert by["a"]["backlog"] == 10 and by["a"]["oldest_pending_age_s"] >= 1.2
    assert by["b"]["active"] is False  # no consumer yet: nothing read, no age to tell

    # once m1 has acknowledged everything, only m2's partition is old
    async def drain_m1(nc):
        from tests.integration.test_groups import Puller

        cstream, consumer = await ConsumerGroups(nc).ensure_member_consumer("O", "g", "m1")
        assert await Puller(nc, cstream, consumer).drain() == 10
        for _ in range(100):  # the work queue deletes what was acknowledged
            if (await JsApi(nc).stream_info("O-g"))["state"]["messages"] == 10:
                return
            await asyncio.sleep(0.05)

    on_server(url, drain_m1)
    lag = js("lag", "O", "g", *s)
    assert [(m["member"], m["backlog"], m["oldest_pending_age_s"] is None) for m in lag["members"]] == [
        ("m1", 0, True), ("m2", 10, False)]
    assert list(lag["members"][0]["by_partition"].values()) == [{"stored": 0, "oldest_pending_age_s": None}]
    out = ok("lag", "O", "g", *s)
    assert out.splitlines()[3].split()[:6] == ["MEMBER", "PARTITIONS", "BACKLOG", "IN_FLIGHT", "OLDEST_PENDING",
                                              "PINNED"]


@pytest.mark.parametrize(
    "argv, field",
    [
        (["create", "elastic", "O", "bad", "--max-members", "0"], "max_members"),
        (["create", "elastic", "O", "bad", "--max-members", "2", "--filter", "nope.*"], "partitioning_filters[0].filter"),
        (["create", "elastic", "O", "bad", "--max-members", "2", "--filter", "foo.*", "--filter", "foo.x",
          "--wildcards", "1"], "wildcards"),
        (["create", "elastic", "NOPE", "bad", "--max-members", "2"], "stream"),
        (["create", "elastic", "O", "a.b", "--max-members", "2"], "group"),
        (["create", "static", "O", "bad", "--max-members", "2"], "origin_subjects[0]"),
        (["create", "elastic", "O", "g", "--max-members", "3", "--filter", "foo.*", "--wildcards", "1"], "max_members"),
        (["info", "O", "missing"], "group"),
        (["add", "S", "st", "m3"], "members"),
        (["mapping", "set", "O", "g", '{"m1":[0]}'], "member_mappings"),
        (["step-down", "O", "g", "ghost"], "member"),
        (["create", "elastic", "O", "g"], "max-members"),
        (["ls", "--tlsca", "/nonexistent/ca.pem"], "tlsca"),
        (["ls", "--password-file", "/nonexistent/pw"], "password-file"),
    ],
)
def test_invalid_input_exits_1(url, argv, field):
    ok("create", "elastic", "O", "g", "--max-members", "2", "--filter", "foo.*", "--wildcards", "1", "-s", url)
    ok("create", "static", "S", "st", "--max-members", "2", "--filter", "bar.*", "--members", "m1", "-s", url)
    rc, out, err = run(*argv, "-s", url)
    assert rc == 1 and out == ""
    assert err.startswith(f"cg: error: {field}: "), err
    # nothing was written by the refused commands
    assert json.loads(ok("ls", "--json", "-s", url)) == [
        {"kind": "elastic", "stream": "O", "group": "g"}, {"kind": "static", "stream": "S", "group": "st"}
    ]


def test_unreachable_server_exits_2():
    rc, out, err = run("ls", "-s", f"nats://127.0.0.1:{free_port()}", "--timeout", "1")
    assert rc == 2 and out == ""
    assert err.startswith("cg: error: server: cannot reach NATS at nats://127.0.0.1:") and "connection refused" in err


def test_server_refusal_exits_2(url):
    # no JetStream API under that prefix: the server cannot answer
    rc, _, err = run("ls", "-s", url, "--js-prefix", "$JS.nowhere.API", "--timeout", "0.5")
    assert rc == 2 and err.startswith("cg: error: server: ")
    # the server refuses the work-queue stream (its name is taken by a stream of other subjects)
    on_server(url, lambda nc: JsApi(nc).add_stream({"name": "O-x", "subjects": ["x.>"], "max_msgs": 5}))
    rc, _, err = run("create", "elastic", "O", "x", "--max-members", "2", "-s", url)
    assert rc == 1 and err.startswith("cg: error: group: ")  # recognised as a name clash
    # the server refuses the work-queue stream (more storage than it has: 10047); the KV entry
    # written before it is rolled back
    rc, out, err = run("create", "elastic", "O", "big", "--max-members", "2", "--filter", "foo.*",
                       "--max-buffered-bytes", str(10**15), "-s", url)
    assert (rc, out) == (2, "") and err.startswith("cg: error: server: JetStream API error 500/10047")
    assert js("ls", "-s", url) == []


def test_auth_secrets_from_files_and_env(tmp_path, monkeypatch):
    server = EmbeddedNatsServer(tmp_path / "auth", config_extra='authorization { user: "cg", password: "s3cret" }')
    server.start()
    try:
        pw = tmp_path / "pw"
        pw.write_text("s3cret\n")
        assert ok("ls", "-s", server.url, "--user", "cg", "--password-file", str(pw)) == "no consumer groups\n"
        rc, _, err = run("ls", "-s", server.url, "--user", "cg", "--timeout", "1")
        assert rc == 2 and "s3cret" not in err
        bad = tmp_path / "bad"
        bad.write_text("wrong")
        rc, _, err = run("ls", "-s", server.url, "--user", "cg", "--password-file", str(bad), "--timeout", "1")
        assert rc == 2 and "wrong" not in err
        monkeypatch.setenv("CG_NATS_SERVERS", server.url)
        monkeypatch.setenv("CG_NATS_USER", "cg")
        monkeypatch.setenv("CG_NATS_PASSWORD", "s3cret")
        assert ok("ls") == "no consumer groups\n"
    finally:
        server.cleanup()

    tok_server = EmbeddedNatsServer(tmp_path / "tok", config_extra='authorization { token: "t0ken" }')
    tok_server.start()
    try:
        tok = tmp_path / "tok.txt"
        tok.write_text("t0ken")
        monkeypatch.delenv("CG_NATS_USER")
        monkeypatch.delenv("CG_NATS_PASSWORD")
        assert ok("ls", "-s", f"nats://127.0.0.1:{free_port()},{tok_server.url}", "--token-file", str(tok),
                  "--json") == "[]\n"
    finally:
        tok_server.cleanup()


async def test_lag_shows_each_members_last_committed_batch_from_the_sink(nc, nats_server, member_job_zip, tmp_path):
    """``cg lag --sink parquet --sink-path`` reads each member's last committed batch (time,
    rows, origin sequence range) from the lake the jobs land into."""
    import io
    import json as _json

    from airflow_provider_cg.core.tools.cli import main as cg
    from tests.support.member_job import create_group, publish_orders, start_member_job

    await create_group(nc, "ORDERS", "g", partitions=2, members=("m1", "m2"))
    await publish_orders(nc, "ORDERS", "g", 200, 10)
    r = await asyncio.to_thread(start_member_job(
        member_job_zip, tmp_path / "jobs", nats_servers=nats_server.url, stream="ORDERS", group="g", member="m1",
        sink_path=tmp_path / "lake", spark=False, args=["--batch-size", "1000", "--idle-timeout", "1"]).wait, 60)
    assert r.returncode == 0, r.describe()

    def run(*args):
        out, err = io.StringIO(), io.StringIO()
        return cg(["lag", "ORDERS", "g", *args, "--server", nats_server.url], stdout=out, stderr=err), \
            out.getvalue(), err.getvalue()

    code, out, err = await asyncio.to_thread(run, "--sink", "parquet", "--sink-path", str(tmp_path / "lake"), "--json")
    assert code == 0, err
    members = {m["member"]: m for m in _json.loads(out)["members"]}
    last = members["m1"]["last_commit"]
    part = r.summary["partitions"]
    assert last["batch_id"] == r.summary["batch_ids"][-1] and last["rows_written"] == r.summary["rows_written"]
    assert last["origin"]["ORDERS"]["first_seq"] == min(p["first_origin_seq"] for p in part.values())
    assert last["origin"]["ORDERS"]["last_seq"] == max(p["last_origin_seq"] for p in part.values())
    assert members["m2"]["last_commit"] is None
    code, out, err = await asyncio.to_thread(run, "--sink", "parquet", "--sink-path", str(tmp_path / "lake"))
    assert code == 0 and "LAST_COMMIT (UTC)" in out and f"{r.summary['rows_written']} rows, seq" in out, out
    code, out, err = await asyncio.to_thread(run, "--sink", "delta")
    assert code == 1 and err.startswith("cg: error: sink_path: required for the delta sink"), err
    code, out, err = await asyncio.to_thread(run, "--sink", "iceberg", "--iceberg-table", "a.b",
                                             "--iceberg-catalog-uri", "postgresql://u:pw@h/db")
    assert code == 1 and "password" in err and "pw" not in err.replace("password", ""), err
