"""Our partition hash against the real nats-server, subject by subject.

Streams get a subject transform from ``transform_destination``; the server stores every message
under ``<partition>.<original subject>``, so each stored subject says which partition the server
chose for it. Every one must equal ``partition_of``.
"""

from __future__ import annotations

import asyncio
import json
import random
import string
import time

import pytest
from nats.js.api import StorageType, StreamConfig, SubjectTransform

from airflow_provider_cg.core.groups.partitioning import partition_of, strip_partition, transform_destination

pytestmark = pytest.mark.integration

ASCII = string.ascii_letters + string.digits + "-_"
UNICODE = "éüßøΩжд中文字😀🚀ñç"
PER_SCENARIO = 2000


def _token(rng: random.Random, alphabet: str) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 10)))


def _subjects(rng: random.Random, make, count: int) -> list[str]:
    out: set[str] = set()
    while len(out) < count:
        out.add(make(rng))
    return sorted(out)


def _ascii(rng):
    return _token(rng, ASCII)


def _mixed(rng):
    return _token(rng, ASCII + UNICODE)


def _tail(rng):
    return ".".join(_ascii(rng) for _ in range(rng.randint(1, 3)))


# (stream, filter, wildcard indexes, partitions, subject maker)
SCENARIOS = [
    ("PH2", "t2.*.*.>", (1, 2), 7, lambda r: f"t2.{_ascii(r)}.{_ascii(r)}.{_tail(r)}"),
    ("PHREV", "tr.*.*", (2, 1), 16, lambda r: f"tr.{_ascii(r)}.{_ascii(r)}"),
    ("PHWHOLE", "w.>", (), 3, lambda r: f"w.{_tail(r)}"),
    ("PHWHOLEU", "wu.*.*", (), 16, lambda r: f"wu.{_mixed(r)}.{_mixed(r)}"),
    ("PHUNI", "u.*", (1,), 7, lambda r: f"u.{_mixed(r)}"),
    ("PHMID", "m.*.x.*", (2,), 3, lambda r: f"m.{_mixed(r)}.x.{_ascii(r)}"),
]


async def _stored_subjects(nc, stream: str) -> dict[str, int]:
    """Every stored subject with its message count (STREAM.INFO pages through them)."""
    subjects: dict[str, int] = {}
    while True:
        body = json.dumps({"subjects_filter": ">", "offset": len(subjects)}).encode()
        reply = json.loads((await nc.request(f"$JS.API.STREAM.INFO.{stream}", body, timeout=10)).data)
        assert "error" not in reply, reply
        page = reply["state"].get("subjects") or {}
        subjects.update(page)
        if not page or len(subjects) >= reply.get("total", len(subjects)):
            return subjects


async def _wait_for_messages(js, stream: str, expected: int, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while True:
        info = await js.stream_info(stream)
        if info.state.messages >= expected or time.monotonic() > deadline:
            assert info.state.messages == expected, f"{stream}: {info.state.messages} of {expected} stored"
            return
        await asyncio.sleep(0.05)


def _check(stored: dict[str, int], published: list[str], flt, wildcards, partitions) -> None:
    seen: set[str] = set()
    wrong = []
    for subject, count in stored.items():
        p, original = strip_partition(subject)
        assert count == 1, (subject, count)
        seen.add(original)
        ours = partition_of(original, partitions, wildcards, flt)
        if ours != p:
            wrong.append((original, p, ours))
    assert not wrong, f"{len(wrong)} subjects differ (subject, server, ours), e.g. {wrong[:5]}"
    assert seen == set(published)


async def test_partition_of_matches_the_server_for_every_subject(nc):
    js = nc.jetstream()
    rng = random.Random(20240611)
    plan = []
    for stream, flt, wildcards, partitions, make in SCENARIOS:
        dest = transform_destination(flt, wildcards, partitions)
        await js.add_stream(
            StreamConfig(
                name=stream,
                subjects=[flt],
                storage=StorageType.MEMORY,
                subject_transform=SubjectTransform(src=flt, dest=dest),
            )
        )
        subjects = _subjects(rng, make, PER_SCENARIO)
        plan.append((stream, flt, wildcards, partitions, subjects))

    total = 0
    for _, _, _, _, subjects in plan:  # pipelined: core publishes, one flush
        for subject in subjects:
            await nc.publish(subject, b"")
        total += len(subjects)
    await nc.flush()
    assert total >= 10_000

    for stream, flt, wildcards, partitions, subjects in plan:
        await _wait_for_messages(js, stream, len(subjects))
        stored = await _stored_subjects(nc, stream)
        _check(stored, subjects, flt, wildcards, partitions)


async def test_work_queue_sourcing_with_several_partitioning_filters(nc):
    """The elastic layout: a work-queue stream sourcing the origin, one transform per filter."""
    js = nc.jetstream()
    rng = random.Random(7)
    await js.add_stream(name="PHORIG", subjects=["o.>"], storage=StorageType.MEMORY)
    filters = [("o.a.*", (1,)), ("o.b.*.*", ())]
    n = 5
    wq = {
        "name": "PHORIG-g",
        "retention": "workqueue",
        "discard": "new",
        "storage": "memory",
        "allow_direct": True,
        "sources": [
            {
                "name": "PHORIG",
                "subject_transforms": [
                    {"src": f, "dest": transform_destination(f, w, n)} for f, w in filters
                ],
            }
        ],
    }
    reply = json.loads((await nc.request("$JS.API.STREAM.CREATE.PHORIG-g", json.dumps(wq).encode())).data)
    assert "error" not in reply, reply

    subjects_a = _subjects(rng, lambda r: f"o.a.{_mixed(r)}", 500)
    subjects_b = _subjects(rng, lambda r: f"o.b.{_ascii(r)}.{_mixed(r)}", 500)
    for subject in subjects_a + subjects_b:
        await nc.publish(subject, b"")
    await nc.flush()
    await _wait_for_messages(js, "PHORIG-g", 1000)

    stored = await _stored_subjects(nc, "PHORIG-g")
    by_filter = {"a": {}, "b": {}}
    for subject, count in stored.items():
        by_filter[subject.split(".")[2]][subject] = count
    _check(by_filter["a"], subjects_a, "o.a.*", (1,), n)
    _check(by_filter["b"], subjects_b, "o.b.*.*", (), n)
