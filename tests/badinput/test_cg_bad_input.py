"""Bad input to the ``cg`` CLI, by category, against a real nats-server holding real groups.

Each case must get exit 1 (invalid input) or 2 (server / connection), one line on stderr
naming the field and the rule, no traceback, no hang, and leave the server's state as it was.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.codec import dump_config
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter, StaticGroupConfig
from tests.support.badinput import acg, cg_process, report, snapshot

pytestmark = [pytest.mark.integration]

BAD_NAMES = ["", " ", "a b", "a.b", "a*", "a>", "*", ">", "a/b", "a\\b", "a\tb", "a\x00b", "a\x7fb",
             "x" * 256, "é" * 130]
BAD_KV_NAMES = ["$JS", "a+b", "a@b", "ä", "a:b", "a,b"]  # valid JetStream names, unusable in the KV key
GROUP_COMMANDS = [
    ("info",), ("rm",), ("add", "m9"), ("drop", "m1"), ("mapping", "set", '{"m1":[0,1,2,3]}'),
    ("mapping", "rm"), ("step-down", "m1"), ("members",), ("status",), ("reconcile",), ("lag",),
    ("reset", "--to-latest", "--execute", "--force"), ("resize", "--max-members", "8", "--execute"),
    ("layout", "partition-streams"),
]


@pytest.fixture
async def world(nc, nats_server):
    """An elastic group ORDERS/g (m1, m2), a static group S/st, and their streams."""
    await nc.jetstream().add_stream(name="ORDERS", subjects=["orders.*"])
    await nc.jetstream().add_stream(name="S", subjects=["s.*"], subject_transform={
        "src": "s.*", "dest": "{{Partition(2,1)}}.s.{{Wildcard(1)}}"})
    cg = ConsumerGroups(nc)
    await cg.create("ORDERS", "g", ElasticGroupConfig(4, (PartitioningFilter("orders.*", (1,)),), members=("m1", "m2")))
    await cg.create("S", "st", StaticGroupConfig(2, ("s.*",), ("a", "b")))
    # an ack wait (and so an inactivity threshold) longer than any test here: a consumer that
    # idled out mid-test would read as a command changing the server's state
    await cg.ensure_member_consumer("ORDERS", "g", "m1", ack_wait=300)
    return ["--server", nats_server.url, "--timeout", "3"]


def _commands(stream: str, group: str):
    for cmd in GROUP_COMMANDS:
        head = list(cmd[:2]) if cmd[0] == "mapping" else [cmd[0]]
        yield [*head, stream, group, *cmd[len(head):]]
    yield ["create", "elastic", stream, group, "--max-members", "2", "--filter", "orders.*", "--wildcards", "1"]
    yield ["create", "static", stream, group, "--max-members", "2", "--members", "a"]


async def _check(nc, srv, cases, field, code=1) -> list[str]:
    failures = []
    before = await snapshot(nc)
    for argv in cases:
        a = await acg(*argv, *srv)
        for problem in a.problems(code, field):
            failures.append(f"{argv!r}: {problem}: {a.err.strip()[:200]!r}")
    if await snapshot(nc) != before:
        failures.append("the server's state changed")
    return failures


async def test_bad_stream_names(nc, world):
    names = BAD_NAMES + BAD_KV_NAMES
    cases = [argv for n in names for argv in _commands(n, "g")] + [["ls", n] for n in names]
    report(await _check(nc, world, cases, "stream"))


async def test_bad_group_names(nc, world):
    cases = [argv for n in BAD_NAMES + BAD_KV_NAMES for argv in _commands("ORDERS", n)]
    report(await _check(nc, world, cases, "group"))


async def test_bad_member_names(nc, world):
    cases = []
    for n in BAD_NAMES:
        cases += [["add", "ORDERS", "g", n], ["drop", "ORDERS", "g", n], ["step-down", "ORDERS", "g", n],
                  ["create", "elastic", "ORDERS", "g2", "--max-members", "2", "--members", n or ","],
                  ["mapping", "set", "ORDERS", "g", json.dumps({n: [0, 1, 2, 3]})]]
    failures = []
    before = await snapshot(nc)
    for argv in cases:
        a = await acg(*argv, *world)
        failures += [f"{argv!r}: {p}: {a.err.strip()[:160]!r}" for p in a.problems(1, None)]
        if a.rc == 1 and not any(f in a.err for f in ("member", "members")):
            failures.append(f"{argv!r}: does not name the member field: {a.err.strip()[:160]!r}")
    if await snapshot(nc) != before:
        failures.append("the server's state changed")
    report(failures)


async def test_static_durable_names_of_prefix_groups(nc, world):
    """Group ``a`` member ``b-m1`` and group ``a-b`` member ``m1`` would share ``a-b-m1``;
    ``rm`` of group ``a`` never touches group ``a-b``'s durable."""
    assert (await acg("create", "static", "S", "a-b", "--max-members", "2", "--members", "m1", *world)).rc == 0
    await ConsumerGroups(nc).ensure_member_consumer("S", "a-b", "m1")
    report(await _check(nc, world, [["create", "static", "S", "a", "--max-members", "2", "--members", "b-m1,x"]],
                        "members[0]"))
    assert (await acg("create", "static", "S", "a", "--max-members", "2", "--members", "m2", *world)).rc == 0
    assert (await acg("rm", "S", "a", *world)).rc == 0
    from airflow_provider_cg.core.jetstream.api import JsApi

    assert await JsApi(nc).consumer_info("S", "a-b-m1") is not None  # group a-b's position is kept


