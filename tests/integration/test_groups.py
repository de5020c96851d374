"""ConsumerGroups against a real nats-server: creation, orbit compatibility, membership
transitions (with concurrent writers and messages in flight), pins, member info and status."""

from __future__ import annotations

import asyncio
import json
import random

import nats.errors
import pytest
from nats.js.api import StorageType

from airflow_provider_cg.core.errors import ConfigError, ConsumerGroupError, GroupNotFound
from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.codec import dump_config
from airflow_provider_cg.core.groups.config import (
    ElasticGroupConfig,
    MemberMapping,
    PartitioningFilter,
    StaticGroupConfig,
)
from airflow_provider_cg.core.groups.partitioning import distribute, partition_of
from airflow_provider_cg.core.jetstream.api import JsApi

pytestmark = pytest.mark.integration

ELASTIC_BUCKET = "elastic-consumer-groups"
STATIC_BUCKET = "static-consumer-groups"


# --- helpers ------------------------------------------------------------------------------


class Puller:
    """Raw pinned pulls on a member consumer (group PCG), acks with a reply (double ack)."""

    def __init__(self, nc, stream: str, consumer: str) -> None:
        self.nc, self.stream, self.consumer = nc, stream, consumer
        self.pin: str | None = None
        self.last_status: str | None = None

    async def pull(self, batch: int = 100, expires: float = 0.3, _retry: bool = True) -> list:
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox)
        body = {"batch": batch, "expires": int(expires * 1e9), "group": "PCG"}
        if self.pin:
            body["id"] = self.pin
        self.last_status = None
        msgs = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + expires + 1.0
        try:
            await self.nc.publish(
                f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.consumer}", json.dumps(body).encode(), reply=inbox
            )
            while len(msgs) < batch:
                try:
                    m = await sub.next_msg(timeout=max(0.05, deadline - loop.time()))
                except nats.errors.TimeoutError:
                    break
                status = (m.headers or {}).get("Status")
                if status == "100":
                    continue
                if status:
                    self.last_status = status
                    break
                if m.headers and m.headers.get("Nats-Pin-Id"):
                    self.pin = m.headers["Nats-Pin-Id"]
                msgs.append(m)
        finally:
            await sub.unsubscribe()
        if self.last_status == "423":  # the pin moved (or the consumer is new): pull as a candidate
            self.pin = None
            if _retry and not msgs:
                return await self.pull(batch, expires, _retry=False)
        return msgs

    async def ack(self, msg) -> bool:
        """Double ack: True only if the server confirmed it."""
        try:
            await self.nc.request(msg.reply, b"+ACK", timeout=1.0)
            return True
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            return False

    async def drain(self) -> int:
        n = 0
        while True:
            msgs = await self.pull()
            if not msgs:
                return n
            for m in msgs:
                assert await self.ack(m)
                n += 1


async def origin(nc, name: str = "O", subjects=("foo.*",), **extra) -> None:
    await JsApi(nc).add_stream({"name": name, "subjects": list(subjects), "storage": "file", **extra})


async def static_origin(nc, name: str = "S", partitions: int = 2) -> None:
    await JsApi(nc).add_stream(
        {
            "name": name,
            "subjects": ["bar.*"],
            "subject_transform": {"src": "bar.*", "dest": f"{{{{partition({partitions},1)}}}}.bar.{{{{wildcard(1)}}}}"},
        }
    )


def elastic(n: int = 2, members=("m1",), **kw) -> ElasticGroupConfig:
    return ElasticGroupConfig(n, (PartitioningFilter("foo.*", (1,)),), members=tuple(members), **kw)


async def kv_raw(nc, bucket: str, key: str):
    kv = await nc.jetstream().key_value(bucket)
    return await kv.get(key)


async def bucket_keys(nc, bucket: str) -> list[str]:
    try:
        kv = await nc.jetstream().key_value(bucket)
    except nats.js.errors.BucketNotFoundError:
        return []
    try:
        return await kv.keys()
    except nats.js.errors.NoKeysError:
        return []


async def publish_keys(nc, keys, prefix="foo") -> None:
    js = nc.jetstream()
    for k in keys:
        await js.publish(f"{prefix}.{k}", f"{k}".encode())


async def wait_for(cond, limit: float = 10.0, every: float = 0.05):
    loop = asyncio.get_running_loop()
    end = loop.time() + limit
    while True:
        v = await cond()
        if v:
            return v
        if loop.time() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(every)


