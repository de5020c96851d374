"""Partition hash, distribution, transform destinations, member filters and move plans."""

from __future__ import annotations

import itertools
import random

import pytest

from airflow_provider_cg.core.groups.config import (
    ElasticGroupConfig,
    MemberMapping,
    PartitioningFilter,
    StaticGroupConfig,
)
from airflow_provider_cg.core.groups.partitioning import (
    assign_partitions,
    distribute,
    fnv1a_32,
    member_filter_subjects,
    member_partitions,
    partition_key,
    partition_of,
    plan_moves,
    strip_partition,
    transform_destination,
)

# --------------------------------------------------------------------------- hash


def test_fnv1a_32_reference_vectors():
    # published FNV-1a 32-bit test vectors
    assert fnv1a_32(b"") == 0x811C9DC5
    assert fnv1a_32(b"a") == 0xE40C292C
    assert fnv1a_32(b"foobar") == 0xBF9CF968


@pytest.mark.parametrize(
    "subject, n, expected",
    [
        ("foo", 10, 3),
        ("baz", 10, 0),
        ("qux", 10, 9),
        ("foo.bar", 10, 6),
        ("foo.baz", 10, 4),
        ("test.subject", 5, 0),
    ],
)
def test_server_test_values_whole_subject(subject, n, expected):
    assert partition_of(subject, n) == expected


def test_selected_tokens_are_concatenated_without_separator():
    # observed on nats-server 2.15: d.ab.c and d.a.bc both hash "abc"
    assert partition_key("d.ab.c", [1, 2], "d.*.*") == b"abc"
    assert partition_of("d.ab.c", 5, [1, 2], "d.*.*") == partition_of("d.a.bc", 5, [1, 2], "d.*.*") == 1
    # the index order is the concatenation order
    assert partition_key("e.ab.c", [2, 1], "e.*.*") == b"cab"
    assert partition_of("e.ab.c", 5, [2, 1], "e.*.*") == 0
    # a repeated index repeats the token (the server accepts partition(5,1,1))
    assert partition_of("f.ab", 5, [1, 1], "f.*") == 3


def test_wildcard_positions_come_from_the_filter():
    # the 2nd '*' of a.*.x.* is the 4th token; '>' tokens are never selected
    assert partition_key("a.k1.x.k2.t1.t2", [2], "a.*.x.*.>") == b"k2"
    assert partition_key("c.x.1", [1], "c.*.>") == b"x"
    assert partition_of("c.x.1", 4, [1], "c.*.>") == partition_of("c.yy.2.3", 4, [1], "c.*.>") == 3


def test_whole_subject_includes_gt_tokens_and_utf8():
    assert partition_key("a.x.y", (), "a.>") == b"a.x.y"
    assert partition_of("a.x", 4, (), "a.>") == 2
    assert partition_of("a.x.y", 4, (), "a.>") == 3
    assert partition_of("a.héllo.z", 4, (), "a.>") == 3
    assert partition_of("b.héllo", 4) == 0
    assert partition_key("b.héllo") == "b.héllo".encode()


def test_partition_of_argument_errors():
    with pytest.raises(ValueError):
        partition_of("a.b", 0)
    with pytest.raises(ValueError):
        partition_of("a.b", 4, [1])  # indexes without a filter
    with pytest.raises(ValueError):
        partition_of("a.b", 4, [2], "a.*")  # index out of range
    with pytest.raises(ValueError):
        partition_of("x.b", 4, [1], "a.*")  # subject does not match the filter
    with pytest.raises(ValueError):
        partition_of("a.b.c", 4, [1], "a.*")
    with pytest.raises(ValueError):
        partition_of("a.*", 4)  # not a literal subject
    with pytest.raises(ValueError):
        partition_of("a..b", 4)


def test_partition_spread_is_in_range_and_uses_every_partition():
    rng = random.Random(7)
    seen = {partition_of(f"k.{rng.getrandbits(64)}", 16, [1], "k.*") for _ in range(2000)}
    assert seen == set(range(16))


# --------------------------------------------------------------------------- transform destinations


