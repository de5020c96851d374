"""Moving an elastic group between layouts (``layouts/``) with nothing lost or landed twice.

To ``partition-streams``: record ``filling`` on the work queue, stop its sourcing at a cut
(``sourcing.py``) and make the partition log source the origin from after the cut, with the
partition streams mirroring the log; members go on landing what the work queue holds, as in
``work-queue``, while new messages gather in the log. Once the work queue holds nothing of any
partition, record the layout and delete the member consumers that hold partition filters (a job
of the old layout loses its pin; its next run makes its consumer on its pin subject and reads
the partition streams). Everything older than the cut lands before anything newer.

Back to ``work-queue``: record ``draining``, stop the log's sourcing at a cut and resume the
work queue's from after it; members land what the log holds (through the partition streams)
while new messages wait in the work queue, whose buffered limits pause the sourcing when it
fills; once the log is empty, drop the pin consumers, the partition streams and the log and
record ``work-queue``. A move taken back half way (``filling`` back to ``work-queue``,
``draining`` back to ``partition-streams``) sources again what the other side has not landed.

A call that runs out of ``wait`` leaves the group filling or draining and says how much is
left; calling again goes on. A batch a job committed but had not yet acknowledged when its
stream changed is landed again by nobody: every sink refuses an input another writer committed
(the rows' origin keys are the same in both layouts).
"""

from __future__ import annotations

import time

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.groups import layouts, sourcing
from airflow_provider_cg.core.groups import names as groupnames
from airflow_provider_cg.core.groups.consumers import filters_of, is_member_consumer
from airflow_provider_cg.core.groups.layouts import partition_streams as ps
from airflow_provider_cg.core.groups.layouts.base import LayoutMove
from airflow_provider_cg.core.groups.store import ELASTIC, GroupStore
from airflow_provider_cg.core.jetstream.api import server_version


class LayoutMoves:
    """``move_layout`` (see the module doc)."""

    def __init__(self, store: GroupStore) -> None:
        self.store, self.nc, self.api = store, store.nc, store.api

    async def move_layout(self, stream: str, group: str, layout: str, *, wait: float = 60.0,
                          partition_replicas: int | None = None) -> LayoutMove:
        """``partition_replicas``: the partition streams' replicas (default and, on the servers
        checked, only 1: ``layout.check_replicas`` says why)."""
        target = layouts.named(layouts.check("layout", layout))
        ps.check_replicas("partition_replicas", partition_replicas, server_version(self.nc))
        if partition_replicas is not None and not target.reads_partition_streams:
            raise ConfigError("partition_replicas", "is for the partition-streams layout")
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait < 1e6:
            raise ConfigError("wait", f"must be a number of seconds from 0 to 1e6 (got {wait!r})")
        info = await self.store.get(stream, group)
        if info.kind != ELASTIC:
            return await layouts.ORIGIN.enter(self, stream, group, layouts.ORIGIN, {}, 0, 0.0, None)
        wq = groupnames.work_queue_stream(stream, group)
        cfg = await layouts.wq_config(self.api, wq)
        stopped = sourcing.stopped_state(cfg)
        if stopped is not None and "layout" not in stopped.intent:  # a move's own stop: the move goes on
            raise layouts.LayoutError(f"a reset or resize of {group!r} is under way (sourcing of {wq!r} is "
                                      "stopped): run it again to finish it first")
        return await target.enter(self, stream, group, layouts.of(cfg), cfg, info.config.max_members,
                                  time.monotonic() + wait, partition_replicas)

    async def drop_member_consumers(self, wq: str, *, partition_filters: bool) -> list[str]:
        """Delete the member consumers on ``wq`` that read partitions (``<p>.>`` filters) or,
        with ``partition_filters`` False, those on pin subjects: their instances lose the pin."""
        pins = layouts.pin_subjects(wq)[:-1]
        dropped = []
        for c in await self.api.list_consumers(wq):
            ccfg = c.get("config") or {}
            if not is_member_consumer(ccfg):
                continue
            on_pin = any(f.startswith(pins) for f in filters_of(ccfg))
            if on_pin != partition_filters:
                await self.api.delete_consumer(wq, c["name"])
                dropped.append(c["name"])
        return dropped
