"""The user's transformation of a batch, inside the exactly-once boundary of the member job.

A transformation is a Python function named ``package.module:function`` and called with the
batch as a Spark DataFrame and a :class:`BatchContext`, returning a DataFrame; or a Spark SQL
statement over the temporary view ``batch``. ``core/landing/pipeline/processing.py`` runs it in Spark, after
decoding, before the sink's prepare: any transformation (a filter, an explode, a join with
reference data, a per-batch aggregation) lands each message's effect once, because
exactly-once is kept per *input* message. A failing transformation fails the batch before
any acknowledgement. No Airflow import.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_cg.core.errors import ConfigError, ConsumerGroupError

__all__ = ["BATCH_VIEW", "BatchContext", "TransformError"]

BATCH_VIEW = "batch"
_SPEC = re.compile(r"(?P<module>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*):(?P<attr>[A-Za-z_][A-Za-z0-9_]*)")


class TransformError(ConsumerGroupError):
    """The user's transformation failed or returned something else than a DataFrame."""


@dataclass(frozen=True)
class BatchContext:
    """What a transformation knows about its batch."""

    stream: str
    group: str
    member: str
    batch_id: str
    #: partitions present in the batch
    partitions: tuple[int, ...] = ()
    #: per partition: (first origin sequence, last origin sequence) of the batch's messages
    seq_ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: routed by subject (``routes``): the route whose messages this call transforms
    route: str | None = None


def parse_spec(spec: str) -> tuple[str, str]:
    """``"package.module:function"`` -> ``(module, function)``; ``ConfigError`` otherwise."""
    m = _SPEC.fullmatch(spec.strip()) if isinstance(spec, str) else None
    if not m:
        raise ConfigError("transform", "must name a function as package.module:function")
    return m.group("module"), m.group("attr")


def load_function(spec: str) -> Callable[..., Any]:
    module, attr = parse_spec(spec)
    try:
        fn = getattr(importlib.import_module(module), attr)
    except ImportError as e:
        raise ConfigError("transform", f"cannot import {module!r} ({e}); ship it with the job (py_files)") from None
    except AttributeError:
        raise ConfigError("transform", f"{module!r} has no {attr!r}") from None
    if not callable(fn):
        raise ConfigError("transform", f"{spec!r} is not callable")
    return fn
