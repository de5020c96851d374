"""Benchmark: the control plane at scale, one nats-server, little payload, no JVM.

For each assignment algorithm (``block``: orbit's contiguous blocks; ``sticky``: only the moved
partitions change owner, stored as ``member_mappings``), one elastic group of ``--members``
members over ``--partitions`` partitions:

  create        ``create`` of the group (KV entry and work-queue stream)
  config        the KV entry's size (JetStream's value limit is 1 MB; ours refuses more on read)
  consumers     every member consumer ensured, as each member's first job does
  watchers      one KV watcher per member on the config key (how waiting orbit instances learn
                of a change): the time until every one of them has the new revision
  add / drop    adding ``--change`` members, then dropping them: the compare-and-set write and
                the consumer transition (stale consumers deleted, re-created with new filters);
                then every member consumer is checked against the config
  status, lag   ``cg status`` and ``cg lag`` of the group

Then ``--groups`` elastic groups (6 partitions, one member each) on one origin of ``--messages``
messages, created at once: the server sources every work queue; the sourcing rate per group and
in all, against one group alone in the same run.

Prints a table; writes ``benchmarks/results/control_plane.json``.

    .venv/bin/python benchmarks/bench_control_plane.py [--members 256] [--partitions 4096] [--groups 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
from airflow_provider_cg.core.groups import names as groupnames  # noqa: E402
from airflow_provider_cg.core.groups.admin import ConsumerGroups  # noqa: E402
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter  # noqa: E402
from airflow_provider_cg.core.groups.consumers import filters_of, member_filters  # noqa: E402
from airflow_provider_cg.core.groups.lag import group_lag  # noqa: E402
from airflow_provider_cg.core.jetstream.api import JsApi  # noqa: E402
from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings  # noqa: E402
from airflow_provider_cg.core.jetstream.publish import publish_many  # noqa: E402
from airflow_provider_cg.core.tools.server import EmbeddedNatsServer  # noqa: E402

RESULTS = Path(__file__).parent / "results"
FILTERS = (PartitioningFilter("ord.*", (1,)),)


async def _timed(coro) -> tuple[float, object]:
    t = time.perf_counter()
    out = await coro
    return time.perf_counter() - t, out


async def _consumers_right(groups: ConsumerGroups, api: JsApi, stream: str, group: str) -> int:
    """How many member consumers have exactly the filters the config gives their member (any
    wrong one fails the run)."""
    info = await groups.get(stream, group)
    wq = groupnames.work_queue_stream(stream, group)
    right = 0
    for c in await api.list_consumers(wq):
        want = sorted(member_filters(info.config, c["name"]))
        have = sorted(filters_of(c["config"]))
        assert have == want, f"consumer {c['name']}: filters {have[:3]}... not {want[:3]}..."
        right += 1
    return right


class Watchers:
    """One KV watcher per member on the group's config key, as waiting instances hold."""

    def __init__(self, nc, key: str, n: int) -> None:
        self.nc, self.key, self.n = nc, key, n
        self.seen: list[int] = [0] * n
        self._tasks: list[asyncio.Task] = []
        self._watchers: list = []

    async def start(self) -> None:
        kv = await self.nc.jetstream().key_value(groupnames.KV_BUCKETS["elastic"])
        for i in range(self.n):
            w = await kv.watch(self.key)
            self._watchers.append(w)
            self._tasks.append(asyncio.create_task(self._follow(i, w)))

    async def _follow(self, i: int, w) -> None:
        async for entry in w:
            if entry is not None:
                self.seen[i] = max(self.seen[i], entry.revision)

    async def all_at(self, revision: int, timeout: float = 60.0) -> float:
        t = time.perf_counter()
        while min(self.seen) < revision:  # noqa: ASYNC110 - watchers' own state
            if time.perf_counter() - t > timeout:
                raise TimeoutError(f"{sum(s >= revision for s in self.seen)} of {self.n} watchers saw it")
            await asyncio.sleep(0.002)
        return time.perf_counter() - t

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for w in self._watchers:
            await w.stop()


