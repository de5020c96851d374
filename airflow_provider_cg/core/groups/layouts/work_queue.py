"""The ``work-queue`` layout (orbit ``pcgroups``'): one work-queue stream ``<stream>-<group>``
sources the origin and puts the partition token first; each member reads its partitions
``<p>.>`` from it. A filtered read walks the other partitions' messages (nats-server keeps no
per-subject index of sequences; ``msgBlock.firstMatching`` loads and matches each message), so
a group's server work grows with members x stream: measured here, a member of a 256-partition
group read its partition at 0.13x the rate of a member of a 6-partition group
(``partition_streams.py`` is the layout for those).

A static group has no work queue: its members read their subjects from the origin
(``ORIGIN``), with the work queue's filters and positions.
"""

from __future__ import annotations

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.groups.layouts.base import WORK_QUEUE, Layout, LayoutMove, Mover


class WorkQueue(Layout):
    name = WORK_QUEUE

    async def enter(self, moves: Mover, stream: str, group: str, have: Layout, wq_cfg: dict, partitions: int,
                    deadline: float, replicas: int | None) -> LayoutMove:
        """Back from partition streams: the log's source goes back to the work queue and the
        members land what the log holds first (``PartitionStreams.drain``); a call that runs
        out of time leaves the group draining and says how much is left. Then the layout is
        recorded, the pin consumers dropped and the partition streams and log removed. From
        ``filling`` (nothing of the log landed yet) the work queue sources again from where
        the log started, after what it still holds."""
        from airflow_provider_cg.core.groups.layouts import partition_streams as ps

        if not isinstance(have, ps.PartitionStreams):
            return LayoutMove(stream, group, self.name, True)
        wq = wq_cfg["name"]
        if have.name == ps.FILLING:
            await ps.hand_source_to_work_queue(moves.api, wq_cfg, undo=True)
        else:
            left = await have.drain(moves.api, wq, partitions, deadline)
            if left:
                return LayoutMove(stream, group, ps.DRAINING, False, left)
        await self.record(moves.api, wq)
        await moves.drop_member_consumers(wq, partition_filters=False)
        await ps.remove_partition_streams(moves.api, wq)
        return LayoutMove(stream, group, self.name, True)


class Origin(WorkQueue):
    """A static group's members read their subjects from the origin stream (reported as the
    ``work-queue`` layout: the same filters and positions, no work queue)."""

    chosen = False

    async def enter(self, moves: Mover, stream: str, group: str, have: Layout, wq_cfg: dict, partitions: int,
                    deadline: float, replicas: int | None) -> LayoutMove:
        raise ConfigError("layout", "only an elastic group has a layout (a static group's members read the origin)")


WORK_QUEUE_LAYOUT = WorkQueue()
ORIGIN = Origin()
