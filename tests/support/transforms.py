"""Transformations for the member job tests, shipped to the driver with --py-files (imported
as the top-level module ``transforms``). Input: one row per message, JSON decoded into
``value`` (order_id, customer, amount, status, items)."""

from __future__ import annotations


def keep_paid(df, ctx):
    """A filter plus a derived column: drop cancelled orders, add the gross amount."""
    from pyspark.sql import functions as F

    return (df.where(F.col("value.status") != "cancelled")
              .select("origin_stream", "origin_seq", "key", F.col("value.order_id").alias("order_id"),
                      (F.col("value.amount") * 1.2).alias("gross")))


def explode_items(df, ctx):
    """An explode: one row per ordered item (orders without items give none)."""
    from pyspark.sql import functions as F

    return df.select("origin_seq", "key", F.explode("value.items").alias("item"))


def join_regions(df, ctx):
    """A join with reference data (customer -> region), built in the job."""
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    ref = spark.createDataFrame([(f"c{i}", "north" if i % 2 else "south") for i in range(30)], "customer STRING, region STRING")
    return df.select("origin_seq", "value.customer").join(ref, "customer", "left")


def totals_per_customer(df, ctx):
    """A per-batch aggregation, tagged with the batch it came from."""
    from pyspark.sql import functions as F

    return (df.groupBy("value.customer")
              .agg(F.count("*").alias("orders"), F.sum("value.amount").alias("total"))
              .withColumn("batch_id", F.lit(ctx.batch_id))
              .withColumn("partitions", F.lit(",".join(map(str, ctx.partitions)))))


def broken(df, ctx):
    raise RuntimeError("this transformation is broken on purpose")


def paid_rows(df, ctx):
    """A filter that keeps the landed-row columns (for the exactly-once and per-key order checks)."""
    from pyspark.sql import functions as F

    return (df.where(F.col("value.status") != "cancelled")
              .select("origin_stream", "origin_seq", "key", "partition", F.col("value.amount").alias("amount")))