async def one_group(url: str, assignment: str, members: int, partitions: int, change: int) -> dict:
    nc = await NatsConnectionSettings(servers=[url]).connect()
    api = JsApi(nc)
    groups = ConsumerGroups(nc)
    stream, group = "ORD", f"g-{assignment}"
    names = [f"m{i:03d}" for i in range(members)]
    cfg = ElasticGroupConfig(partitions, FILTERS, members=tuple(names))
    out: dict = {"assignment": assignment, "members": members, "partitions": partitions}
    out["create_s"], info = await _timed(groups.create(stream, group, cfg))
    if assignment == "sticky":  # the same members, stored as mappings (as sticky changes keep them)
        await groups.drop_members(stream, group, names[-1:], assignment="sticky")
        await groups.add_members(stream, group, names[-1:], assignment="sticky")
    kv = await nc.jetstream().key_value(groupnames.KV_BUCKETS["elastic"])
    key = groupnames.config_key(stream, group)
    out["config_bytes"] = len((await kv.get(key)).value)
    t = time.perf_counter()
    await asyncio.gather(*(groups.ensure_member_consumer(stream, group, m) for m in names))
    out["consumers_s"] = time.perf_counter() - t
    out["consumers_right"] = await _consumers_right(groups, api, stream, group)
    watchers = Watchers(nc, key, members)
    await watchers.start()
    extra = [f"x{i:03d}" for i in range(change)]
    out["add_s"], info = await _timed(groups.add_members(stream, group, extra, assignment=assignment))
    out["add_reached_s"] = out["add_s"] + await watchers.all_at(info.revision)
    out["add_config_bytes"] = len((await kv.get(key)).value)
    out["after_add_right"] = await _consumers_right(groups, api, stream, group)
    out["drop_s"], info = await _timed(groups.drop_members(stream, group, extra, assignment=assignment))
    out["drop_reached_s"] = out["drop_s"] + await watchers.all_at(info.revision)
    out["after_drop_right"] = await _consumers_right(groups, api, stream, group)
    await watchers.stop()
    out["status_s"], status = await _timed(groups.status(stream, group))
    out["lag_s"], _ = await _timed(group_lag(nc, stream, group))
    assert len(status.members) >= members
    await groups.delete(stream, group)
    await nc.close()
    return out


async def many_groups(url: str, n_groups: int, messages: int) -> dict:
    nc = await NatsConnectionSettings(servers=[url]).connect()
    api = JsApi(nc)
    groups = ConsumerGroups(nc)
    await api.add_stream({"name": "MANY", "subjects": ["many.*"], "storage": "file"})
    payload = os.urandom(64)
    await publish_many(nc, ((f"many.k{i % 1000}", payload) for i in range(messages)))
    filters = (PartitioningFilter("many.*", (1,)),)

    async def source(names: list[str]) -> float:
        t = time.perf_counter()
        for g in names:
            await groups.create("MANY", g, ElasticGroupConfig(6, filters, members=("m1",)))
        for g in names:
            while int((await api.stream_info(f"MANY-{g}"))["state"]["messages"]) < messages:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        return time.perf_counter() - t

    one = await source(["solo"])
    t_all = await source([f"g{i:03d}" for i in range(n_groups)])
    kv = await nc.jetstream().key_value(groupnames.KV_BUCKETS["elastic"])
    total_config = sum([len((await kv.get(groupnames.config_key("MANY", g))).value)
                        for g in [f"g{i:03d}" for i in range(n_groups)]])
    for g in ["solo", *(f"g{i:03d}" for i in range(n_groups))]:
        await groups.delete("MANY", g)
    await api.delete_stream("MANY")
    await nc.close()
    return {"groups": n_groups, "messages": messages, "one_group_msgs_per_s": messages / one,
            "all_groups_s": t_all, "per_group_msgs_per_s": messages / t_all,
            "all_groups_msgs_per_s": n_groups * messages / t_all, "configs_bytes": total_config}


async def main_async(args) -> dict:
    server = EmbeddedNatsServer().start()
    try:
        nc = await NatsConnectionSettings(servers=[server.url]).connect()
        api = JsApi(nc)
        await api.add_stream({"name": "ORD", "subjects": ["ord.*"], "storage": "file"})
        await publish_many(nc, ((f"ord.k{i}", b"x") for i in range(1000)))
        await nc.close()
        results = {"groups": [await one_group(server.url, a, args.members, args.partitions, args.change)
                              for a in ("block", "sticky")]}
        results["many"] = await many_groups(server.url, args.groups, args.messages)
        return results
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=256)
    ap.add_argument("--partitions", type=int, default=4096)
    ap.add_argument("--change", type=int, default=16, help="members added, then dropped")
    ap.add_argument("--groups", type=int, default=100)
    ap.add_argument("--messages", type=int, default=20_000)
    args = ap.parse_args()
    results = asyncio.run(main_async(args))
    print(f"{'assignment':>10} | {'create':>7} | {'config':>8} | {'consumers':>9} | {'add':>7} | {'add seen':>8} | "
          f"{'drop':>7} | {'drop seen':>9} | {'status':>7} | {'lag':>7} | right")
    for r in results["groups"]:
        print(f"{r['assignment']:>10} | {r['create_s']:>6.2f}s | {r['config_bytes'] / 1024:>6.1f}kB | "
              f"{r['consumers_s']:>8.2f}s | {r['add_s']:>6.2f}s | {r['add_reached_s']:>7.2f}s | {r['drop_s']:>6.2f}s | "
              f"{r['drop_reached_s']:>8.2f}s | {r['status_s']:>6.2f}s | {r['lag_s']:>6.2f}s | "
              f"{r['consumers_right']}/{r['after_add_right']}/{r['after_drop_right']}")
    m = results["many"]
    print(f"\n{m['groups']} groups on one origin of {m['messages']:,} messages: one group alone sources "
          f"{m['one_group_msgs_per_s']:,.0f} msg/s; all at once {m['all_groups_msgs_per_s']:,.0f} msg/s in all, "
          f"{m['per_group_msgs_per_s']:,.0f} per group ({m['per_group_msgs_per_s'] / m['one_group_msgs_per_s']:.3f}x); "
          f"their configs {m['configs_bytes'] / 1024:.1f} kB")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "control_plane.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
