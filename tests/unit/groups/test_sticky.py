"""Sticky assignment: balanced within one partition, the fewest partitions moved (checked
against the lower bound by brute force over shares, and over random membership histories)."""

from __future__ import annotations

import random

import pytest

from airflow_provider_cg.core.groups.partitioning import distribute, plan_moves, sticky_distribute


def _check(assignment: dict[str, list[int]], members: list[str], n: int) -> None:
    owned = sorted(p for ps in assignment.values() for p in ps)
    assert owned == list(range(n)), assignment  # every partition once
    sizes = [len(assignment[m]) for m in members if assignment[m]]
    active = min(len(set(members)), n)
    assert len(sizes) == active and max(sizes) - min(sizes) <= 1, assignment


def _least_moves(previous: dict[str, list[int]], members: list[str], n: int) -> int:
    """The fewest partitions any balanced assignment must move: all partitions minus the most
    the members can keep, when the larger shares go to whoever keeps the most."""
    members = sorted(set(members))
    held = sorted((len([p for p in previous.get(m, []) if p < n]) for m in members), reverse=True)
    k = min(len(members), n)
    q, r = divmod(n, k)
    keep = sum(min(h, q + (1 if i < r else 0)) for i, h in enumerate(held[:k]))
    owned_before = sum(len([p for p in ps if p < n]) for ps in previous.values())
    return n - keep - (n - owned_before)  # partitions nobody owned before are placed, not moved


@pytest.mark.parametrize("n", [6, 12, 64, 256])
def test_adding_and_removing_a_member_moves_the_minimum(n):
    members = [f"m{i}" for i in range(1, 4)]
    start = distribute(members, n)
    added = sticky_distribute(start, [*members, "m4"], n)
    _check(added, [*members, "m4"], n)
    moved = len(plan_moves(start, added))
    assert moved == len(added["m4"]) == n // 4  # only what the new member takes
    removed = sticky_distribute(added, ["m1", "m3", "m4"], n)
    _check(removed, ["m1", "m3", "m4"], n)
    assert len(plan_moves(added, removed)) == len(added["m2"])  # only the departed member's partitions
    assert len(plan_moves(start, distribute([*members, "m4"], n))) >= moved


def test_random_histories_stay_balanced_and_minimal():
    rnd = random.Random(20261124)
    for _ in range(300):
        n = rnd.choice([1, 2, 5, 6, 7, 12, 31, 64])
        members = sorted(rnd.sample([f"m{i}" for i in range(12)], rnd.randint(1, 8)))
        current = sticky_distribute({}, members, n)
        for _ in range(6):
            nxt = sorted(set(rnd.sample([f"m{i}" for i in range(12)], rnd.randint(1, 8))))
            new = sticky_distribute(current, nxt, n)
            _check(new, nxt, n)
            assert len(plan_moves(current, new)) - sum(1 for p in range(n) if all(
                p not in ps for ps in current.values())) <= _least_moves(current, nxt, n)
            current = new


def test_stale_or_duplicate_holdings_are_cleaned():
    got = sticky_distribute({"a": [0, 0, 5, 9], "b": [5, 1]}, ["a", "b"], 6)
    _check(got, ["a", "b"], 6)
    assert set(got["a"]) >= {0, 5} and 1 in got["b"]
    assert sticky_distribute({}, [], 4) == {}
    assert sticky_distribute({"a": [0]}, ["a", "b", "c"], 2) == {"a": [0], "b": [1], "c": []}


def test_the_documented_table_is_what_the_algorithms_do():
    import importlib.util
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    spec = importlib.util.spec_from_file_location("assignment_moves", root / "benchmarks" / "assignment_moves.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    labels = {"add 4th of 4": "3 → 4 members", "remove 1 of 4": "4 → 3 members", "add 9th of 9": "8 → 9 members"}
    page = (root / "docs" / "how-to" / "members-and-partitions.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (.+?) \| (\d+) \| (\d+) \| (\d+) \|$", page, re.M)
    assert len(rows) == 11
    computed = {(str(n), labels[label]): (str(b), str(s), str(least))
                for n in (6, 12, 64, 256) for label, b, s, least in mod.changes(n)}
    for n, label, block, sticky, least in rows:
        assert computed[(n, label)] == (block, sticky, least), (n, label)
        assert int(sticky) == int(least) <= int(block)


def _brute_force_least_moves(previous: dict[str, list[int]], members: list[str], n: int) -> int:
    """The fewest partitions moved over every balanced assignment, found by enumerating them all."""
    import itertools

    members = sorted(set(members))
    owner = {p: m for m, ps in previous.items() for p in ps}
    k = min(len(members), n)
    best = n + 1
    for choice in itertools.product(members, repeat=n):
        sizes = [choice.count(m) for m in members]
        active = [s for s in sizes if s]
        if len(active) != k or max(active) - min(active) > 1:
            continue
        best = min(best, sum(1 for p, m in enumerate(choice) if p in owner and owner[p] != m))
    return best


def test_sticky_moves_equal_the_brute_force_optimum_on_small_groups():
    rnd = random.Random(20261125)
    names = [f"m{i}" for i in range(5)]
    for _ in range(60):
        n = rnd.randint(1, 6)
        before = sorted(rnd.sample(names, rnd.randint(1, 4)))
        after = sorted(rnd.sample(names, rnd.randint(1, 4)))
        current = sticky_distribute({}, before, n)
        new = sticky_distribute(current, after, n)
        _check(new, after, n)
        assert len(plan_moves(current, new)) == _brute_force_least_moves(current, after, n), (n, before, after)