@pytest.fixture
async def cg(nc):
    return ConsumerGroups(nc, transition_pause=0.1, overlap_deadline=10.0)


# --- create -------------------------------------------------------------------------------


async def test_create_elastic_writes_orbit_json_and_work_queue_stream(nc, cg):
    await origin(nc)
    info = await cg.create("O", "g", elastic(2, ("m1", "m2"), max_buffered_msgs=1000, max_buffered_bytes=10000))
    assert info.created and info.kind == "elastic"

    entry = await kv_raw(nc, ELASTIC_BUCKET, "O.g")
    assert entry.value == (
        b'{"max_members":2,"partitioning_filters":[{"filter":"foo.*","partitioning_wildcards":[1]}],'
        b'"max_buffered_msg":1000,"max_buffered_bytes":10000,"members":["m1","m2"]}'
    )
    kv_info = await nc.jetstream().stream_info(f"KV_{ELASTIC_BUCKET}")
    assert kv_info.config.storage == StorageType.FILE

    wq = (await JsApi(nc).stream_info("O-g"))["config"]
    assert wq["retention"] == "workqueue" and wq["discard"] == "new"
    assert (wq["max_msgs"], wq["max_bytes"]) == (1000, 10000)
    assert wq["allow_direct"] is True and wq["storage"] == "file" and wq["num_replicas"] == 1
    assert wq["sources"] == [
        {"name": "O", "subject_transforms": [{"src": "foo.*", "dest": "{{Partition(2,1)}}.foo.{{Wildcard(1)}}"}]}
    ]

    # the stream really partitions like partition_of
    await publish_keys(nc, range(20))

    async def sourced():
        si = await JsApi(nc).stream_info("O-g", subjects_filter=">")
        return si["state"]["subjects"] if si["state"]["messages"] == 20 else None

    subjects = await wait_for(sourced)
    for k in range(20):
        assert subjects[f"{partition_of(f'foo.{k}', 2, (1,), 'foo.*')}.foo.{k}"] == 1


async def test_create_elastic_without_filters_partitions_whole_subject(nc, cg):
    await origin(nc, subjects=("foo.>",))
    await cg.create("O", "g", ElasticGroupConfig(3, members=("m1",)))
    wq = (await JsApi(nc).stream_info("O-g"))["config"]
    assert wq["sources"][0]["subject_transforms"] == [{"src": ">", "dest": "{{Partition(3)}}.>"}]
    assert (wq["max_msgs"], wq["max_bytes"]) == (-1, -1)


async def test_create_static_needs_partitioned_subjects(nc, cg):
    await origin(nc, "plain", subjects=("baz.*",))
    with pytest.raises(ConfigError) as e:
        await cg.create("plain", "g", StaticGroupConfig(2, ("baz.*",), ("m1",)))
    assert e.value.field.startswith("origin_subjects")
    await static_origin(nc, "S", partitions=3)
    with pytest.raises(ConfigError) as e:  # partition count of the transform != max_members
        await cg.create("S", "g", StaticGroupConfig(2, ("bar.*",), ("m1",)))
    assert e.value.field.startswith("origin_subjects") and "max_members" in e.value.rule
    assert await bucket_keys(nc, STATIC_BUCKET) == []

    info = await cg.create("S", "g", StaticGroupConfig(3, ("bar.*",), ("m1", "m2")))
    assert info.created and info.kind == "static"
    assert (await kv_raw(nc, STATIC_BUCKET, "S.g")).value == b'{"max_members":3,"filters":["bar.*"],"members":["m1","m2"]}'
    # no work-queue stream for a static group
    assert "S-g" not in [s.config.name for s in await nc.jetstream().streams_info()]


async def test_create_is_idempotent(nc, cg):
    await origin(nc)
    first = await cg.create("O", "g", elastic(2, ("m1",)))
    again = await cg.create("O", "g", elastic(2, ("m1",)))
    assert first.created and not again.created
    assert again.revision == first.revision
    # same immutable config, other membership: the stored group is returned unchanged
    other = await cg.create("O", "g", elastic(2, ("m9",)))
    assert not other.created and other.config.members == ("m1",)
    # a deleted work-queue stream is put back by an idempotent create
    await JsApi(nc).delete_stream("O-g")
    await cg.create("O", "g", elastic(2, ("m1",)))
    assert (await JsApi(nc).stream_info("O-g"))["config"]["retention"] == "workqueue"


