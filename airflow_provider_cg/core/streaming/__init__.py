"""A group's member as a Spark Structured Streaming source (``source.py``: ``cg_member``), and
the ``foreachBatch`` writer that lands its micro-batches into the provider's tables through the
two-phase protocol (``batches.py``)."""

from __future__ import annotations

import os

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.streaming.batches import SinkBatches
from airflow_provider_cg.core.streaming.source import SOURCE_NAME, register

__all__ = ["SOURCE_NAME", "SinkBatches", "member_options", "register"]

#: where ``ConsumerGroupStreamingAppOperator`` names the application's member
MEMBER_ENV = {"stream": "CG_STREAM", "group": "CG_GROUP", "member": "CG_MEMBER"}


def member_options() -> dict[str, str]:
    """The source's ``stream``, ``group`` and ``member`` options as the provider's operator
    gives them to the application it submits (``CG_STREAM``, ``CG_GROUP``, ``CG_MEMBER``):
    ``spark.readStream.format("cg_member").options(**member_options())``."""
    out = {}
    for option, env in MEMBER_ENV.items():
        value = os.environ.get(env)
        if not value:
            raise ConfigError(env, f"not set: the {option} to read (the provider's streaming operator sets it)")
        out[option] = value
    return out
