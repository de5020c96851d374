"""The streaming side of ``bench_stream_source.py``: one query over a member through the
``cg_member`` source, landing each micro-batch into the Parquet lake through ``SinkBatches`` (the
same table and commit log the member job's followers land into), a processing-time trigger of
``trigger`` seconds, at most ``max`` messages a batch; says ``cg stream ready`` once its first
batch ran (the pin held, Spark warm), stops after ``seconds``.

    spark-submit ... stream_app.py STREAM GROUP MEMBER LAKE CHECKPOINT SECONDS TRIGGER MAX
"""

from __future__ import annotations

import sys
import time

from pyspark.sql import SparkSession

from airflow_provider_cg.core.streaming import SinkBatches, register


def main(stream: str, group: str, member: str, lake: str, checkpoint: str, seconds: str, trigger: str,
         most: str) -> None:
    spark = SparkSession.builder.getOrCreate()
    register(spark)
    query = (spark.readStream.format("cg_member").option("stream", stream).option("group", group)
             .option("member", member).option("maxMessagesPerTrigger", most).load()
             .writeStream.foreachBatch(SinkBatches(stream=stream, group=group, member=member, sink="parquet",
                                                   sink_path=lake))
             .option("checkpointLocation", checkpoint).trigger(processingTime=f"{trigger} seconds").start())
    started = time.monotonic()
    while query.lastProgress is None and query.isActive:
        time.sleep(0.05)
    print("cg stream ready", flush=True)
    query.awaitTermination(max(1.0, float(seconds) - (time.monotonic() - started)))
    query.stop()


if __name__ == "__main__":
    main(*sys.argv[1:9])