@pytest.mark.parametrize(
    "changed, field",
    [
        (elastic(3, ("m1",)), "max_members"),
        (ElasticGroupConfig(2, (PartitioningFilter("foo.*", ()),), members=("m1",)),
         "partitioning_filters[0].partitioning_wildcards"),
        (elastic(2, ("m1",), max_buffered_msgs=5), "max_buffered_msg"),
    ],
)
async def test_create_refuses_a_different_immutable_field(nc, cg, changed, field):
    await origin(nc)
    await cg.create("O", "g", elastic(2, ("m1",)))
    before = await kv_raw(nc, ELASTIC_BUCKET, "O.g")
    with pytest.raises(ConfigError) as e:
        await cg.create("O", "g", changed)
    assert e.value.field == field
    after = await kv_raw(nc, ELASTIC_BUCKET, "O.g")
    assert (after.value, after.revision) == (before.value, before.revision)


@pytest.mark.parametrize(
    "bad, field",
    [
        (ElasticGroupConfig(0, (PartitioningFilter("foo.*", (1,)),)), "max_members"),
        (ElasticGroupConfig(2, (PartitioningFilter("bar.*", (1,)),)), "partitioning_filters[0].filter"),
        (ElasticGroupConfig(2, (PartitioningFilter("foo.*", (2,)),)), "partitioning_filters[0].partitioning_wildcards[0]"),
        (ElasticGroupConfig(2, (PartitioningFilter("foo.*", (1,)),), members=("m1",),
                            member_mappings=(MemberMapping("m1", (0, 1)),)), "member_mappings"),
        (ElasticGroupConfig(2, (PartitioningFilter("foo.*", (1,)),), member_mappings=(MemberMapping("m1", (0,)),)),
         "member_mappings"),
    ],
)
async def test_invalid_config_never_reaches_the_bucket(nc, cg, bad, field):
    await origin(nc)
    with pytest.raises(ConfigError) as e:
        await cg.create("O", "g", bad)
    assert e.value.field == field
    assert await bucket_keys(nc, ELASTIC_BUCKET) == []
    assert "O-g" not in [s.config.name for s in await nc.jetstream().streams_info()]


async def test_bad_names_and_missing_stream_are_refused(nc, cg):
    with pytest.raises(ConfigError) as e:
        await cg.create("O", "g", elastic())
    assert e.value.field == "stream"
    await origin(nc)
    with pytest.raises(ConfigError) as e:
        await cg.create("O", "a.b", elastic())
    assert e.value.field == "group"
    assert await bucket_keys(nc, ELASTIC_BUCKET) == []


async def test_failed_stream_creation_rolls_the_kv_entry_back(nc, cg):
    await origin(nc)
    await JsApi(nc).add_stream({"name": "O-g", "subjects": ["other.>"]})  # squats the WQ name
    with pytest.raises(ConfigError) as e:
        await cg.create("O", "g", elastic())
    assert e.value.field == "group"
    with pytest.raises(GroupNotFound):
        await cg.get("O", "g")
    assert await bucket_keys(nc, ELASTIC_BUCKET) == []
    # and the name can be used once the squatter is gone
    await JsApi(nc).delete_stream("O-g")
    assert (await cg.create("O", "g", elastic())).created


# --- get / list / delete -------------------------------------------------------------------


async def test_get_list_delete(nc, cg):
    await origin(nc)
    await origin(nc, "O2", subjects=("x.*",))
    await static_origin(nc, "S")
    await cg.create("O", "g1", elastic())
    await cg.create("O", "g2", elastic())
    await cg.create("O2", "g1", ElasticGroupConfig(2, (PartitioningFilter("x.*", (1,)),)))
    await cg.create("S", "st", StaticGroupConfig(2, ("bar.*",), ("m1", "m2")))
    assert await cg.list() == [
        ("elastic", "O", "g1"), ("elastic", "O", "g2"), ("elastic", "O2", "g1"), ("static", "S", "st")
    ]
    assert await cg.list("O") == [("elastic", "O", "g1"), ("elastic", "O", "g2")]
    info = await cg.get("S", "st")
    assert (info.kind, info.config.members) == ("static", ("m1", "m2"))
    with pytest.raises(GroupNotFound):
        await cg.get("O", "nope")

    # elastic delete: entry and work-queue stream gone
    await cg.ensure_member_consumer("O", "g1", "m1")
    await cg.delete("O", "g1")
    with pytest.raises(GroupNotFound):
        await cg.get("O", "g1")
    names = [s.config.name for s in await nc.jetstream().streams_info()]
    assert "O-g1" not in names and "O-g2" in names

    # static delete: the member consumers go, other consumers on the origin stay
    await cg.ensure_member_consumer("S", "st", "m1")
    await cg.ensure_member_consumer("S", "st", "m2")
    await JsApi(nc).create_consumer("S", {"durable_name": "other", "ack_policy": "explicit"})
    await cg.delete("S", "st")
    left = sorted(c["name"] for c in await JsApi(nc).list_consumers("S"))
    assert left == ["other"]
    assert await cg.list() == [("elastic", "O", "g2"), ("elastic", "O2", "g1")]
    with pytest.raises(GroupNotFound):
        await cg.delete("S", "st")