async def test_bad_mappings(nc, world):
    bad = ["[", "[" * 100_000, "{" * 50_000, "null", '"m1"', "1", "[]", "{}", '{"m1": "x"}', '{"m1": [0.5]}',
           '{"m1": [true]}', '[{"member": null, "partitions": [0,1,2,3]}]', '[{"member": 1, "partitions": [0,1,2,3]}]',
           '[{"member": "m1"}]', '[{"member": "m1", "partitions": [0,1,2,3], "x": 1}]', '{"m1": [0, 0, 1, 2, 3]}',
           '{"m1": [0, 1, 2, 3, 4]}', '{"m1": [-1, 0, 1, 2, 3]}', '{"m1": [0, 1]}', '{"m1": [0, 1], "m2": [1, 2, 3]}',
           '{"m1": [' + ",".join(["0"] * 200_000) + "]}", '{"a b": [0, 1, 2, 3]}']
    cases = [["mapping", "set", "ORDERS", "g", m] for m in bad]
    cases += [["create", "elastic", "ORDERS", "g3", "--max-members", "4", "--mappings", m] for m in bad if m != "[]"]
    cases += [["plan", "--max-members", "4", "--mappings", m] for m in bad]
    cases += [["plan", "--max-members", "4", "--members", "a", "--next-mappings", m] for m in bad]
    failures = []
    before = await snapshot(nc)
    for argv in cases:
        a = await acg(*argv, *(world if argv[0] != "plan" else []))
        failures += [f"{argv[:4]!r}: {p}: {a.err.strip()[:160]!r}" for p in a.problems(1, None)]
        if a.rc == 1 and "mapping" not in a.err and "member" not in a.err and "partition" not in a.err:
            failures.append(f"{argv[:4]!r}: the error does not name the mappings: {a.err.strip()[:160]!r}")
    if await snapshot(nc) != before:
        failures.append("the server's state changed")
    report(failures)


async def test_corrupt_config_in_the_kv_bucket(nc, world):
    """Whatever another tool stored: a clear error (bounded memory), and ``rm --force``."""
    kv = await nc.jetstream().key_value("elastic-consumer-groups")
    corrupt = [b"not json", b"[1,2]", b"null", b'"x"', b"{}", b'{"max_members":0}', b'{"max_members":-1}',
               b'{"max_members":10000000}', b'{"max_members":"4"}', b'{"max_members":4.5}',
               b'{"max_members":4,"members":"m1"}', b'{"max_members":4,"members":[1]}',
               b'{"max_members":4,"members":["a b"]}', b'{"max_members":2,"members":["m1"],"member_mappings":[{"member":"m1","partitions":[0,1]}]}',
               b'{"max_members":2,"member_mappings":[{"member":"m1","partitions":[0,0]}]}',
               b'{"max_members":2,"partitioning_filters":[{"filter":"","partitioning_wildcards":[]}]}',
               b'{"max_members":2,"partitioning_filters":[{"filter":"a.*","partitioning_wildcards":[5]}]}',
               b'{"max_members":2,"partitioning_filters":"x"}', b"[" * 100_000,
               json.dumps({"max_members": 4, "members": [f"m{i}" for i in range(130_000)]}).encode()[:900_000]]
    failures = []
    for i, value in enumerate(corrupt):
        key_group = f"bad{i}"
        await kv.put(f"ORDERS.{key_group}", value)
        before = await snapshot(nc)
        for argv in (["info", "ORDERS", key_group], ["status", "ORDERS", key_group], ["members", "ORDERS", key_group],
                     ["add", "ORDERS", key_group, "m3"], ["rm", "ORDERS", key_group]):
            a = await acg(*argv, *world)
            failures += [f"{value[:40]!r} {argv[0]}: {p}: {a.err.strip()[:200]!r}" for p in a.problems(1, "config")]
            if a.rc == 1 and "--force" not in a.err:
                failures.append(f"{value[:40]!r} {argv[0]}: does not say how to remove it")
        if await snapshot(nc) != before:
            failures.append(f"{value[:40]!r}: the server's state changed")
        a = await acg("rm", "ORDERS", key_group, "--force", *world)
        if a.rc != 0:
            failures.append(f"{value[:40]!r}: rm --force failed: {a.err.strip()[:200]!r}")
        elif (await acg("info", "ORDERS", key_group, *world)).rc != 1:
            failures.append(f"{value[:40]!r}: still there after rm --force")
    report(failures)


