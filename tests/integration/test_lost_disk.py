"""A server's disk lost for good under a running group (``tests/support/lost_disk.py``): three
nats-servers, the server holding the most partition streams SIGKILLed after a lull in traffic,
its store deleted and a replacement started empty, members' jobs SIGKILLed meanwhile. Every
message lands once and in per-key order, and the group is healthy again, in the
partition-streams layout (whose partition log is the copy of record: the lost partition streams
are rebuilt from it), through a move to the work-queue layout and back after the loss, and in
the work-queue layout (everything R3) as the control. ``benchmarks/lost_disk.py`` runs it over
several seeds, with and without the lull."""

from __future__ import annotations

import os

import pytest

from tests.support.lost_disk import LostDiskRun

SEED = int(os.environ.get("CG_LOST_DISK_SEED", "52"))


@pytest.mark.parametrize("layout,move", [("partition-streams", True), ("work-queue", False)],
                         ids=["partition-streams-moved-back-and-forth", "work-queue"])
async def test_a_disk_lost_for_good_loses_nothing_and_breaks_no_order(layout, move, nats_cluster, member_job_zip,
                                                                      tmp_path):
    run = LostDiskRun(layout, SEED, lull=True, move=move)
    try:
        await run.run(nats_cluster, member_job_zip, tmp_path)
    finally:
        print("\n".join(run.events))
    if layout == "partition-streams":  # the lost server held partition streams with messages not landed
        assert run.wq_streams_lost, run.events
    assert run.lost == 0 and run.healthy_after_s is not None and run.healthy_after_s < 60, run.events