def test_transform_destinations():
    assert (
        transform_destination("foo.*.*.>", [1, 2], 4)
        == "{{Partition(4,1,2)}}.foo.{{Wildcard(1)}}.{{Wildcard(2)}}.>"
    )
    assert transform_destination(">", [], 4) == "{{Partition(4)}}.>"
    assert transform_destination("foo.*", [], 10) == "{{Partition(10)}}.foo.{{Wildcard(1)}}"
    assert (
        transform_destination("a.*.b.*", [2], 3) == "{{Partition(3,2)}}.a.{{Wildcard(1)}}.b.{{Wildcard(2)}}"
    )
    assert transform_destination("foo.*", (1,), 2) == "{{Partition(2,1)}}.foo.{{Wildcard(1)}}"
    with pytest.raises(ValueError):
        transform_destination("foo.*", [2], 4)
    with pytest.raises(ValueError):
        transform_destination("foo.*", [1], 0)


# --------------------------------------------------------------------------- distribution


@pytest.mark.parametrize(
    "max_members, expected",
    [
        (6, {"m1": [0, 1], "m2": [2, 3], "m3": [4, 5]}),
        (7, {"m1": [0, 1, 6], "m2": [2, 3], "m3": [4, 5]}),
        (8, {"m1": [0, 1, 6], "m2": [2, 3, 7], "m3": [4, 5]}),
    ],
)
def test_distribution_vectors(max_members, expected):
    assert distribute(["m1", "m2", "m3"], max_members) == expected


def test_distribution_is_independent_of_order_and_duplicates():
    base = distribute(["m1", "m2", "m3"], 8)
    for perm in itertools.permutations(["m1", "m2", "m3"]):
        assert distribute(perm, 8) == base
    assert distribute(["m3", "m1", "m3", "m2", "m1"], 8) == base


def test_members_beyond_max_get_nothing():
    got = distribute(["d", "c", "b", "a", "e"], 3)
    assert got == {"a": [0], "b": [1], "c": [2], "d": [], "e": []}


def test_lone_member_gets_everything_and_no_member_nothing():
    assert distribute(["solo"], 5) == {"solo": [0, 1, 2, 3, 4]}
    assert distribute([], 5) == {}
    with pytest.raises(ValueError):
        distribute(["a"], 0)


def test_sorting_is_by_code_point_like_gos_bytes():
    # "Z" < "a" < "é" < "😀" in code points and in UTF-8 bytes alike
    got = distribute(["😀", "é", "a", "Z"], 4)
    assert got == {"Z": [0], "a": [1], "é": [2], "😀": [3]}


@pytest.mark.parametrize("max_members", [1, 2, 5, 16, 31, 64])
def test_every_partition_has_exactly_one_owner(max_members):
    for n in range(1, 12):
        got = distribute([f"m{i}" for i in range(n)], max_members)
        owned = sorted(p for ps in got.values() for p in ps)
        assert owned == list(range(max_members))
        sizes = [len(ps) for m, ps in got.items() if ps]
        assert max(sizes) - min(sizes) <= 1  # as even as possible


