"""Example transformation for the member job (shipped to Spark by the operator).

``paid_orders(batch, ctx)``: ``batch`` has one row per message (``origin_stream``,
``origin_seq``, ``partition``, ``key``, ``timestamp``, ... and the JSON payload parsed into
``value``); the result is what lands. Here: parse the orders, drop cancelled ones, and add
the amount in cents. Any Spark code works (filters, explodes, joins, aggregations): each
message's effect lands exactly once.
"""

from __future__ import annotations


def paid_orders(batch, ctx):
    from pyspark.sql import functions as F

    orders = batch.select("origin_stream", "origin_seq", "partition", "key", "timestamp", "value.*")
    return (orders.where(F.col("status") != "cancelled")
                  .withColumn("amount_cents", F.round(F.col("amount") * 100).cast("long"))
                  .drop("status"))
