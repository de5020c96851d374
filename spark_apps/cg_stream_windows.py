"""Example streaming application: revenue per customer and event-time window, from one member
of a consumer group, into a Delta table (``spark-submit`` it with Delta's package; example DAG 7
does, one task per member).

The ``cg_member`` source reads the member as its pinned client for the query's life; the orders
are counted per ``--window`` of the time the member's stream stored them (the
``timestamp`` column) and per customer, with a
``--watermark`` for late ones, and a window's row is appended once the watermark has passed it.
Spark's Delta sink and checkpoint make each window's row land once: a restarted application
(same ``--checkpoint``) goes on from its last committed batch, its aggregation state restored,
and the source acknowledges a batch's messages only after Spark committed it.

``--trigger available-now`` (the default) lands what the member holds and ends; a number of
seconds runs a processing-time trigger until ``--seconds`` have passed (or for ever).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="cg_stream_windows")
    ap.add_argument("--table", required=True, help="the Delta table's path")
    ap.add_argument("--checkpoint", required=True, help="the query's checkpoint directory (one per member)")
    ap.add_argument("--window", default="1 minute")
    ap.add_argument("--watermark", default="10 seconds")
    ap.add_argument("--trigger", default="available-now")
    ap.add_argument("--seconds", type=float, help="with a processing-time trigger: stop after this long")
    ap.add_argument("--max-messages-per-trigger", type=int)
    ap.add_argument("--schema", default="order_id BIGINT, customer STRING, amount DOUBLE")
    a = ap.parse_args(argv)
    every = None  # available-now
    if a.trigger != "available-now":
        try:
            every = f"{float(a.trigger):g} seconds"
        except ValueError:
            print(f"cg_stream_windows: --trigger: available-now or a number of seconds (got {a.trigger!r})",
                  file=sys.stderr)
            return 1

    from pyspark.errors import StreamingQueryException
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from airflow_provider_cg.core.errors import ConfigError
    from airflow_provider_cg.core.streaming import check_options, failure_of, member_options, register

    options = {}
    try:
        options = member_options()
        if a.max_messages_per_trigger is not None:
            options["maxMessagesPerTrigger"] = str(a.max_messages_per_trigger)
        check_options(options)
    except ConfigError as e:
        print(f"cg_stream_windows: {e}", file=sys.stderr)
        return 1
    member = options["member"]
    spark = SparkSession.builder.appName(f"cg-windows-{member}").getOrCreate()
    register(spark)
    orders = spark.readStream.format("cg_member").options(**options).load().select(
        F.from_json(F.col("payload").cast("string"), a.schema).alias("o"), F.col("timestamp").alias("stored"))
    windows = (orders.withWatermark("stored", a.watermark)
               .groupBy(F.window("stored", a.window), F.col("o.customer").alias("customer"))
               .agg(F.count(F.lit(1)).alias("orders"), F.sum("o.amount").alias("revenue"))
               .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
                       "customer", "orders", "revenue"))
    writer = (windows.writeStream.format("delta").outputMode("append").queryName(f"windows-{member}")
             .option("checkpointLocation", a.checkpoint))
    writer = writer.trigger(availableNow=True) if every is None else writer.trigger(processingTime=every)
    query = writer.start(a.table)
    try:
        query.awaitTermination(a.seconds)
        query.stop()
    except StreamingQueryException as e:  # one line: the source's error says what and why
        message, users = failure_of(e)
        print(f"cg_stream_windows: the query failed: {message}", file=sys.stderr)
        return 1 if users else 2
    print(f"cg_stream_windows: member {member}: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