def test_seed_000_reference_algorithm_literally():
    """The Go loop of the pcgroups design, transcribed, against ours on many inputs."""

    def go(members, max_members, me):
        members = sorted(dict.fromkeys(members))[:max_members]
        n = len(members)
        out = []
        if n:
            num_per = max_members // n
            for i in range(max_members):
                if i < n * num_per:
                    if members[(i // num_per) % n] == me:
                        out.append(i)
                elif members[(i - n * num_per) % n] == me:
                    out.append(i)
        return out

    rng = random.Random(3)
    for _ in range(300):
        members = [f"m{rng.randrange(20)}" for _ in range(rng.randrange(1, 15))]
        max_members = rng.randrange(1, 40)
        got = distribute(members, max_members)
        for m in set(members):
            assert got[m] == go(members, max_members, m)


# --------------------------------------------------------------------------- configs to partitions and filters


def test_assign_partitions_members_and_mappings():
    cfg = ElasticGroupConfig(7, (PartitioningFilter("foo.*", (1,)),), members=("m3", "m1", "m2"))
    assert assign_partitions(cfg) == {"m1": [0, 1, 6], "m2": [2, 3], "m3": [4, 5]}
    assert member_partitions(cfg, "m1") == [0, 1, 6]
    assert member_partitions(cfg, "nobody") == []
    mapped = ElasticGroupConfig(3, member_mappings=(MemberMapping("a", (2, 0)), MemberMapping("b", (1,))))
    assert assign_partitions(mapped) == {"a": [2, 0], "b": [1]}
    assert assign_partitions(ElasticGroupConfig(3)) == {}


def test_member_filter_subjects_elastic():
    pfs = (PartitioningFilter("foo.*.*.>", (1, 2)),)
    cfg = ElasticGroupConfig(6, pfs, members=("m1", "m2", "m3"))
    # orbit's own test vectors
    assert member_filter_subjects(cfg, "m1") == ["0.foo.*.*.>", "1.foo.*.*.>"]
    assert member_filter_subjects(cfg, "m3") == ["4.foo.*.*.>", "5.foo.*.*.>"]
    two = ElasticGroupConfig(
        4, (PartitioningFilter("a.*", (1,)), PartitioningFilter("b.>")), members=("x", "y")
    )
    assert member_filter_subjects(two, "y") == ["2.a.*", "3.a.*", "2.b.>", "3.b.>"]
    whole = ElasticGroupConfig(2, (), members=("x",))
    assert member_filter_subjects(whole, "x") == ["0.>", "1.>"]
    assert member_filter_subjects(whole, "nobody") == []


def test_member_filter_subjects_static():
    st = StaticGroupConfig(
        4, ("orders.*", "pay.>"), member_mappings=(MemberMapping("a", (3, 1)), MemberMapping("b", (0, 2)))
    )
    # orbit (v0.2.1 GeneratePartitionFilters): mapped members get "<p>.>" in mapping order,
    # whatever the filters (listed once: orbit's per-filter repetition is refused by the server)
    assert member_filter_subjects(st, "a") == ["3.>", "1.>"]
    assert member_filter_subjects(st, "b") == ["0.>", "2.>"]
    listed = StaticGroupConfig(4, ("orders.*", "pay.>"), ("a", "b"))
    assert member_filter_subjects(listed, "b") == ["2.orders.*", "3.orders.*", "2.pay.>", "3.pay.>"]
    assert member_filter_subjects(StaticGroupConfig(2, (), ("m",)), "m") == ["0.>", "1.>"]


def test_member_filter_subjects_orbit_v01_shape():
    """orbit v0.1 writes "<p>.>" for every member, whatever its one filter."""
    from airflow_provider_cg.core.groups.codec import load_config

    el = load_config("elastic", b'{"max_members":4,"filter":"foo.*","partitioning_wildcards":[1],"members":["a","b"]}')
    assert el.orbit_v01 and el.partitioning_filters == (PartitioningFilter("foo.*", (1,)),)
    assert member_filter_subjects(el, "b") == ["2.>", "3.>"]
    st = load_config("static", b'{"max_members":2,"filter":"x.*","members":["m"]}')
    assert st.orbit_v01 and member_filter_subjects(st, "m") == ["0.>", "1.>"]


def test_strip_partition():
    assert strip_partition("3.orders.eu") == (3, "orders.eu")
    assert strip_partition("12.x") == (12, "x")
    assert strip_partition("0") == (0, "")
    for bad in ("orders.eu", "", "-1.x", "².x", "1a.x"):
        with pytest.raises(ValueError):
            strip_partition(bad)


# --------------------------------------------------------------------------- plans


def test_plan_moves_when_members_come_and_go():
    one = distribute(["m1"], 4)
    two = distribute(["m1", "m2"], 4)
    assert plan_moves(one, two) == [(2, "m1", "m2"), (3, "m1", "m2")]
    assert plan_moves(two, one) == [(2, "m2", "m1"), (3, "m2", "m1")]
    assert plan_moves(two, two) == []
    assert plan_moves({}, one) == [(p, None, "m1") for p in range(4)]
    assert plan_moves(one, {}) == [(p, "m1", None) for p in range(4)]


def test_plan_moves_from_the_orbit_integration_scenario():
    # 2 partitions: m1 alone, add m2 (one partition moves), drop m1 (m2 takes it)
    a, b, c = distribute(["m1"], 2), distribute(["m1", "m2"], 2), distribute(["m2"], 2)
    assert plan_moves(a, b) == [(1, "m1", "m2")]
    assert plan_moves(b, c) == [(0, "m1", "m2")]
