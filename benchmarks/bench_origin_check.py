"""Benchmark: what checking the origin costs a batch (``core/landing/protocol/origin_guard.py``).

Each batch a member job lands records the origin's last message it read (one message get of the
origin when the batch came from a work queue) and, before its acking mark, checks the table's
highest mark against the origin (one message get, and the sink's mark: in memory for the lake
tables, one indexed query in PostgreSQL). Measured in one run, alternating, on one nats-server:

  guarded     the member job as it is
  unguarded   the same job with the guard's two steps replaced by nothing (this script only)

for an elastic member (read from the work queue) and a static one (read from the origin: its
marks are the rows' own times), into the Parquet lake, at two batch sizes (``--batches``). A run
lands ``--messages`` messages into an empty table. Reported: messages per second (median of
``--repeat``), the guarded/unguarded ratio and what it means per batch, and the time each
guarded batch waited on the guard (measured in the run: what the ratio is made of, without the
machine's noise). Prints a table, writes
``benchmarks/results/origin_check.json`` and ``origin_check.png``.

    .venv/bin/python benchmarks/bench_origin_check.py [--messages 60000] [--batches 500,5000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
from airflow_provider_cg.core.groups.admin import ConsumerGroups  # noqa: E402
from airflow_provider_cg.core.groups.config import (  # noqa: E402
    ElasticGroupConfig,
    PartitioningFilter,
    StaticGroupConfig,
)
from airflow_provider_cg.core.jetstream.api import JsApi  # noqa: E402
from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings  # noqa: E402
from airflow_provider_cg.core.jetstream.publish import publish_many  # noqa: E402
from airflow_provider_cg.core.landing.contract import BatchOptions  # noqa: E402
from airflow_provider_cg.core.landing.protocol.origin_guard import OriginGuard  # noqa: E402
from airflow_provider_cg.core.landing.run.member import run_member_batch  # noqa: E402
from airflow_provider_cg.core.landing.sinks import ParquetLakeSink  # noqa: E402
from airflow_provider_cg.core.tools.server import EmbeddedNatsServer  # noqa: E402

RESULTS = Path(__file__).parent / "results"
KINDS = ("elastic", "static")


async def _no_check(self: OriginGuard, checked: object = None) -> None:
    return None


async def _no_mark(self: OriginGuard, inputs: object) -> None:
    return None


class Waits:
    """The time a guarded run's batches wait on the guard: ``mark_of`` (before prepare) and
    ``confirm`` (before the acking mark; the check itself started with the batch)."""

    def __init__(self) -> None:
        self.seconds, self.calls = 0.0, 0
        self.mark_of, self.confirm = OriginGuard.mark_of, OriginGuard.confirm

    def wrap(self) -> None:
        waits = self

        async def mark_of(guard: OriginGuard, inputs: object) -> object:
            t = time.perf_counter()
            try:
                return await waits.mark_of(guard, inputs)  # type: ignore[arg-type]
            finally:
                waits.seconds += time.perf_counter() - t
                waits.calls += 1

        async def confirm(guard: OriginGuard, checked: object = None) -> None:
            t = time.perf_counter()
            try:
                await waits.confirm(guard, checked)  # type: ignore[arg-type]
            finally:
                waits.seconds += time.perf_counter() - t

        OriginGuard.mark_of, OriginGuard.confirm = mark_of, confirm  # type: ignore[method-assign]


async def setup(nc, kind: str, messages: int) -> str:
    """A stream ``<kind>`` with a one-member group over ``messages`` 200-byte messages."""
    api = JsApi(nc)
    stream = kind.upper()
    if kind == "elastic":
        await api.add_stream({"name": stream, "subjects": [f"{kind}.*"], "storage": "file"})
        await ConsumerGroups(nc).create(stream, "g", ElasticGroupConfig(
            4, (PartitioningFilter(f"{kind}.*", (1,)),), members=("m1",)))
    else:
        await api.add_stream({"name": stream, "subjects": [f"{kind}.*"], "storage": "file", "allow_direct": True,
                              "subject_transform": {"src": f"{kind}.*",
                                                    "dest": f"{{{{partition(4,1)}}}}.{kind}.{{{{wildcard(1)}}}}"}})
        await ConsumerGroups(nc).create(stream, "g", StaticGroupConfig(4, (f"{kind}.*",), members=("m1",)))
    await publish_many(nc, ((f"{kind}.k{i % 500}", b"x" * 200) for i in range(messages)))
    if kind == "elastic":
        await sourced(api, stream, messages)
    return stream


async def sourced(api: JsApi, stream: str, messages: int) -> None:
    """Until the group's work queue holds ``messages``."""
    for _ in range(3000):
        if int((await api.stream_info(f"{stream}-g"))["state"]["messages"]) >= messages:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{stream}-g did not source {messages} messages")