# --- orbit-written configs -----------------------------------------------------------------


async def test_config_written_by_orbit_is_read_and_managed(nc, cg):
    await origin(nc)
    js = nc.jetstream()
    kv = await js.create_key_value(bucket=ELASTIC_BUCKET, storage=StorageType.FILE)
    raw = (b'{"max_members":4,"partitioning_filters":[{"filter":"foo.*","partitioning_wildcards":[1]}],'
           b'"max_buffered_msg":1000,"max_buffered_bytes":10000,"members":["m1","m2"]}')
    await kv.put("O.g", raw)
    # the work-queue stream as orbit's CreateElastic makes it
    await JsApi(nc).add_stream({
        "name": "O-g", "retention": "workqueue", "discard": "new", "max_msgs": 1000, "max_bytes": 10000,
        "num_replicas": 1, "storage": "file", "allow_direct": True,
        "sources": [{"name": "O", "subject_transforms": [
            {"src": "foo.*", "dest": "{{Partition(4,1)}}.foo.{{Wildcard(1)}}"}]}],
    })

    info = await cg.get("O", "g")
    assert info.kind == "elastic" and info.config.max_members == 4 and info.config.members == ("m1", "m2")
    # our create with the same config is an idempotent no-op against orbit's stream
    assert not (await cg.create("O", "g", ElasticGroupConfig(
        4, (PartitioningFilter("foo.*", (1,)),), 1000, 10000))).created

    await cg.add_members("O", "g", ["m3"])
    assert (await kv.get("O.g")).value == raw.replace(b'"m2"]', b'"m2","m3"]')

    keys = list(range(40))
    await publish_keys(nc, keys)
    expected = {p: 0 for p in range(4)}
    for k in keys:
        expected[partition_of(f"foo.{k}", 4, (1,), "foo.*")] += 1

    async def counted():
        st = await cg.status("O", "g")
        return st if st.backlog == 40 else None

    st = await wait_for(counted)
    assert st.partitions == expected
    assert {m.member: m.partitions for m in st.members} == {"m1": [0, 3], "m2": [1], "m3": [2]}
    assert st.max_buffered_msgs == 1000 and st.buffer_fill == pytest.approx(max(40 / 1000, st.buffered_bytes / 10000))


async def test_seed_000_field_names_are_read_and_rewritten_in_current_names(nc, cg):
    await origin(nc)
    kv = await nc.jetstream().create_key_value(bucket=ELASTIC_BUCKET, storage=StorageType.FILE)
    await kv.put("O.old", b'{"max_members":2,"filter":"foo.*","partitioning-wildcards":[1],'
                          b'"msg-buffer-size":100,"members":["m1"]}')
    info = await cg.get("O", "old")
    assert info.config.partitioning_filters == (PartitioningFilter("foo.*", (1,)),)
    assert info.config.max_buffered_msgs == 100
    await cg.create("O", "old", ElasticGroupConfig(2, (PartitioningFilter("foo.*", (1,)),), 100))  # makes the WQ
    await cg.add_members("O", "old", ["m2"])
    stored = json.loads((await kv.get("O.old")).value)
    assert stored == {"max_members": 2, "partitioning_filters": [{"filter": "foo.*", "partitioning_wildcards": [1]}],
                      "max_buffered_msg": 100, "members": ["m1", "m2"]}


# --- membership -----------------------------------------------------------------------------


