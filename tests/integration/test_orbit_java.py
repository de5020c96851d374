"""orbit.java's ``pcgroups`` (synadia-io/orbit.java, built from its source with Maven:
``tests/support/orbit_java.py``) beside this provider, on a real nats-server: what a Java member
reads of groups that ``cg`` creates, so the docs' advice (docs/how-to/orbit.md) is the port's
own behaviour. The port is not on Maven Central: the test runs when ``$CG_ORBIT_JAVA_SOURCE``
names its checkout, and is skipped, saying so, otherwise.

What it shows: a Java static member subscribes to every subject of its partitions (``<p>.>``)
whatever filter the config names, in orbit's v0.2 shape (``filters``) and in v0.1's
(``filter``) alike. In the v0.2 shape the member job keeps to the filter, so Java members read
more than it does; in v0.1's, the job reads ``<p>.>`` as orbit v0.1's own instances do, and all
agree (hence the advice: ``--orbit-format v0.1`` for a static group with Java members). Without
a filter, both read the same in either shape. An elastic group is shared both ways.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from airflow_provider_cg.core.tools.server import EmbeddedNatsServer
from tests.support.orbit_java import build, source

pytestmark = [pytest.mark.integration]

CG = [sys.executable, "-m", "airflow_provider_cg.core.tools.cli"]
SUBJECTS = [f"{p}.{kind}.c{i}" for i in range(12) for p in (0, 1) for kind in ("orders", "refunds")]


@pytest.fixture(scope="module")
def java_member():
    root = source()
    if root is None:
        pytest.skip("orbit.java's source is not on Maven Central: set CG_ORBIT_JAVA_SOURCE to its checkout")
    return build(root)


@pytest.fixture
def server(tmp_path):
    s = EmbeddedNatsServer(tmp_path / "nats").start()
    yield s
    s.stop()


def _cg(server, *args: str) -> str:
    r = subprocess.run([*CG, *args, "--server", server.url], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _java(java_member, server, kind: str, group: str, member: str) -> list[str]:
    r = subprocess.run([*java_member, kind, server.url, "ORDERS", group, member, "20"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    got = [line.split(" ", 1)[1] for line in r.stdout.splitlines() if line.startswith("msg ")]
    assert f"count {len(got)}" in r.stdout
    return got


def _origin(server) -> None:
    import asyncio

    import nats

    async def go():
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await js.add_stream(name="ORDERS", subjects=[f"{p}.{k}.*" for p in (0, 1) for k in ("orders", "refunds")])
        for s in SUBJECTS:
            await js.publish(s, b"{}")
        await nc.close()

    asyncio.run(go())


def _job(member_job_zip, server, tmp_path, group: str, member: str) -> list[str]:
    """The subjects the member job (its plain Python driver) lands for ``member``."""
    from tests.support.member_job import parquet_landed, run_member_job

    r = run_member_job(member_job_zip, tmp_path / "job", nats_servers=server.url, stream="ORDERS", group=group,
                       member=member, sink_path=tmp_path / f"lake-{group}", spark=False)
    assert r.returncode == 0, r.stderr[-2000:]
    return sorted(SUBJECTS[row.origin_seq - 1] for row in parquet_landed(tmp_path / f"lake-{group}"))


@pytest.mark.parametrize("orbit_format", ["v0.2", "v0.1"])
def test_a_java_static_member_reads_every_subject_of_its_partitions_whatever_the_filter(
        java_member, server, orbit_format, member_job_zip, tmp_path):
    _origin(server)
    _cg(server, "create", "static", "ORDERS", "filtered", "--max-members", "2", "--filter", "orders.*",
        "--members", "m1,m2", "--orbit-format", orbit_format)
    got = _java(java_member, server, "static", "filtered", "m1")
    # m1 holds partition 0; the filter asks for its orders only, the Java member takes its refunds too
    assert sorted(got) == sorted(s for s in SUBJECTS if s.startswith("0."))
    assert sum(".refunds." in s for s in got) == 12
    # the member job (m2: partition 1): in the v0.2 shape it keeps to the filter, so Java members
    # read more than it does; in v0.1's, it reads every subject of its partitions as orbit v0.1's
    # own instances do, and so as the Java member does: they agree
    job = _job(member_job_zip, server, tmp_path, "filtered", "m2")
    prefix = "1.orders." if orbit_format == "v0.2" else "1."
    assert job == sorted(s for s in SUBJECTS if s.startswith(prefix))


def test_a_java_static_member_of_a_group_without_a_filter_reads_what_the_member_job_reads(
        java_member, server, member_job_zip, tmp_path):
    _origin(server)
    _cg(server, "create", "static", "ORDERS", "whole", "--max-members", "2", "--members", "m1,m2")
    java = _java(java_member, server, "static", "whole", "m2")
    assert sorted(java) == sorted(s for s in SUBJECTS if s.startswith("1."))
    assert _job(member_job_zip, server, tmp_path, "whole", "m1") == sorted(s for s in SUBJECTS if s.startswith("0."))


def test_an_elastic_group_is_shared_both_ways(java_member, server, member_job_zip, tmp_path):
    """cg creates it, a Java member and the member job each land their member's partitions, a
    member cg adds is consumed by Java, and the work queue ends empty: nothing read twice."""
    import asyncio

    import nats

    async def origin():
        nc = await nats.connect(server.url)
        await nc.jetstream().add_stream(name="ORDERS", subjects=["orders.*"])
        for i in range(120):
            await nc.jetstream().publish(f"orders.c{i % 11}", b"{}")
        await nc.close()

    asyncio.run(origin())
    _cg(server, "create", "elastic", "ORDERS", "lake", "--max-members", "4", "--filter", "orders.*",
        "--wildcards", "1", "--members", "m1,m2")
    java = _java(java_member, server, "elastic", "lake", "m2")
    from tests.support.member_job import parquet_landed, run_member_job

    r = run_member_job(member_job_zip, tmp_path / "job", nats_servers=server.url, stream="ORDERS", group="lake",
                       member="m1", sink_path=tmp_path / "lake", spark=False)
    assert r.returncode == 0, r.stderr[-2000:]
    landed = parquet_landed(tmp_path / "lake")
    assert {row.partition for row in landed} == {0, 1} and {int(s.split(".")[0]) for s in java} == {2, 3}
    assert len(landed) + len(java) == 120