async def reset(nc, stream: str, kind: str) -> None:
    """The member back at the start, for the next run (``cg reset --to-earliest``)."""
    from airflow_provider_cg.core.groups.reset import GroupReset
    from airflow_provider_cg.core.groups.reset_plan import ResetTarget

    resets = GroupReset(nc)
    await resets.execute(await resets.plan(stream, "g", ResetTarget("to_earliest")), force=True)
    if kind == "elastic":
        api = JsApi(nc)
        await sourced(api, stream, int((await api.stream_info(stream))["state"]["messages"]))


async def land(nc, stream: str, batch: int, root: Path, guarded: bool) -> tuple[float, int, float]:
    """A run into an empty table: messages per second, batches, ms per batch waited on the guard."""
    sink = ParquetLakeSink(root, fsync=False)
    saved = OriginGuard.confirm, OriginGuard.mark_of
    waits = Waits()
    if guarded:
        waits.wrap()
    else:
        OriginGuard.confirm, OriginGuard.mark_of = _no_check, _no_mark  # type: ignore[method-assign]
    try:
        t = time.perf_counter()
        s = await run_member_batch(nc, sink, BatchOptions(stream=stream, group="g", member="m1", batch_size=batch,
                                                          standby_timeout=5, idle_timeout=0.5))
        took = time.perf_counter() - t
    finally:
        OriginGuard.confirm, OriginGuard.mark_of = saved  # type: ignore[method-assign]
        sink.close()
    return s.messages_read / took, s.batches, waits.seconds * 1000 / max(waits.calls, 1)


async def run(args: argparse.Namespace) -> list[dict]:
    out = []
    with tempfile.TemporaryDirectory(prefix="cg-origin-check-") as d, EmbeddedNatsServer(Path(d) / "nats") as srv:
        nc = await NatsConnectionSettings(servers=[srv.url]).connect()
        try:
            for kind in KINDS:
                stream = await setup(nc, kind, args.messages)
                for batch in args.batches:
                    rates: dict[str, list[float]] = {"guarded": [], "unguarded": []}
                    waited: list[float] = []
                    batches = 0
                    for r in range(args.repeat):
                        for variant in (("guarded", "unguarded") if r % 2 == 0 else ("unguarded", "guarded")):
                            await reset(nc, stream, kind)
                            rate, batches, ms = await land(nc, stream, batch,
                                                           Path(d) / f"{kind}-{batch}-{variant}-{r}",
                                                           variant == "guarded")
                            rates[variant].append(rate)
                            if variant == "guarded":
                                waited.append(ms)
                    g, u = statistics.median(rates["guarded"]), statistics.median(rates["unguarded"])
                    row = {"kind": kind, "batch_size": batch, "batches": batches, "guarded_msg_s": round(g),
                           "unguarded_msg_s": round(u), "ratio": round(g / u, 3),
                           "ms_per_batch_added": round((batch / g - batch / u) * 1000, 2),
                           "ms_per_batch_waited_on_guard": round(statistics.median(waited), 3), "runs": rates}
                    out.append(row)
                    print(f"{kind:8} batch {batch:>5} ({batches:>3} batches): guarded {g:>9,.0f} msg/s  "
                          f"unguarded {u:>9,.0f} msg/s  ratio {g / u:.3f}  "
                          f"+{row['ms_per_batch_added']:.2f} ms/batch; waited on the guard "
                          f"{row['ms_per_batch_waited_on_guard']:.2f} ms/batch", flush=True)
        finally:
            await nc.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=60_000)
    p.add_argument("--batches", default="500,5000", help="batch sizes, comma-separated")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    out = asyncio.run(run(args))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "origin_check.json").write_text(json.dumps(out, indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6.5, 4))
    labels = [f"{r['kind']}\nbatch {r['batch_size']}" for r in out]
    xs = range(len(out))
    ax.bar([x - 0.2 for x in xs], [r["unguarded_msg_s"] for r in out], 0.4, label="unguarded")
    ax.bar([x + 0.2 for x in xs], [r["guarded_msg_s"] for r in out], 0.4, label="guarded (origin checked)")
    for x, r in zip(xs, out, strict=True):
        ax.annotate(f"{r['ratio']:.2f}x", (x + 0.2, r["guarded_msg_s"]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("messages landed per second (median)")
    ax.set_title("The origin check's cost, same run")
    ax.legend(loc="lower center")
    fig.tight_layout()
    fig.savefig(RESULTS / "origin_check.png", dpi=110)


if __name__ == "__main__":
    main()
