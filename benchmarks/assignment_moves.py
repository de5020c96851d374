"""Partitions moved by a membership change, block vs sticky assignment (the table in docs/how-to/members-and-partitions.md).

    python benchmarks/assignment_moves.py

For each partition count: from 3 members to 4 (one added), from 4 to 3 (one removed, the
second in name order), and from 8 to 9: how many partitions change owner with the
contiguous-block distribution (orbit's ``members``) and with the sticky one
(``--assignment sticky``), and the least any balanced assignment must move.
"""

from __future__ import annotations

from airflow_provider_cg.core.groups.partitioning import distribute, plan_moves, sticky_distribute


def members(n: int) -> list[str]:
    return [f"m{i}" for i in range(1, n + 1)]


def changes(partitions: int):
    for label, old, new in (("add 4th of 4", members(3), members(4)),
                            ("remove 1 of 4", members(4), [m for m in members(4) if m != "m2"]),
                            ("add 9th of 9", members(8), members(9))):
        start = distribute(old, partitions)
        block = len(plan_moves(start, distribute(new, partitions)))
        sticky = len(plan_moves(start, sticky_distribute(start, new, partitions)))
        least = len([p for m in old if m not in new for p in start[m]]) + sum(
            max(0, len(start[m]) - (partitions // len(new) + 1)) for m in old if m in new)
        if len(new) > len(old):
            least = partitions // len(new)
        yield label, block, sticky, least


def main() -> None:
    print(f"{'partitions':>10}  {'change':<14} {'block':>6} {'sticky':>7} {'least':>6}")
    for n in (6, 12, 64, 256):
        for label, block, sticky, least in changes(n):
            print(f"{n:>10}  {label:<14} {block:>6} {sticky:>7} {least:>6}")


if __name__ == "__main__":
    main()