async def test_reference_elastic_membership_scenario(nc, cg):
    """orbit's TestElastic, with 20 messages a round: m1 20; +m2: 30/10; -m1: 30/30."""
    await origin(nc)
    keys = list(range(20))
    assert sorted(partition_of(f"foo.{k}", 2, (1,), "foo.*") for k in keys) == [0] * 10 + [1] * 10
    await cg.create("O", "g", elastic(2, ()))
    await cg.add_members("O", "g", ["m1"])
    p1 = Puller(nc, *await cg.ensure_member_consumer("O", "g", "m1", ack_wait=2))
    with pytest.raises(ConfigError) as e:
        await cg.ensure_member_consumer("O", "g", "m2")
    assert e.value.field == "member"

    counts = {"m1": 0, "m2": 0}
    await publish_keys(nc, keys)
    await asyncio.sleep(0.2)
    counts["m1"] += await p1.drain()
    assert counts == {"m1": 20, "m2": 0}

    await cg.add_members("O", "g", ["m2"])
    # m1's consumer has a pinned instance: the change leaves it to that instance, which here is
    # a raw puller that does not follow the config; reconcile does what a member job does itself
    assert await JsApi(nc).consumer_info("O-g", "m1") is not None
    await cg.reconcile("O", "g")
    p2 = Puller(nc, *await cg.ensure_member_consumer("O", "g", "m2", ack_wait=2))
    await publish_keys(nc, keys)
    await asyncio.sleep(0.2)
    counts["m1"] += await p1.drain()
    counts["m2"] += await p2.drain()
    assert counts == {"m1": 30, "m2": 10}

    await cg.drop_members("O", "g", ["m1"])
    await cg.reconcile("O", "g")
    assert await JsApi(nc).consumer_info("O-g", "m1") is None
    await publish_keys(nc, keys)
    await asyncio.sleep(0.2)
    counts["m1"] += await p1.drain()
    counts["m2"] += await p2.drain()
    assert counts == {"m1": 30, "m2": 30}
    assert (await JsApi(nc).stream_info("O-g"))["state"]["messages"] == 0


async def test_transition_recreates_only_existing_consumers_with_their_settings(nc, cg):
    await origin(nc)
    await cg.create("O", "g", elastic(4, ("a", "b")))
    await cg.ensure_member_consumer("O", "g", "a", ack_wait=3, max_ack_pending=7)
    await cg.add_members("O", "g", ["c"])
    a = await JsApi(nc).consumer_info("O-g", "a")
    assert a["config"]["filter_subjects"] == ["0.foo.*", "3.foo.*"]
    assert a["config"]["ack_wait"] == 3_000_000_000 and a["config"]["max_ack_pending"] == 7
    assert a["config"]["priority_groups"] == ["PCG"]
    assert await JsApi(nc).consumer_info("O-g", "b") is None  # b had none: the member job makes it
    assert await JsApi(nc).consumer_info("O-g", "c") is None


async def test_mappings_set_and_delete(nc, cg):
    await origin(nc)
    await cg.create("O", "g", elastic(2, ("m1", "m2")))
    await cg.ensure_member_consumer("O", "g", "m1")
    await cg.ensure_member_consumer("O", "g", "m2")
    info = await cg.set_mappings("O", "g", '[{"member":"m1","partitions":[1]},{"member":"m2","partitions":[0]}]')
    assert info.config.members == () and info.config.member_mappings[0] == MemberMapping("m1", (1,))
    states = {s.member: s for s in await cg.member_info("O", "g")}
    assert states["m1"].partitions == [1] and states["m2"].partitions == [0]
    assert all(s.consumer_exists and s.filters_current for s in states.values())
    with pytest.raises(ConfigError) as e:
        await cg.add_members("O", "g", ["m3"])
    assert e.value.field == "members"
    with pytest.raises(ConfigError) as e:  # partition 1 unmapped
        await cg.set_mappings("O", "g", {"m1": [0]})
    assert e.value.field == "member_mappings"

    await cg.delete_mappings("O", "g")
    info = await cg.get("O", "g")
    assert info.config.members == () and info.config.member_mappings == ()
    assert await JsApi(nc).list_consumers("O-g") == []


async def test_static_membership_is_fixed(nc, cg):
    await static_origin(nc, "S")
    await cg.create("S", "g", StaticGroupConfig(2, ("bar.*",), ("m1",)))
    with pytest.raises(ConfigError) as e:
        await cg.add_members("S", "g", ["m2"])
    assert e.value.field == "members"
    with pytest.raises(ConfigError) as e:
        await cg.set_mappings("S", "g", {"m1": [0, 1]})
    assert e.value.field == "member_mappings"
    with pytest.raises(ConfigError) as e:
        await cg.reconcile("S", "g")
    assert e.value.field == "group"
    # a durable with other filters is never silently re-created (it would replay the stream)
    await JsApi(nc).create_consumer("S", {"durable_name": "g-m1", "ack_policy": "explicit",
                                          "filter_subjects": ["1.bar.*"], "priority_groups": ["PCG"],
                                          "priority_policy": "pinned_client"})
    with pytest.raises(ConfigError) as e:
        await cg.ensure_member_consumer("S", "g", "m1")
    assert e.value.field == "member" and "replays" in e.value.rule
    assert (await JsApi(nc).consumer_info("S", "g-m1"))["config"]["filter_subjects"] == ["1.bar.*"]


