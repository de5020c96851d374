"""Where a group's partitions are stored and how its members read them: one object per
layout (``base.Layout``). ``named`` and ``of`` give the layout; nothing outside this package
compares a layout's name."""

from __future__ import annotations

from typing import Any

from airflow_provider_cg.core.groups.layouts.base import (
    DRAINING,
    FILLING,
    PARTITION_STREAMS,
    WORK_QUEUE,
    Layout,
    LayoutError,
    check_name,
    pin_subject,
    pin_subjects,
    recorded_name,
    wq_config,
)
from airflow_provider_cg.core.groups.layouts.partition_streams import (
    DRAINING_LAYOUT,
    FILLING_LAYOUT,
    PARTITION_STREAMS_LAYOUT,
)
from airflow_provider_cg.core.groups.layouts.work_queue import ORIGIN, WORK_QUEUE_LAYOUT

_LAYOUTS: dict[str, Layout] = {k.name: k for k in (WORK_QUEUE_LAYOUT, PARTITION_STREAMS_LAYOUT, FILLING_LAYOUT,
                                                       DRAINING_LAYOUT)}
#: the layouts a group can be created in or moved to (``cg layout``, the operators)
NAMES = tuple(name for name, k in _LAYOUTS.items() if k.chosen)
DEFAULT = WORK_QUEUE

__all__ = ["DEFAULT", "DRAINING", "FILLING", "NAMES", "ORIGIN", "PARTITION_STREAMS", "WORK_QUEUE", "Layout", "LayoutError",
           "check", "log_sources", "named", "of", "pin_subject", "pin_subjects", "wq_config"]


def check(field: str, value: Any) -> str:
    """A layout's name as a user gives it (``ConfigError`` naming ``field`` for another)."""
    return check_name(field, value, NAMES)


def named(name: str) -> Layout:
    """The layout called ``name`` (one of ``NAMES``, or a state of a move: ``filling``, ``draining``)."""
    return _LAYOUTS[check_name("layout", name, tuple(_LAYOUTS))]


async def delete_partition_streams(api: Any, wq: str) -> None:
    """The partition streams and partition log of the work queue ``wq`` (found by their
    metadata and name, whatever the group's layout or partition count is now): deleted with the
    group."""
    from airflow_provider_cg.core.groups.layouts.partition_streams import (
        delete_partition_log,
        partition_streams_of,
    )

    for name in await partition_streams_of(api, wq):
        await api.delete_stream(name)
    await delete_partition_log(api, wq)


async def log_sources(api: Any, wq: str) -> list[dict]:
    """The sources of ``wq``'s partition log, also while its sourcing is stopped ([] without one)."""
    from airflow_provider_cg.core.groups import sourcing
    from airflow_provider_cg.core.groups.layouts.partition_streams import log_config

    cfg = await log_config(api, wq) or {}
    stopped = sourcing.stopped_state(cfg)
    return [stopped.source] if stopped is not None else cfg.get("sources") or []


def of(wq_config: dict) -> Layout:
    """The layout recorded on a work-queue stream's config."""
    return _LAYOUTS.get(recorded_name(wq_config), WORK_QUEUE_LAYOUT)