async def test_a_key_in_both_buckets(nc, world):
    skv = await nc.jetstream().key_value("static-consumer-groups")
    await skv.put("ORDERS.g", dump_config(StaticGroupConfig(2, (), ("x",))))
    a = await acg("info", "ORDERS", "g", *world)
    report([f"info: {p}" for p in a.problems(1, "group")])
    assert "--kind" in a.err or "kind" in a.err
    assert (await acg("info", "ORDERS", "g", "--kind", "elastic", *world)).rc == 0
    assert (await acg("rm", "ORDERS", "g", "--kind", "static", *world)).rc == 0
    assert (await acg("info", "ORDERS", "g", *world)).rc == 0


async def test_deleted_work_queue_and_origin_streams(nc, world):
    from airflow_provider_cg.core.jetstream.api import JsApi

    api = JsApi(nc)
    await api.delete_stream("ORDERS-g")
    failures = []
    for argv in (["status", "ORDERS", "g"],):
        a = await acg(*argv, *world)
        failures += [f"{argv!r}: {p}: {a.err.strip()[:200]!r}" for p in a.problems(2, "server")]
        if "missing" not in a.err:
            failures.append(f"{argv!r}: does not say the work-queue stream is missing: {a.err!r}")
    await api.delete_stream("S")
    a = await acg("status", "S", "st", *world)
    failures += [f"static status: {p}: {a.err.strip()[:200]!r}" for p in a.problems(2, "server")]
    report(failures)
    # the group can be restored by creating it again with the same config
    assert (await acg("create", "elastic", "ORDERS", "g", "--max-members", "4", "--filter", "orders.*",
                      "--wildcards", "1", *world)).rc == 0
    assert (await acg("status", "ORDERS", "g", *world)).rc == 0


async def test_accepted_invalid_input_is_refused(nc, world):
    report(await _check(nc, world, [
        ["create", "elastic", "ORDERS", "g", "--max-members", "4", "--filter", "orders.*", "--wildcards", "1",
         "--members", "zz"],  # exists with another membership
        ["mapping", "set", "ORDERS", "g", "[]"],
        ["create", "static", "ORDERS", "g", "--max-members", "4"],  # exists as an elastic group
    ], None))


async def test_bad_layout_moves(nc, world):
    """``cg layout``: a layout that does not exist, a wait that is no number of seconds, a static
    group (it has no layout), a group in the middle of a resize."""
    failures = await _check(nc, world, [["layout", "ORDERS", "g", "sideways"], ["layout", "ORDERS", "g", ""]],
                            "LAYOUT")
    failures += await _check(nc, world, [["layout", "ORDERS", "g", "work-queue", "--wait", w]
                                         for w in ("-1", "nan", "inf", "1e300")], "wait")
    failures += await _check(nc, world, [["layout", "S", "st", "partition-streams"]], "layout")
    failures += await _check(nc, world, [["create", "static", "S", "st", "--max-members", "2", "--members", "a,b",
                                          "--layout", "partition-streams"]], "layout")
    report(failures)


async def test_bad_js_prefix_subcommand_and_config_file(nc, world, tmp_path):
    """A JetStream API prefix no subject can hold, a mapping command without its subcommand, a
    config file whose servers is a number: one line naming the field, exit 1, nothing changed."""
    cases = [(["ls", "ORDERS", "--js-prefix", p, *world], "js-prefix") for p in ("", "*", "foo bar", "a..b", "$JS.>")]
    cases += [(["status", "ORDERS", "g", "--js-prefix", "*", *world], "js-prefix"), (["mapping"], "command")]
    failures = []
    before = await snapshot(nc)
    for argv, field in cases:
        a = await acg(*argv)
        failures += [f"{argv[:4]!r}: {p}: {a.err.strip()[:160]!r}" for p in a.problems(1, field)]
    conf = tmp_path / "nats.json"
    for servers in (4222, {"url": "x"}, [4222], True):
        conf.write_text(json.dumps({"servers": servers}))
        a = await asyncio.to_thread(cg_process, "ls", "ORDERS", env={"CG_NATS_CONFIG_FILE": str(conf)})
        failures += [f"servers={servers!r}: {p}: {a.err.strip()[:160]!r}"
                     for p in a.problems(1, "CG_NATS_CONFIG_FILE: servers")]
    if await snapshot(nc) != before:
        failures.append("the server's state changed")
    report(failures)