async def test_concurrent_membership_changes_lose_none(nc):
    base = ConsumerGroups(nc, transition_pause=0.05)
    await origin(nc)
    await base.create("O", "g", elastic(16, ("m00",)))
    await base.ensure_member_consumer("O", "g", "m00")
    added = [f"m{i:02d}" for i in range(1, 11)]
    groups = [ConsumerGroups(nc, transition_pause=0.05) for _ in added]
    await asyncio.gather(*(g.add_members("O", "g", [m]) for g, m in zip(groups, added, strict=True)))
    info = await base.get("O", "g")
    assert sorted(info.config.members) == ["m00", *added]
    # and concurrent drops of half of them
    dropped = added[::2]
    await asyncio.gather(*(g.drop_members("O", "g", [m]) for g, m in zip(groups, dropped, strict=False)))
    info = await base.get("O", "g")
    assert sorted(info.config.members) == sorted(["m00", *added[1::2]])
    states = {s.member: s for s in await base.member_info("O", "g")}
    assert states["m00"].consumer_exists and states["m00"].filters_current
    assert states["m00"].partitions == distribute(info.config.members, 16)["m00"] == [0, 1, 12]


async def test_transition_with_messages_in_flight_loses_and_duplicates_none(nc):
    """Members consume (pinned pulls, double acks) while the membership changes under them."""
    admin = ConsumerGroups(nc, transition_pause=0.2)
    await origin(nc)
    await admin.create("O", "g", elastic(4, ("m1", "m2")))
    acked: list[bytes] = []
    stop = asyncio.Event()

    async def member(name: str) -> None:
        cg = ConsumerGroups(nc, overlap_deadline=20)
        while not stop.is_set():
            try:
                cstream, cname = await cg.ensure_member_consumer("O", "g", name, ack_wait=1.0)
            except ConfigError:  # not (or no longer) a member
                await asyncio.sleep(0.05)
                continue
            p = Puller(nc, cstream, cname)
            while not stop.is_set():
                msgs = await p.pull(batch=5, expires=0.2)
                for m in msgs:
                    await asyncio.sleep(random.uniform(0, 0.004))  # "processing"
                    if await p.ack(m):
                        acked.append(m.data)
                if not msgs:
                    break  # idle, deleted or unpinned: re-ensure (cheap if unchanged)

    workers = [asyncio.create_task(member(f"m{i}")) for i in range(1, 5)]
    ids = [f"{i}" for i in range(600)]

    async def produce() -> None:
        js = nc.jetstream()
        for i in ids:
            await js.publish(f"foo.k{int(i) % 97}", i.encode())
            if int(i) % 20 == 0:
                await asyncio.sleep(0.01)

    producer = asyncio.create_task(produce())
    await asyncio.sleep(0.2)
    await admin.add_members("O", "g", ["m3"])
    await asyncio.sleep(0.2)
    await admin.drop_members("O", "g", ["m1"])
    await asyncio.sleep(0.2)
    await admin.add_members("O", "g", ["m4", "m1"])
    await asyncio.sleep(0.1)
    await admin.set_mappings("O", "g", {"m2": [0, 1], "m4": [2, 3]})
    await producer

    async def all_acked():
        for w in workers:
            if w.done():
                w.result()  # a member died: raise its error here
        return len(acked) >= len(ids)

    await wait_for(all_acked, limit=30, every=0.1)
    await asyncio.sleep(0.5)  # would catch late duplicates
    stop.set()
    await asyncio.gather(*workers)

    assert len(acked) == len(set(acked)), "a message was acknowledged twice"
    assert sorted(acked, key=int) == [i.encode() for i in ids]
    assert (await JsApi(nc).stream_info("O-g"))["state"]["messages"] == 0


# --- member consumers -----------------------------------------------------------------------


