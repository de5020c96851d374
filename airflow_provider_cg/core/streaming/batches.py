"""A ``foreachBatch`` writer that lands a ``cg_member`` query's micro-batches into one of the
provider's tables (Parquet, Delta, Iceberg, PostgreSQL: ``SinkOptions``) through the member
job's two-phase protocol (``protocol/two_phase.py``)::

    query = (spark.readStream.format("cg_member").options(**member).load()
             .writeStream.foreachBatch(SinkBatches(sink="delta", sink_path="/lake/orders", **member))
             .option("checkpointLocation", "/lake/_checkpoints/orders-m1").start())

Why it is exactly once with every other writer of the table (the member job's live runs,
backfills, replays): each batch is prepared, marked and committed with its inputs
``(origin_stream, origin_seq)``, which the table drops when another write holds them already,
so a batch Spark runs again after a crash lands nothing twice, whatever it was cut into. The
first batch of a query's run fences the member's partitions in the table and finishes what an
earlier holder left prepared there (``TwoPhaseLander.take_over``); a writer that later takes
them over (a member job that got the pin) fences this one out, and its next batch fails
instead of writing. The source acknowledges a batch only after Spark committed it, which is
after this writer's commit.

The origin is checked as the member job checks it (``protocol/origin_guard.py``): the table's
lives of the stream and its marks, before the first batch and before each batch is committed.
An origin that went back below what the table landed fails the batch (``OriginWentBack``:
nothing written, so nothing acknowledged) until ``stream_life="went-back:<R>"`` says to land
what came after R beside the lost messages, under a life key of their own.

Rows are written as the source gives them (the member job's columns; what the source does
not carry, ``payload_text`` and ``delivery_count``, is null): transform them in Spark before,
keeping ``origin_stream`` and ``origin_seq``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cg.core.errors import ConfigError, ConsumerGroupError
from airflow_provider_cg.core.landing.contract import Summary
from airflow_provider_cg.core.landing.pipeline.processing import ArrowPipeline
from airflow_provider_cg.core.landing.protocol.two_phase import TwoPhaseLander
from airflow_provider_cg.core.landing.rows import ROW_SCHEMA, BatchId

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings

__all__ = ["DeltaBatches", "SinkBatches"]

log = logging.getLogger("airflow_provider_cg.streaming")


class SinkBatches:
    """``foreachBatch(SinkBatches(stream=..., group=..., member=..., sink=..., <sink options>))``:
    see the module docstring. ``settings``: the NATS connection (default: the ``CG_NATS_*``
    environment), made for each batch (the member's partitions, the origin's checks);
    ``stream_life``: as the member job's ``--stream-life``."""

    def __init__(self, *, stream: str, group: str, member: str, settings: NatsConnectionSettings | None = None,
                 stream_life: str | None = None, **sink_options: Any) -> None:
        from airflow_provider_cg.core.landing.sinks.options import SinkOptions
        from airflow_provider_cg.core.landing.stream_life import LifeChoice

        self.stream, self.group, self.member, self.settings = stream, group, member, settings
        LifeChoice.parse(stream_life)  # a bad one fails here, naming it
        self.stream_life = stream_life
        self.sink_options = SinkOptions.build(sink_options)  # a bad option fails here, naming it
        self.lander: TwoPhaseLander | None = None
        self.summary = Summary(stream, group, member)
        self.owner = f"{member}/query-{secrets.token_hex(6)}"

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        table = _as_rows(df.toArrow())
        if table.num_rows == 0 and self.lander is not None:
            return  # (the first batch takes the member over even when empty)
        if not asyncio.run(self._land(table, int(batch_id))):  # (only when another writer took over)
            raise ConsumerGroupError(
                f"member {self.member!r}: another writer took over its partitions in the table (its pin moved): "
                f"batch {batch_id} was not written, and the query stops")

    async def _land(self, table: pa.Table, batch_id: int) -> bool:
        """One micro-batch through the two-phase protocol, on a connection of its own (each
        batch runs in an event loop of its own)."""
        from airflow_provider_cg.core.jetstream.api import JsApi
        from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings

        nc = await (self.settings or NatsConnectionSettings.from_env()).connect()
        try:
            api = JsApi(nc)
            lander = self.lander or await self._take_over(api)
            guard = lander.origin
            if guard is None:
                raise ConsumerGroupError("SinkBatches: the origin was not checked")
            guard.api = api  # (the connection of this batch's event loop)
            if table.num_rows == 0:
                return True
            table = guard.keys.apply(table)  # under the key of the origin's life they belong to
            batch = BatchId(self.stream, self.group, self.member, batch_id)
            pipeline = ArrowPipeline()
            processed = await asyncio.to_thread(pipeline.process, lander.sink, table, batch)

            async def no_ack() -> int:  # the source acknowledges once Spark committed the batch
                return 0

            def recompute() -> tuple[BatchId, Any]:
                again = BatchId(self.stream, self.group, self.member, batch_id)
                return again, pipeline.process(lander.sink, table, again)

            done = await lander.land(batch, processed, table, {}, no_ack, table.num_rows,
                                     int(pc.sum(pc.binary_length(table.column("payload"))).as_py() or 0),
                                     recompute=recompute)
            await lander.finish()
            return done
        finally:
            await nc.close()

    async def _take_over(self, api: Any) -> TwoPhaseLander:
        """The sink and the lander, at a run's first batch: the member's partitions fenced in the
        table, what an earlier holder left prepared there finished, and the origin checked
        against the table (``OriginGuard.open``)."""
        from airflow_provider_cg.core.groups import partitioning
        from airflow_provider_cg.core.groups.admin import ConsumerGroups
        from airflow_provider_cg.core.groups.config import ElasticGroupConfig, in_membership
        from airflow_provider_cg.core.landing.protocol.origin_guard import OriginGuard
        from airflow_provider_cg.core.landing.sinks.opening import open_sink

        config = (await ConsumerGroups(api.nc, js_prefix=api.prefix).get(self.stream, self.group)).config
        if not in_membership(config, self.member):
            raise ConfigError("member", f"{self.member!r} is not a member of group {self.group!r}")
        sink = await asyncio.to_thread(open_sink, self.sink_options)
        lander = TwoPhaseLander(sink, self.summary, self.stream, self.group, self.member)
        lander.partition_count = config.max_members
        await lander.take_over(self.owner, tuple(partitioning.member_partitions(config, self.member)))
        lander.origin = await OriginGuard.open(api, sink, self.stream, self.stream_life,
                                               reads_origin=not isinstance(config, ElasticGroupConfig),
                                               group=self.group)
        self.summary.origin_key = lander.origin.keys.current
        self.lander = lander
        return lander


