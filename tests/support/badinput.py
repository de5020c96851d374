"""Helpers of the bad-input suite (tests/badinput): run ``cg`` and the member job on bad
input, check the answer (exit status, one line naming the field, no traceback, no secret)
and that the server's state did not change."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from dataclasses import dataclass

from airflow_provider_cg.core.tools.cli import main as cg_main


@dataclass
class Answer:
    argv: list[str]
    rc: int
    out: str
    err: str

    def problems(self, code: int, field: str | None, secrets: tuple[str, ...] = (), prog: str = "cg") -> list[str]:
        """What is wrong with this answer to bad input (empty: nothing)."""
        found = []
        if self.rc != code:
            found.append(f"exit {self.rc}, expected {code}")
        lines = [line for line in self.err.splitlines() if line.strip()]
        if len(lines) != 1:
            found.append(f"{len(lines)} lines on stderr")
        elif field is not None and not lines[0].startswith(f"{prog}: error: {field}"):
            found.append(f"does not name {field!r}: {lines[0][:200]!r}")
        if "Traceback" in self.err + self.out:
            found.append("traceback")
        for s in secrets:
            if s and s in self.err + self.out:
                found.append("a secret is shown")
        return found


def cg(*argv: str) -> Answer:
    """``cg`` in this process (fast); its own exception handling is what is tested."""
    out, err = io.StringIO(), io.StringIO()
    rc = cg_main(list(argv), stdout=out, stderr=err)
    return Answer(list(argv), rc, out.getvalue(), err.getvalue())


async def acg(*argv: str) -> Answer:
    return await asyncio.to_thread(cg, *argv)


def cg_process(*argv: str, env: dict[str, str] | None = None, timeout: float = 60) -> Answer:
    """``cg`` as its own process (exit status, tracebacks and hangs as a user sees them)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CG_NATS_")}
    full_env.update(env or {})
    r = subprocess.run([sys.executable, "-m", "airflow_provider_cg.core.tools.cli", *argv], env=full_env,
                       capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return Answer(list(argv), r.returncode, r.stdout, r.stderr)


async def snapshot(nc) -> dict:
    """Everything a command could write: streams (config and message count), consumers
    (config), and both KV buckets' live entries."""
    from airflow_provider_cg.core.jetstream.api import JsApi

    api = JsApi(nc)
    streams: list[dict] = []
    while True:
        page = await api.request("STREAM.LIST", {"offset": len(streams)})
        got = page.get("streams") or []
        streams.extend(got)
        if not got or len(streams) >= page.get("total", 0):
            break
    state: dict = {}
    for info in streams:
        name = info["config"]["name"]
        cfg = {k: v for k, v in info["config"].items() if k != "metadata"}
        consumers = {c["name"]: {k: v for k, v in c["config"].items() if k != "metadata"}
                     for c in await api.list_consumers(name)}
        state[name] = (cfg, info["state"]["messages"], info["state"]["last_seq"], consumers)
    return state


def report(failures: list[str]) -> None:
    assert not failures, f"{len(failures)} bad answers:\n" + "\n".join(failures[:40])


def member_job(*argv: str, env: dict[str, str] | None = None, timeout: float = 120) -> Answer:
    """The member job's own process, as a plain Python driver (``--no-spark``)."""
    from airflow_provider_cg.core.tools.packaging import member_job_path

    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("CG_NATS_", "CG_PG_"))}
    full_env.update(env or {})
    r = subprocess.run([sys.executable, str(member_job_path()), "--no-spark", *argv], env=full_env,
                       capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    # the job logs INFO lines on stderr by design; errors are the "cg_member_job: error:" lines
    err = "\n".join(line for line in r.stderr.splitlines() if " INFO " not in line and " WARNING " not in line)
    return Answer(list(argv), r.returncode, r.stdout, err)
