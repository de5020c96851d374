"""Which prepared writes a new pin holder must finish (``recovered_by``), and fences as stored."""

from airflow_provider_cg.core.landing.rows import BatchId
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import Fence, recovered_by


def _batch(member: str) -> BatchId:
    return BatchId("S", "g", member, 1)


def test_own_writes_and_shared_partitions_are_recovered():
    mine = frozenset({0, 1})
    assert recovered_by(_batch("m1"), None, "S", "g", "m1", mine)
    assert recovered_by(_batch("m2"), Fence("m2/x", (1, 2), 4), "S", "g", "m1", mine, 4)
    assert not recovered_by(_batch("m2"), Fence("m2/x", (2, 3), 4), "S", "g", "m1", mine, 4)
    assert not recovered_by(_batch("m2"), None, "S", "g", "m1", mine, 4)
    assert not recovered_by(BatchId("S", "other", "m2", 1), Fence("m2/x", (0,), 4), "S", "g", "m1", mine, 4)


def test_writes_fenced_under_another_partition_count_are_recovered_by_anyone():
    mine = frozenset({0})
    # before a resize from 4 to 6 partitions: any of its keys may be the caller's now
    assert recovered_by(_batch("m2"), Fence("m2/x", (3,), 4), "S", "g", "m1", mine, 6)
    # fences written before counts were recorded, or callers that do not say: by partition only
    assert not recovered_by(_batch("m2"), Fence("m2/x", (3,)), "S", "g", "m1", mine, 6)
    assert not recovered_by(_batch("m2"), Fence("m2/x", (3,), 4), "S", "g", "m1", mine)


def test_fence_round_trips_and_reads_the_old_shape():
    f = Fence("m1/abc", (2, 0, 2), 6)
    assert f.partitions == (0, 2) and Fence.from_dict(f.to_dict()) == f
    assert f.to_dict() == {"owner": "m1/abc", "partitions": [0, 2], "partition_count": 6}
    assert Fence.from_dict({"owner": "m1/abc", "partitions": [1]}) == Fence("m1/abc", (1,))
    assert Fence("m1/abc", (1,)).to_dict() == {"owner": "m1/abc", "partitions": [1]}
