"""A group's member as a Spark Structured Streaming source (``source.py``), and the
``foreachBatch`` writers that keep its results exactly once (``batches.py``)."""

from airflow_provider_cg.core.streaming.source import SOURCE_NAME, register

__all__ = ["SOURCE_NAME", "register"]