class DeltaBatches:
    """``foreachBatch(DeltaBatches(path, app_id))``: each micro-batch appended to the Delta table
    at ``path`` by Spark's own Delta writer, idempotently: the write carries ``txnAppId``
    (``app_id``: one per query, kept with its checkpoint) and ``txnVersion`` (Spark's batch id), so
    a batch Spark runs again after a crash is skipped by the table if it was committed. For a
    query whose batches need more than one append (several tables, a merge), write each the same
    way in your own function. ``options``: more options of the write (``partitionBy`` is a list)."""

    def __init__(self, path: str, app_id: str, *, partition_by: list[str] | None = None, **options: str) -> None:
        if not app_id or not isinstance(app_id, str):
            raise ConfigError("app_id", "required: one per query, kept with its checkpoint")
        self.path, self.app_id, self.partition_by, self.options = path, app_id, partition_by, options

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        w = df.write.format("delta").mode("append").option("txnAppId", self.app_id) \
            .option("txnVersion", int(batch_id)).options(**self.options)
        if self.partition_by:
            w = w.partitionBy(*self.partition_by)
        w.save(self.path)


def _as_rows(table: pa.Table) -> pa.Table:
    """A micro-batch in the member job's row layout (``ROW_SCHEMA``), other columns after it."""
    if "origin_stream" not in table.column_names or "origin_seq" not in table.column_names:
        raise ConfigError("foreachBatch", "the rows must keep origin_stream and origin_seq (each message's id)")
    cols, fields = [], []
    for f in ROW_SCHEMA:
        cols.append(table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type))
        fields.append(f)
    for name in table.column_names:
        if name not in ROW_SCHEMA.names:
            cols.append(table.column(name))
            fields.append(table.schema.field(name))
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))
