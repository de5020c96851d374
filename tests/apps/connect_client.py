"""A user's Spark Connect client for the tests: two available-now queries over group members on
a remote Spark Connect server (``--remote``), one into Spark's Parquet file sink, one through
``SinkBatches`` into the provider's Parquet table; writes the file sink's rows, read back
through the session, as JSON (``--out``). Its own process, as a user's client is: a remote
session changes PySpark's process-wide session builder."""

from __future__ import annotations

import argparse
import json
import sys

from pyspark.sql import SparkSession

from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings
from airflow_provider_cg.core.streaming import SinkBatches, register


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    for name in ("--remote", "--servers", "--stream", "--files", "--lake", "--checkpoints", "--out"):
        ap.add_argument(name, required=True)
    a = ap.parse_args(argv)
    settings = NatsConnectionSettings(servers=[a.servers])
    spark = SparkSession.builder.remote(a.remote).getOrCreate()
    try:
        register(spark, settings)

        def member(group: str):
            return spark.readStream.format("cg_member").option("stream", a.stream).option("group", group) \
                .option("member", "m1").option("maxMessagesPerTrigger", "400").load()

        files = member("files").select("origin_stream", "origin_seq", "partition", "key").writeStream \
            .format("parquet").option("checkpointLocation", f"{a.checkpoints}/files").trigger(availableNow=True) \
            .start(a.files)
        lake = member("lake").writeStream.foreachBatch(SinkBatches(
            stream=a.stream, group="lake", member="m1", settings=settings, sink="parquet", sink_path=a.lake)) \
            .option("checkpointLocation", f"{a.checkpoints}/lake").trigger(availableNow=True).start()
        for q in (files, lake):
            q.awaitTermination()
            if q.exception() is not None:
                print(f"query failed: {q.exception()}", file=sys.stderr)
                return 1
        rows = spark.read.parquet(a.files).orderBy("origin_seq").collect()
        with open(a.out, "w") as f:
            json.dump([[r.origin_stream, r.origin_seq, r.key, r.partition] for r in rows], f)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
