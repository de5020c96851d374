"""Every writer a user can point at one table, at once, under outside faults.

``MixedWritersRun`` is a ``ChaosRun`` (live members with standbys, SIGKILL, SIGSTOP past the
ack wait, step-downs, membership changes, nats-server and object-store restarts, all drawn
from one seed) whose jobs all run one transformation through spark-submit, with more writers of
the same inputs beside them: backfill jobs over random, overlapping windows of what was
published, and ``cg reset`` replays (the group moved back to an earlier origin sequence while
its members run, forced: pinned instances are stepped down). ``recreate=True`` also deletes the
origin stream mid-run (after the old life is drained), creates it again under the same name,
re-creates the group and publishes more: jobs started without ``--stream-life`` must refuse
(exit 1), then every job is given ``--stream-life new:<created>`` and landing goes on.

``check`` reads the table with the format's own reader (delta-rs, pyiceberg, pyarrow over the
Parquet lake's committed files, psycopg2) and asserts each input's effect exactly once:

- ``drop`` (``SELECT * FROM batch WHERE origin_seq % 10 <> 7``): rows map one to one to the
  kept inputs: no loss, no duplicate, and per key the rows in commit order by origin sequence;
- ``aggregate`` (per batch and key: count, sum and sum of squares of the origin sequences): per
  life and key the counts and sums add up to exactly the published messages once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import time
from collections import Counter
from dataclasses import dataclass

from airflow_provider_cg.core.groups import sourcing
from airflow_provider_cg.core.groups.reset import GroupReset
from airflow_provider_cg.core.groups.reset_plan import ResetTarget
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.landing.stream_life import origin_created
from tests.support.chaos import ChaosConfig, ChaosRun, last_error
from tests.support.member_job import assert_exactly_once, publish_orders, start_member_job

TRANSFORMS = {
    "drop": "SELECT * FROM batch WHERE origin_seq % 10 <> 7",
    "aggregate": ("SELECT origin_stream, key, count(*) AS n, sum(origin_seq) AS s, "
                  "sum(origin_seq * origin_seq) AS s2 FROM batch GROUP BY origin_stream, key"),
}
LIFE_REFUSAL = "--stream-life: origin stream"


@dataclass
class MixedConfig(ChaosConfig):
    transform: str = "drop"
    backfills: bool = True
    resets: bool = True
    recreate: bool = False


class MixedWritersRun(ChaosRun):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.key = self.stream  # the rows' origin_stream: the origin's life in the table
        self.stream_life: str | None = None
        self.windows: list[tuple[float, float]] = []  # (before, after) each published chunk
        self.recreated = False
        self.refused = 0  # jobs that refused the new life before the option was given
        self.backfills_started = 0
        self.resets_tried = 0

    # --- jobs ------------------------------------------------------------------------------

    def _args(self) -> tuple[list[str], object]:
        from tests.support.chaos import JOB_ARGS

        sink_path, sink_args = self.sink_args()
        life = ["--stream-life", self.stream_life] if self.stream_life else []
        return [*JOB_ARGS, *sink_args, "--transform-sql", TRANSFORMS[self.config.transform], *life], sink_path

    def start_job(self, member: str):
        args, sink_path = self._args()
        args = [*args, *self.follow_args()]  # a member's job may follow; a backfill never does
        job = start_member_job(self.zip_path, self.workdir / "jobs", nats_servers=self.urls, stream=self.stream,
                               group=self.group, member=member, sink=self.config.sink, sink_path=sink_path,
                               args=args, env=self.sink_env, spark=True)
        self.jobs.append((member, job))
        return job

    def start_backfill(self) -> None:
        if not self.windows:
            return
        i = self.rng.randrange(len(self.windows))
        j = self.rng.randrange(i, len(self.windows))
        start, end = self.windows[i][0], self.windows[j][1]
        args, sink_path = self._args()
        iso = [dt.datetime.fromtimestamp(t, dt.UTC).isoformat() for t in (start, end)]
        job = start_member_job(self.zip_path, self.workdir / "jobs", nats_servers=self.urls, stream=self.stream,
                               group=self.group, member=None, sink=self.config.sink, sink_path=sink_path,
                               args=[*args, "--backfill-start", iso[0], "--backfill-end", iso[1]],
                               env=self.sink_env, spark=True)
        self.jobs.append(("backfill", job))
        self.backfills_started += 1
        self.log(f"backfill job {job.pid} over chunks {i}-{j}")

    async def reset_back(self) -> None:
        """``cg reset --to-seq N --execute --force`` to a random origin sequence at or before
        every partition's position: a replay (a reset forward would skip messages on purpose)."""
        self.resets_tried += 1
        resets = GroupReset(self.nc)
        try:
            lowest = min((await resets.positions(self.stream, self.group)).values(), default=1)
        except Exception as e:  # noqa: BLE001 - a restart in between: no reset this time
            self.log(f"reset: positions unreadable ({str(e)[:80]})")
            return
        if lowest < 2:
            return
        seq = self.rng.randint(1, lowest)
        try:
            plan = await resets.plan(self.stream, self.group, ResetTarget.parse(to_seq=seq))
            if plan.skip:
                self.log(f"reset to seq {seq} would skip {plan.skip}: not done")
                return
            await resets.execute(plan, force=True)
            self.log(f"reset to seq {seq}: replays {plan.replay}")
        except Exception as e:  # noqa: BLE001 - a membership change or a restart in between: logged
            self.log(f"reset to seq {seq} refused: {str(e)[:120]}")

    # --- the run ---------------------------------------------------------------------------

    async def publish_chunk(self, n: int) -> None:
        """As ``ChaosRun``'s, the expected keys under the origin's current life."""
        before = time.time()
        static = self.config.static
        got = await publish_orders(self.nc, self.stream, self.group, n, self.config.keys, subjects_prefix="ord",
                                   wait_sourced=not static)
        self.expected |= {(self.key, q): (f"ord.{k}" if static else k) for (_, q), k in got.items()}
        self.windows.append((before - 0.001, time.time() + 0.001))
        self.log(f"published {n} (total {len(self.expected)})")

    def owed(self) -> bool:
        cfg = self.config
        return super().owed() or (cfg.recreate and not self.recreated and self._elapsed() >= 0.5) or (
            cfg.backfills and not self.backfills_started and self._elapsed() >= 0.3) or (
            cfg.resets and not self.resets_tried and self._elapsed() >= 0.45)

    async def fault(self) -> None:
        cfg = self.config
        kind = self.rng.choices(["backfill", "reset", "base"],
                                weights=[18 if cfg.backfills else 0, 8 if cfg.resets else 0, 74])[0]
        # every run, however short, has a backfill and a reset replay: owed ones come when due
        if cfg.backfills and not self.backfills_started and self._elapsed() >= 0.3:
            kind = "backfill"
        elif cfg.resets and not self.resets_tried and self._elapsed() >= 0.45:
            kind = "reset"
        if kind == "backfill":
            self.start_backfill()
        elif kind == "reset":
            await self.reset_back()
        else:
            await super().fault()
        if cfg.recreate and not self.recreated and self._elapsed() >= 0.5:
            await self.recreate_origin()

    async def backlog(self) -> int:
        """Also what the work queue has not sourced yet (a reset re-sources it from the origin)."""
        left = await super().backlog()
        if self.config.static:
            return left
        api = JsApi(self.nc)
        origin_last = int((await api.stream_info(self.stream))["state"]["last_seq"])
        sourced = await sourcing.last_sourced(api, f"{self.stream}-{self.group}")
        return left + max(0, origin_last - (sourced if sourced is not None else origin_last))

    async def recreate_origin(self) -> None:
        """Drain the old life, delete the origin and its group, create both again under the
        same names and publish; jobs without ``--stream-life`` refuse, then it is given."""
        self.recreated = True
        self.log("re-creating the origin: killing the jobs, draining the old life first")
        await self.resume_due(everything=True)
        for job in self.running():
            job.kill()  # mid-batch, maybe: the drain's jobs recover what they left
        await asyncio.to_thread(self._wait_jobs, 30.0)
        await self.drain()
        await self.groups.delete(self.stream, self.group, force=True)
        await JsApi(self.nc).delete_stream(self.stream)
        await self.setup()
        created = await origin_created(JsApi(self.nc), self.stream)
        self.log(f"origin re-created (created {created})")
        self.key = f"{self.stream}#2"
        self.current = list(self.config.members)
        await self.publish_chunk(max(1, self.config.messages // self.config.chunks))
        refusing = [self.start_job(m) for m in self.current]
        for job in refusing:
            await asyncio.to_thread(job.proc.wait, 240)
            assert job.proc.returncode == 1 and LIFE_REFUSAL in last_error(job), last_error(job)
            self.refused += 1
        self.stream_life = f"new:{created}"
        self.windows = []  # the old life's windows: its messages are gone with its stream
        self.log(f"{self.refused} jobs refused the new life; --stream-life {self.stream_life} from now on")

    # --- the verdict -----------------------------------------------------------------------

    async def check(self, pg_params=None) -> dict:
        expected = self.expected
        try:
            if self.config.transform == "drop":
                kept = {k: v for k, v in expected.items() if k[1] % 10 != 7}
                assert_exactly_once(self.landed(pg_params), kept)
            else:
                self._check_aggregates(self._aggregates(pg_params), expected)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.report()}") from None
        assert await self.backlog() == 0, self.report()
        tracebacks = [j for _, j in self.jobs if "Traceback" in j.output_so_far()]
        assert not tracebacks, tracebacks[0].result().describe() + "\n" + self.report()
        refused = [j for _, j in self.jobs if j.proc.returncode == 1 and "is not a member of group" not in
                   last_error(j) and not (self.config.recreate and LIFE_REFUSAL in last_error(j))]
        assert not refused, f"a job refused its input: {last_error(refused[0])}\n{self.report()}"
        left = self.prepared_left(pg_params)
        assert not left, f"prepared writes left behind: {left}\n{self.report()}"
        kinds = Counter(m if m == "backfill" else "member" for m, _ in self.jobs)
        recomputed = sum(int(x) for _, j in self.jobs for x in _summary_counts(j.output_so_far(), "recomputed"))
        return {"jobs": dict(kinds), "landed": len(expected), "recomputed": recomputed, "refused": self.refused}

    def _aggregates(self, pg_params):
        """``(origin_stream, key, n, s, s2)`` rows of the table, read with its format's reader."""
        cols = ["origin_stream", "key", "n", "s", "s2"]
        sink = self.config.sink
        if sink == "postgres":
            import psycopg2

            with psycopg2.connect(**pg_params) as conn, conn.cursor() as cur:
                cur.execute(f"SELECT {', '.join(cols)} FROM orders")
                rows = cur.fetchall()
            conn.close()
            return rows
        if sink == "parquet":
            from airflow_provider_cg.core.landing.sinks.lake.reader import read_committed

            t = read_committed(self.lake, columns=cols)
        elif sink == "delta":
            from tests.support.member_job import read_delta

            t = read_delta(self.table, cols, self.storage_options())
        else:
            from pyiceberg.catalog.sql import SqlCatalog

            from airflow_provider_cg.core.landing.sinks.iceberg.writer import iceberg_io_properties
            from airflow_provider_cg.core.landing.sinks.lake.storage import ObjectStoreSettings

            props = iceberg_io_properties(ObjectStoreSettings.from_env(self.sink_env))
            t = SqlCatalog("default", uri=self.catalog_uri, **props).load_table("lake.orders").scan(
                selected_fields=tuple(cols)).to_arrow()
        return list(zip(*(t.column(c).to_pylist() for c in cols), strict=True))

    @staticmethod
    def _check_aggregates(rows, expected: dict[tuple[str, int], str]) -> None:
        want: dict[tuple[str, str], list[int]] = {}
        for (stream, seq), key in expected.items():
            w = want.setdefault((stream, key), [0, 0, 0])
            w[0] += 1
            w[1] += seq
            w[2] += seq * seq
        got: dict[tuple[str, str], list[int]] = {}
        for stream, key, n, s, s2 in rows:
            g = got.setdefault((stream, key), [0, 0, 0])
            g[0] += int(n)
            g[1] += int(s)
            g[2] += int(s2)
        wrong = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        assert not wrong, (f"{len(wrong)} (life, key) aggregates differ from each message counted once, "
                           f"e.g. {[(k, want.get(k), got.get(k)) for k in wrong[:3]]}")


def _summary_counts(output: str, field: str) -> list[str]:
    import re

    return re.findall(rf'"{field}":(\d+)', output)


#: the routed run's transformation: odd messages to ``all`` (appended), even ones to ``latest``
#: (upserted by customer), one in ten dropped; the payload's customer is the subject's key, or
#: absent (keyless)
ROUTED_SQL = ("SELECT origin_stream, origin_seq, key, `partition`, value.customer AS customer, value.n AS n, "
              "CASE WHEN origin_seq % 2 = 0 THEN 'latest' ELSE 'all' END AS route FROM batch "
              "WHERE origin_seq % 10 <> 7")
KEYLESS_SHARE = 0.03


class RoutedMixedRun(MixedWritersRun):
    """Every writer at once into two tables chosen per row by a column (``routes``,
    ``route_by``): ``all`` appends the odd messages (in the table kind the seed picked) but for the
    one in ten the transformation drops, ``latest`` upserts the even ones by customer (Delta, or
    Iceberg when the seed picked Delta). About 3% of the payloads lack the customer: an even one
    has no merge key and is dead-lettered, an odd one lands in ``all`` like any other. ``check``
    asserts ``all`` holds every odd message it keeps once in per-key order and nothing else, ``latest`` is the last state per customer of the even ones
    with a customer, and the dead-letter stream holds each keyless even message once."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.keyless: set[tuple[str, int]] = set()
        remote = self.object_store is not None
        self.latest_kind = "iceberg" if self.config.sink == "delta" else "delta"
        self.latest = f"s3://{self.bucket}/latest" if remote else str(self.workdir / "latest")

    def routes(self) -> dict:
        sink_path, sink_args = self.sink_args()
        every = {"sink": self.config.sink}
        if sink_path is not None:
            every["sink_path"] = str(sink_path)
        flags = dict(zip(sink_args[::2], sink_args[1::2], strict=True))
        for flag, value in flags.items():
            every[flag[2:].replace("-", "_")] = value
        latest = {"sink": self.latest_kind, "merge_keys": "customer"}
        if self.latest_kind == "delta":
            latest["sink_path"] = self.latest
        else:
            latest.update(iceberg_table="lake.latest", iceberg_catalog_uri=self.catalog_uri,
                          iceberg_warehouse=self.warehouse)
        return {"all": every, "latest": latest}

    def _args(self) -> tuple[list[str], object]:
        from tests.support.chaos import JOB_ARGS

        life = ["--stream-life", self.stream_life] if self.stream_life else []
        return [*JOB_ARGS, "--routes", json.dumps(self.routes()), "--route-by", "route", "--payload-format", "json",
                "--json-schema", "customer STRING, n BIGINT", "--transform-sql", ROUTED_SQL, *life], None

    async def publish_chunk(self, n: int) -> None:
        before = time.time()
        missing = {i for i in range(n) if self.rng.random() < KEYLESS_SHARE}

        def payload(i: int) -> bytes:
            if i in missing:
                return b'{"n":%d}' % i
            return b'{"customer":"k%d","n":%d}' % (i % self.config.keys, i)

        got = await publish_orders(self.nc, self.stream, self.group, n, self.config.keys, subjects_prefix="ord",
                                   payload=payload)
        seqs = sorted(got)
        self.keyless |= {(self.key, seqs[i][1]) for i in missing}
        self.expected |= {(self.key, q): k for (_, q), k in got.items()}
        self.windows.append((before - 0.001, time.time() + 0.001))
        self.log(f"published {n} ({len(missing)} without a customer; total {len(self.expected)})")

    def open_sink(self):
        """The jobs' routed sink, opened here with the jobs' credentials (``sink_env``)."""
        from unittest import mock

        from airflow_provider_cg.core.landing.sinks.options import SinkOptions

        with mock.patch.dict(os.environ, self.sink_env):
            from airflow_provider_cg.core.landing.sinks.opening import open_sink

            return open_sink(SinkOptions.build({"routes": self.routes(), "route_by": "route"}), transformed=True)

    def prepared_left(self, pg_params=None) -> list[str]:
        sink, parts = self.open_sink(), range(self.config.partitions)
        return sorted({w.gid for m in self.ever for w in sink.recover(self.stream, self.group, m, parts)})

    def latest_state(self) -> dict[str, int]:
        """``latest``: customer -> origin_seq, as delta-rs or pyiceberg read it (one row a customer)."""
        if self.latest_kind == "delta":
            from tests.support.member_job import read_delta

            t = read_delta(self.latest, ["customer", "origin_seq"], self.storage_options())
        else:
            from pyiceberg.catalog.sql import SqlCatalog

            from airflow_provider_cg.core.landing.sinks.iceberg.writer import iceberg_io_properties
            from airflow_provider_cg.core.landing.sinks.lake.storage import ObjectStoreSettings

            props = iceberg_io_properties(ObjectStoreSettings.from_env(self.sink_env))
            t = SqlCatalog("default", uri=self.catalog_uri, **props).load_table("lake.latest").scan(
                selected_fields=("customer", "origin_seq")).to_arrow()
        customers = t.column("customer").to_pylist()
        assert None not in customers, "a row without its merge key"
        assert len(customers) == len(set(customers)), "a customer has two rows"
        return dict(zip(customers, t.column("origin_seq").to_pylist(), strict=True))

    async def dead_lettered(self) -> list[tuple[str, int]]:
        from airflow_provider_cg.core.jetstream.api import JsApi

        api, out = JsApi(self.nc), []
        try:
            last = int((await api.stream_info(f"{self.stream}-{self.group}-dlq"))["state"]["last_seq"])
        except Exception:  # noqa: BLE001 - no dead letter yet: no stream
            return out
        js = self.nc.jetstream()
        for seq in range(1, last + 1):
            msg = await js.get_msg(f"{self.stream}-{self.group}-dlq", seq)
            assert "column 'customer': a merge key" in msg.headers["Cg-Error"], msg.headers
            out.append((self.key, int(msg.headers["Cg-Origin-Seq"])))
        return out

    async def check(self, pg_params=None) -> dict:
        odd = {k: v for k, v in self.expected.items() if k[1] % 2 and k[1] % 10 != 7}
        last: dict[str, int] = {}
        for (stream, seq), key in sorted(self.expected.items(), key=lambda kv: kv[0][1]):
            if seq % 2 == 0 and (stream, seq) not in self.keyless:
                last[key] = seq
        try:
            assert_exactly_once(self.landed(pg_params), odd)
            got = self.latest_state()
            wrong = sorted(k for k in set(last) | set(got) if last.get(k) != got.get(k))
            assert not wrong, f"{len(wrong)} customers differ from their last state, e.g. " \
                              f"{[(k, last.get(k), got.get(k)) for k in wrong[:5]]} (customer, want, table)"
            dead = await self.dead_lettered()
            want_dead = {k for k in self.keyless if k[1] % 2 == 0}
            assert len(dead) == len(set(dead)) and set(dead) == want_dead, \
                f"dead letters {sorted(dead)[:10]} (of {len(dead)}), expected {sorted(want_dead)[:10]}"
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.report()}") from None
        assert await self.backlog() == 0, self.report()
        tracebacks = [j for _, j in self.jobs if "Traceback" in j.output_so_far()]
        assert not tracebacks, tracebacks[0].result().describe() + "\n" + self.report()
        refused = [j for _, j in self.jobs if j.proc.returncode == 1 and "is not a member of group" not in
                   last_error(j)]
        assert not refused, f"a job refused its input: {last_error(refused[0])}\n{self.report()}"
        left = self.prepared_left(pg_params)
        assert not left, f"prepared writes left behind: {left}\n{self.report()}"
        kinds = Counter(m if m == "backfill" else "member" for m, _ in self.jobs)
        return {"jobs": dict(kinds), "landed": len(self.expected), "keyless": len(self.keyless),
                "dead_lettered": len(want_dead)}