async def test_member_consumer_config(nc, cg):
    await origin(nc)
    await static_origin(nc, "S")
    e = elastic(2, ("m1", "m2"))
    cstream, cc = cg.member_consumer_config("O", "g", "m2", e, ack_wait=5)
    assert cstream == "O-g"
    assert cc == {
        "name": "m2", "filter_subjects": ["1.foo.*"], "ack_policy": "explicit", "deliver_policy": "all",
        "ack_wait": 5_000_000_000, "priority_groups": ["PCG"], "priority_policy": "pinned_client",
        "priority_timeout": 5_000_000_000, "inactive_threshold": 5_000_000_000,  # orbit v0.2: ack wait x 1
    }
    _, cc = cg.member_consumer_config("O", "g", "m1", e)  # orbit's default ack wait, nothing more
    assert cc["ack_wait"] == cc["priority_timeout"] == cc["inactive_threshold"] == 5_000_000_000
    assert "max_deliver" not in cc and "max_ack_pending" not in cc
    _, cc = cg.member_consumer_config("O", "g", "m1", e, ack_wait=0.2)
    assert cc["priority_timeout"] == 1_000_000_000 and cc["inactive_threshold"] == 200_000_000
    s = StaticGroupConfig(2, ("bar.*",), ("m1", "m2"))
    cstream, cc = cg.member_consumer_config("S", "st", "m1", s)
    assert cstream == "S" and cc["durable_name"] == cc["name"] == "st-m1" and "inactive_threshold" not in cc
    assert cc["filter_subjects"] == ["0.bar.*"]
    _, cc = cg.member_consumer_config("S", "st", "m1", s, max_ack_pending=3000)
    assert cc["max_ack_pending"] == 3000 and "inactive_threshold" not in cc
    with pytest.raises(ConfigError) as err:
        cg.member_consumer_config("O", "g", "zz", e)
    assert err.value.field == "member"
    with pytest.raises(ConfigError) as err:  # beyond max_members: in the membership, no partitions
        cg.member_consumer_config("O", "g", "m3", elastic(2, ("m1", "m2", "m3")))
    assert err.value.field == "member"


async def test_ensure_member_consumer(nc, cg):
    await origin(nc)
    api = JsApi(nc)
    await cg.create("O", "g", elastic(2, ("m1", "m2")))
    assert await cg.ensure_member_consumer("O", "g", "m1") == ("O-g", "m1")
    created = (await api.consumer_info("O-g", "m1"))["created"]
    # same filters, other settings: left alone
    await cg.ensure_member_consumer("O", "g", "m1", ack_wait=9)
    again = await api.consumer_info("O-g", "m1")
    assert again["created"] == created and again["config"]["ack_wait"] == 5 * 10**9  # orbit's default, kept

    # stale filters (the membership changed behind its back): replaced
    kv = await nc.jetstream().key_value(ELASTIC_BUCKET)
    await kv.put("O.g", dump_config(elastic(2, ("m1",))))
    await cg.ensure_member_consumer("O", "g", "m1")
    assert (await api.consumer_info("O-g", "m1"))["config"]["filter_subjects"] == ["0.foo.*", "1.foo.*"]

    # overlapping filters held by another consumer: retried until it goes away
    await api.delete_consumer("O-g", "m1")
    await api.create_consumer("O-g", {"name": "squatter", "ack_policy": "explicit", "filter_subjects": ["1.foo.*"]})

    async def release():
        await asyncio.sleep(0.4)
        await api.delete_consumer("O-g", "squatter")

    releaser = asyncio.create_task(release())
    await cg.ensure_member_consumer("O", "g", "m1", deadline=5)
    await releaser
    assert (await api.consumer_info("O-g", "m1"))["config"]["filter_subjects"] == ["0.foo.*", "1.foo.*"]

    # ... and a clear error after the deadline
    await api.delete_consumer("O-g", "m1")
    await api.create_consumer("O-g", {"name": "squatter", "ack_policy": "explicit", "filter_subjects": ["0.foo.*"]})
    with pytest.raises(ConsumerGroupError, match="10100"):
        await cg.ensure_member_consumer("O", "g", "m1", deadline=0.3)


