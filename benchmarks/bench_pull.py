"""Micro-benchmark: consuming a backlog with nats-py's naive loop vs the PriorityClient.

Starts its own nats-server (loopback, JetStream on a temp dir), publishes N messages to a
limits stream, then drains it once per variant, each with a fresh consumer:

  a   nats-py: pull_subscribe fetch(1000) + ``await msg.ack()`` per message (plain consumer,
      nats-py cannot pull from a priority group)
  b   PriorityClient pull(batch) + ack_sync_many (double acks) on a pinned consumer
  b+  the same with iter_batches (next pull prefetched while the batch is acked)
  b'  b on nats-py's ordinary callback path (fast_path=False)
  c   PriorityClient pull(batch) + a plain ``ack()`` per message
  p   pull only (no acks; ack_policy none), fast and ordinary path
  w   b and b+ with ``--work-ms`` of simulated I/O per batch (awaited, like a sink commit):
      where prefetching pays off

Every variant checks at the end that the consumer's ack floor reached N.

    .venv/bin/python benchmarks/bench_pull.py [--messages 200000] [--size 200] [--batch 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nats  # noqa: E402

from airflow_provider_cg.core.jetstream.api import JsApi  # noqa: E402
from airflow_provider_cg.core.jetstream.client import PriorityClient  # noqa: E402
from airflow_provider_cg.core.tools.server import EmbeddedNatsServer  # noqa: E402

STREAM = "BENCH"
SEC = 1_000_000_000


async def fill(nc, api: JsApi, n: int, size: int) -> float:
    """Core-publish ``n`` messages in bursts; a loaded server may drop core publishes on ingest
    ("excessive stream ingest rate"), so each burst is checked and the shortfall sent again."""
    await api.add_stream({"name": STREAM, "subjects": ["bench.>"], "storage": "file", "retention": "limits"})
    payload = b"x" * size
    t0 = time.perf_counter()
    have = 0
    while have < n:
        burst = min(10_000, n - have)
        for i in range(burst):
            await nc.publish(f"bench.{(have + i) % 16}", payload)
        await nc.flush()
        target, last, still = have + burst, -1, time.monotonic()
        while True:
            have = (await api.stream_info(STREAM))["state"]["messages"]
            if have != last:
                last, still = have, time.monotonic()
            if have >= target or time.monotonic() - still > 1.0:
                break
            await asyncio.sleep(0.01)
    return n / (time.perf_counter() - t0)


async def consumer(api: JsApi, name: str, *, pinned: bool = True, ack: bool = True) -> None:
    cfg = {
        "name": name,
        "durable_name": name,
        "ack_policy": "explicit" if ack else "none",
        "max_ack_pending": -1,
        "ack_wait": 120 * SEC,
    }
    if pinned:
        cfg.update(priority_groups=["PCG"], priority_policy="pinned_client", priority_timeout=120 * SEC)
    await api.create_consumer(STREAM, cfg)


async def check(api: JsApi, name: str, n: int, ack: bool = True) -> None:
    """Every message delivered once and acked (plain acks are applied asynchronously: wait)."""
    deadline = time.monotonic() + 10
    while True:
        info = await api.consumer_info(STREAM, name)
        floor = info["ack_floor"]["stream_seq"] if ack else info["delivered"]["stream_seq"]
        if floor == n and info["num_ack_pending"] == 0 and info["num_redelivered"] == 0:
            return
        assert time.monotonic() < deadline, (name, info["ack_floor"], info["num_ack_pending"])
        await asyncio.sleep(0.05)


async def naive(nc, api: JsApi, n: int) -> dict:
    await consumer(api, "naive", pinned=False)
    js = nc.jetstream()
    sub = await js.pull_subscribe_bind(durable="naive", stream=STREAM)
    got = 0
    t0 = time.perf_counter()
    while got < n:
        for msg in await sub.fetch(1000, timeout=5):
            await msg.ack()
            got += 1
    await nc.flush()
    dt = time.perf_counter() - t0
    await sub.unsubscribe()
    await check(api, "naive", n)
    return {"rate": n / dt}


async def ours(
    nc, api: JsApi, n: int, batch: int, name: str, *, fast=True, mode="sync", prefetch=False, work=0.0
) -> dict:
    await consumer(api, name, ack=mode != "none")
    t_pull = t_ack = 0.0
    got = 0
    async with PriorityClient(nc, STREAM, name, fast_path=fast) as pc:
        t0 = time.perf_counter()
        if prefetch:
            async for msgs in pc.iter_batches(batch, max_messages=n, expires=5):
                if work:
                    await asyncio.sleep(work)
                t1 = time.perf_counter()
                res = await pc.ack_sync_many(msgs, timeout=30)
                assert res.all_acked, res.counts()
                t_ack += time.perf_counter() - t1
                got += len(msgs)
        else:
            while got < n:
                t1 = time.perf_counter()
                msgs = await pc.pull(min(batch, n - got), expires=5)
                if work:
                    await asyncio.sleep(work)
                t2 = time.perf_counter()
                t_pull += t2 - t1
                if mode == "sync":
                    res = await pc.ack_sync_many(msgs, timeout=30)
                    assert res.all_acked, res.counts()
                elif mode == "plain":
                    for m in msgs:
                        await pc.ack(m)
                t_ack += time.perf_counter() - t2
                got += len(msgs)
            if mode == "plain":
                await pc.flush()
        dt = time.perf_counter() - t0
    assert got == n, got
    await check(api, name, n, ack=mode != "none")
    out = {"rate": n / dt}
    if t_pull:
        out["pull_rate"] = n / t_pull
    if t_ack and mode != "none":
        out["ack_rate"] = n / t_ack
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--work-ms", type=float, default=50.0, help="simulated I/O per batch in the w variants")
    args = ap.parse_args()
    n, batch, work = args.messages, args.batch, args.work_ms / 1000

    with EmbeddedNatsServer() as server:
        nc = await nats.connect(server.url)
        api = JsApi(nc)
        print(f"nats-server {server.url}; {n} messages of {args.size} bytes; our batch {batch}")
        print(f"publish: {await fill(nc, api, n, args.size):,.0f} msg/s")
        await ours(nc, api, n, batch, "warmup", mode="none")  # load the stream's blocks once
        results: list[tuple[str, dict]] = []
        variants = [
            ("a  nats-py fetch(1000) + msg.ack()", naive(nc, api, n)),
            ("b  pull + ack_sync_many [fast]", ours(nc, api, n, batch, "b", mode="sync")),
            (
                "b+ iter_batches(prefetch) + ack_sync_many [fast]",
                ours(nc, api, n, batch, "bp", prefetch=True),
            ),
            ("b' pull + ack_sync_many [callback path]", ours(nc, api, n, batch, "bc", fast=False)),
            ("c  pull + plain ack() per msg [fast]", ours(nc, api, n, batch, "c", mode="plain")),
            ("p  pull only, no acks [fast]", ours(nc, api, n, batch, "p", mode="none")),
            ("p' pull only, no acks [callback path]", ours(nc, api, n, batch, "pc", fast=False, mode="none")),
            (f"w  b + {args.work_ms:g} ms I/O per batch", ours(nc, api, n, batch, "w", work=work)),
            (
                f"w+ b+ + {args.work_ms:g} ms I/O per batch",
                ours(nc, api, n, batch, "wp", prefetch=True, work=work),
            ),
        ]
        for label, coro in variants:
            r = await coro
            results.append((label, r))
            extra = "".join(f"  {k.replace('_rate', '')} {v:,.0f}/s" for k, v in r.items() if k != "rate")
            print(f"{label:<50} {r['rate']:>10,.0f} msg/s{extra}", flush=True)
        base = results[0][1]["rate"]
        print("\nratio to (a):")
        for label, r in results[1:]:
            print(f"  {label:<50} x{r['rate'] / base:.2f}")
        await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
