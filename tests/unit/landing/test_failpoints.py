"""Failpoints stop where they are: a suspended process runs nothing past its point, whichever
thread reached it. The crash tests' claims about what a stalled instance left behind (a write
half-prepared, not prepared) rest on that."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

# A worker thread reaches the failpoint while the main thread is busy on the same single CPU:
# a process-directed SIGSTOP waits for the main thread to be scheduled, so the worker ran on
# and wrote its marker (with ``os.kill``, in 3 runs of 3).
CHILD = textwrap.dedent("""
    import os, sys, threading, time
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    from airflow_provider_cg.core.landing.failpoints import failpoint
    marker = sys.argv[1]
    def work():
        failpoint("probe")
        with open(marker, "w") as fh:
            fh.write("ran past the failpoint")
    threading.Thread(target=work).start()
    t = time.monotonic()
    while time.monotonic() - t < 60:
        pass
""")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_stop_failpoint_in_a_worker_thread_stops_there(tmp_path):
    marker = tmp_path / "marker"
    env = {**os.environ, "CG_FAILPOINT": "stop:probe", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(marker)], env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while _state(proc.pid) != "T":
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()
            time.sleep(0.01)
        time.sleep(0.3)  # anything the process still runs would write the marker by now
        assert _state(proc.pid) == "T"
        assert not marker.exists(), "the thread ran past its failpoint before the process stopped"
    finally:
        proc.kill()  # SIGKILL ends a stopped process too
        proc.wait(10)
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
