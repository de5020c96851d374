"""Fault injection for crash tests: ``CG_FAILPOINT=<point>`` kills the process at that point
with SIGKILL, ``CG_FAILPOINT=stop:<point>`` suspends it with SIGSTOP (SIGCONT resumes it).

Points: ``mid_prepare`` (a sink's staging half written), ``after_prepare``, ``mid_ack`` (half
the batch double-acked), ``before_commit``. Unset in production: each check is one lookup."""

from __future__ import annotations

import logging
import os
import signal
import threading

FAILPOINT_ENV = "CG_FAILPOINT"

log = logging.getLogger(__name__)


def failpoint(name: str) -> None:
    """Kill or suspend this process here when ``$CG_FAILPOINT`` names this point."""
    value = os.environ.get(FAILPOINT_ENV)
    if value == name:
        log.warning("cg failpoint %s: killing this process", name)
        os.kill(os.getpid(), signal.SIGKILL)
    elif value == f"stop:{name}":
        log.warning("cg failpoint %s: suspending this process", value)
        for h in logging.getLogger().handlers:
            h.flush()
        # To this thread, not the process: a process-directed SIGSTOP is taken by the main
        # thread, and until it runs this thread goes on past the point (under load, through
        # the rest of a prepare). This thread takes its own at once and stops them all.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
