"""A user's streaming application for the tests (``spark-submit`` of this file): queries over
group members through the ``cg_member`` source, each with its own checkpoint.

- ``--raw GROUP:MEMBER:TABLE``: the member's rows as read into a Delta table (``DeltaBatches``:
  Spark's own Delta writer in foreachBatch, idempotent by ``txnAppId`` / ``txnVersion``);
- ``--windows GROUP:MEMBER:TABLE``: orders counted per 10-second event-time window and
  customer, watermark 5 s, appended into a Delta table by Spark's Delta streaming sink (its own
  transaction ids: query and batch) as each window closes, with the ids of
  the orders each counted (what the test checks the counts against).

``--trigger now`` runs available-now (ends when the members' backlog is landed), else a
processing-time trigger of that many seconds (runs until killed, or ``--seconds``).
"""

from __future__ import annotations

import argparse
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_provider_cg.core.streaming import DeltaBatches, register

ORDER = "id BIGINT, customer STRING, amount DOUBLE, ts DOUBLE"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stream", required=True)
    ap.add_argument("--raw", action="append", default=[])
    ap.add_argument("--windows", action="append", default=[])
    ap.add_argument("--sink-batches", action="append", default=[], help="GROUP:MEMBER:PARQUET_DIR")
    ap.add_argument("--stream-life", help="SinkBatches' stream_life")
    ap.add_argument("--checkpoints", required=True)
    ap.add_argument("--trigger", default="1")
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--option", action="append", default=[], help="key=value of the source")
    a = ap.parse_args(argv)
    spark = SparkSession.builder.getOrCreate()
    register(spark)

    def source(group: str, member: str):
        r = spark.readStream.format("cg_member").option("stream", a.stream).option("group", group) \
            .option("member", member)
        for kv in a.option:
            k, v = kv.split("=", 1)
            r = r.option(k, v)
        return r.load()

    def start(df, name: str, table: str):
        w = df.writeStream.format("delta").queryName(name) \
            .option("checkpointLocation", f"{a.checkpoints}/{name}").outputMode("append")
        w = w.trigger(availableNow=True) if a.trigger == "now" else w.trigger(processingTime=f"{a.trigger} seconds")
        return w.start(table)

    queries = []
    for spec in a.raw:
        group, member, table = spec.split(":", 2)
        rows = source(group, member).select("origin_stream", "origin_seq", "subject", "partition", "key",
                                            F.col("payload").cast("string").alias("payload_text"), "timestamp")
        # Spark's own Delta writer through foreachBatch, idempotent by txnAppId / txnVersion
        w = rows.writeStream.queryName(f"raw-{group}-{member}").foreachBatch(DeltaBatches(table, f"raw-{group}-{member}")) \
            .option("checkpointLocation", f"{a.checkpoints}/raw-{group}-{member}")
        w = w.trigger(availableNow=True) if a.trigger == "now" else w.trigger(processingTime=f"{a.trigger} seconds")
        queries.append(w.start())
    for spec in a.sink_batches:
        from airflow_provider_cg.core.streaming import SinkBatches

        group, member, lake = spec.split(":", 2)
        w = source(group, member).writeStream.queryName(f"lake-{group}-{member}") \
            .foreachBatch(SinkBatches(stream=a.stream, group=group, member=member, stream_life=a.stream_life,
                                      sink="parquet", sink_path=lake)) \
            .option("checkpointLocation", f"{a.checkpoints}/lake-{group}-{member}")
        w = w.trigger(availableNow=True) if a.trigger == "now" else w.trigger(processingTime=f"{a.trigger} seconds")
        queries.append(w.start())
    for spec in a.windows:
        group, member, table = spec.split(":", 2)
        orders = source(group, member).select(F.from_json(F.col("payload").cast("string"), ORDER).alias("o")).select("o.*") \
            .withColumn("event_time", F.col("ts").cast("timestamp")).withWatermark("event_time", "5 seconds")
        windows = orders.groupBy(F.window("event_time", "10 seconds"), "customer").agg(
            F.count(F.lit(1)).alias("orders"), F.sum("amount").alias("amount"), F.collect_list("id").alias("ids"))
        queries.append(start(windows.select(F.col("window.start").alias("window_start"), "customer", "orders",
                                            "amount", "ids"), f"windows-{group}-{member}", table))
    if a.trigger == "now" or a.seconds is None:
        for q in queries:
            q.awaitTermination()
    else:
        spark.streams.awaitAnyTermination(a.seconds)
        for q in queries:
            q.stop()
    print("CG_STREAM_DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
