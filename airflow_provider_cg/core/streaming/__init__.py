"""A group's member as a Spark Structured Streaming source (``source.py``: ``cg_member``), and
the ``foreachBatch`` writer that lands its micro-batches into the provider's tables through the
two-phase protocol (``batches.py``)."""

from __future__ import annotations

import os
import re

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.streaming.batches import DeltaBatches, SinkBatches
from airflow_provider_cg.core.streaming.source import SOURCE_NAME, register

__all__ = ["SOURCE_NAME", "DeltaBatches", "SinkBatches", "check_options", "failure_of", "member_options", "register"]

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


def check_options(options: dict[str, str]) -> None:
    """Check a ``cg_member`` query's options in the driver, before the query starts (Spark
    would report a bad one from its planning process, in a traceback): ``ConfigError`` naming
    the option and its rule."""
    from airflow_provider_cg.core.streaming.source_options import SourceOptions

    SourceOptions.parse(options)


#: a provider error as a Python traceback's last line shows it, inside Spark's exception text
_FAILURE = re.compile(r"^(?:[\w.]+\.)?(ConfigError|StreamWentBack|OriginWentBack|PinNotHeld|ConsumerGroupError|GroupNotFound|NatsConnectError|"
                      r"ServerUnavailable|JetStreamApiError|DirectReadError|RuntimeError): (.+)$", re.M)


def failure_of(error: BaseException) -> tuple[str, bool]:
    """What a failed query's exception says, as one line: the provider's own error (a lost pin,
    a bad option, a server away) when Spark's text holds one, else Spark's first line; and
    whether it is the user's to fix (bad input: exit 1) rather than worth a retry (exit 2)."""
    text = str(error)
    found = _FAILURE.findall(text)
    if found:
        kind, message = found[-1]
        return f"{message.strip()[:1000]}", kind in ("ConfigError", "StreamWentBack", "OriginWentBack")
    return (text.strip().splitlines() or [type(error).__name__])[0][:500], False

