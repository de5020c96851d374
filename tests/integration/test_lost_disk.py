"""A server's disk lost for good under a running group (``tests/support/lost_disk.py``): three
nats-servers, the server holding the most partition streams SIGKILLed after a lull in traffic,
its store deleted and a replacement started empty, members' jobs SIGKILLed meanwhile. Every
message lands once and in per-key order, and the group is healthy again: in the
partition-streams layout (whose partition log is the copy of record: the lost partition streams
are rebuilt from it), through a move to the work-queue layout and back after the loss and then
two servers of three SIGKILLed at once (no quorum: the group stalls, named by the tools, and
goes on when they are back); and in the work-queue layout (everything R3) as the control. ``benchmarks/lost_disk.py`` runs it over
several seeds, with and without the lull."""

from __future__ import annotations

import os

from tests.support.lost_disk import LostDiskRun

SEED = int(os.environ.get("CG_LOST_DISK_SEED", "52"))


async def test_partition_streams_through_a_lost_disk_a_move_and_two_servers_down(nats_cluster, member_job_zip,
                                                                                  tmp_path):
    run = LostDiskRun("partition-streams", SEED, lull=True, move=True, two_down=True, messages=6000, seconds=15.0)
    try:
        await run.run(nats_cluster, member_job_zip, tmp_path)
    finally:
        print("\n".join(run.events))
    assert run.wq_streams_lost, run.events  # the lost server held partition streams
    assert run.lost == 0 and run.healthy_after_s is not None and run.healthy_after_s < 60, run.events


async def test_the_work_queue_layout_through_a_lost_disk(nats_cluster, member_job_zip, tmp_path):
    run = LostDiskRun("work-queue", SEED, lull=True, messages=3000, seconds=8.0)
    try:
        await run.run(nats_cluster, member_job_zip, tmp_path)
    finally:
        print("\n".join(run.events))
    assert run.lost == 0 and run.healthy_after_s is not None and run.healthy_after_s < 60, run.events