async def test_step_down_moves_the_pin(nc, cg):
    await origin(nc)
    await cg.create("O", "g", elastic(1, ("m1",), ))
    cstream, cname = await cg.ensure_member_consumer("O", "g", "m1", ack_wait=5)
    await publish_keys(nc, ["a"])
    a, b = Puller(nc, cstream, cname), Puller(nc, cstream, cname)
    got = await a.pull(batch=1, expires=2)
    assert len(got) == 1 and a.pin
    assert await a.ack(got[0])
    [state] = await cg.member_info("O", "g")
    assert state.pinned_id == a.pin and state.pinned_since

    waiting = asyncio.create_task(b.pull(batch=1, expires=5))  # a standby instance
    await asyncio.sleep(0.2)
    await cg.step_down("O", "g", "m1")
    await publish_keys(nc, ["b"])
    got = await waiting
    assert len(got) == 1 and got[0].data == b"b"
    assert b.pin and b.pin != a.pin
    [state] = await cg.member_info("O", "g")
    assert state.pinned_id == b.pin
    # the old holder is refused now
    assert await a.pull(batch=1, expires=0.3, _retry=False) == [] and a.last_status == "423"

    with pytest.raises(ConfigError) as e:
        await cg.step_down("O", "g", "nobody")
    assert e.value.field == "member"


# --- observation ------------------------------------------------------------------------------


async def test_member_info_and_status_match_what_was_published(nc, cg):
    await origin(nc)
    await cg.create("O", "g", elastic(4, ("m1", "m2", "m3"), max_buffered_msgs=500))
    keys = [f"k{i}" for i in range(300)]
    expected = {p: 0 for p in range(4)}
    for k in keys:
        expected[partition_of(f"foo.{k}", 4, (1,), "foo.*")] += 1
    assignment = {"m1": [0, 3], "m2": [1], "m3": [2]}
    await cg.ensure_member_consumer("O", "g", "m1", ack_wait=30)
    await cg.ensure_member_consumer("O", "g", "m2", ack_wait=30)
    await publish_keys(nc, keys)

    async def counted():
        # the stream's count and each consumer's num_pending are updated apart (the server
        # signals consumers of new messages asynchronously): wait until both are complete
        st = await cg.status("O", "g")
        pending = sum(m.num_pending for m in st.members if m.consumer_exists)
        return st if st.backlog == 300 and pending == 300 - expected[2] else None

    st = await wait_for(counted)
    assert st.partitions == expected
    assert st.buffered_msgs == 300 and st.buffer_fill == pytest.approx(0.6)
    assert st.source_lag == 0
    assert st.inactive_members == ["m3"] and st.unassigned_partitions == []
    by = {m.member: m for m in st.members}
    for m, parts in assignment.items():
        assert by[m].partitions == parts
        assert by[m].backlog == sum(expected[p] for p in parts)
    assert by["m1"].num_pending == expected[0] + expected[3]
    assert by["m2"].num_pending == expected[1]
    assert not by["m3"].consumer_exists and by["m3"].num_pending == 0

    # take 7 from m1 without acking: ack pending; ack 3 of them: backlog shrinks by 3
    p1 = Puller(nc, "O-g", "m1")
    msgs = await p1.pull(batch=7, expires=1)
    assert len(msgs) == 7
    for m in msgs[:3]:
        assert await p1.ack(m)
    states = {s.member: s for s in await cg.member_info("O", "g")}
    assert states["m1"].num_ack_pending == 4
    assert states["m1"].num_pending == expected[0] + expected[3] - 7
    assert states["m1"].pinned_id == p1.pin
    st = await cg.status("O", "g")
    assert st.backlog == 297 and sum(st.partitions.values()) == 297
    assert st.num_ack_pending == 4 and st.num_pending == by["m1"].num_pending + by["m2"].num_pending - 7
    d = json.loads(json.dumps(st.to_dict()))
    assert d["partitions"] == {str(p): n for p, n in st.partitions.items()} and d["backlog"] == 297


async def test_static_status(nc, cg):
    await static_origin(nc, "S", partitions=2)
    await cg.create("S", "st", StaticGroupConfig(2, ("bar.*",), ("m1", "m2")))
    keys = [f"k{i}" for i in range(50)]
    await publish_keys(nc, keys, prefix="bar")
    expected = {0: 0, 1: 0}
    for k in keys:
        expected[partition_of(f"bar.{k}", 2, (1,), "bar.*")] += 1
    await cg.ensure_member_consumer("S", "st", "m1")
    st = await cg.status("S", "st")
    assert st.kind == "static" and st.partitions == expected
    by = {m.member: m for m in st.members}
    assert by["m1"].consumer == "st-m1" and by["m1"].num_pending == expected[0]
    assert st.backlog == expected[0] and st.inactive_members == ["m2"]
