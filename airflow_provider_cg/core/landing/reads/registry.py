"""The read paths of a member run, one per ``ReadMode`` (``modes.py``), and the one place a
run's path is chosen (``choose``). ``MemberRun`` knows readers only as ``Reader``; a new read
path is its module under ``reads/``, its tests, a ``ReadMode`` member and its line in
``BUILT_IN``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from airflow_provider_cg.core.landing.modes import ReadMode
from airflow_provider_cg.core.landing.reads.consumer import ConsumerReads
from airflow_provider_cg.core.landing.reads.direct import DirectReads, Positions
from airflow_provider_cg.core.landing.reads.reading import MemberReading


class Reader(Protocol):
    """One assignment's reader, given its ``MemberReading`` (and, reading by direct gets, the
    member's ``Positions``). It changes none of the run's state (``reads/reading.py``)."""

    #: what the summary's ``read_path`` reports
    read_path: str
    #: messages per batch: the run's, or fewer to fit an existing consumer's ``max_ack_pending``
    batch_size: int

    def pin_pull(self, target: int) -> int:
        """How many messages the pull that takes the pin asks for (``target``: the backlog found)."""
        ...

    async def begin(self, first: list, pinned: dict) -> str | None:
        """Right after the take-over, with ``first`` the pinning pull's messages and ``pinned``
        the consumer as the run was pinned on it: None, or why this reader cannot read this
        run, with the remedy (the run then reads through the consumer)."""
        ...

    async def land(self, first: list, landed: set[int]) -> bool:
        """Land batches until the stop rule says so (``landed``: the consumed stream's
        sequences the take-over's recovery committed). False: the pin moved on before
        anything could land, and the run ends without releasing it."""
        ...


def _executor_reads(reading: MemberReading, positions: Positions | None) -> Reader:
    # imported here: its PySpark data source costs a plain driver's start-up a tenth of a second
    from airflow_provider_cg.core.landing.reads.executors import ExecutorReads

    return ExecutorReads(reading, _required(positions))


def _direct_reads(reading: MemberReading, positions: Positions | None) -> Reader:
    return DirectReads(reading, _required(positions))


def _consumer_reads(reading: MemberReading, positions: Positions | None) -> Reader:
    return ConsumerReads(reading)


def _required(positions: Positions | None) -> Positions:
    if positions is None:
        raise ValueError("a direct-get reader needs the member's positions")
    return positions


@dataclass(frozen=True)
class ReadPath:
    """A ``ReadMode``'s reader: ``direct`` ones read by direct gets, so they need a stream that
    serves them and the member's positions; the others pull through the member consumer."""

    mode: ReadMode
    direct: bool
    make: Callable[[MemberReading, Positions | None], Reader]


#: the read paths, one per mode
BUILT_IN: tuple[ReadPath, ...] = (
    ReadPath(ReadMode.AUTO, True, _direct_reads),
    ReadPath(ReadMode.EXECUTORS, True, _executor_reads),
    ReadPath(ReadMode.CONSUMER, False, _consumer_reads),
)
_PATHS = {p.mode: p for p in BUILT_IN}
#: where a run reads when its mode's path cannot (no direct gets, a durable it cannot move)
FALLBACK = _PATHS[ReadMode.CONSUMER]


def read_path(mode: ReadMode) -> ReadPath:
    return _PATHS[mode]


def choose(mode: ReadMode, direct_gets: bool) -> ReadPath:
    """The path a run in ``mode`` reads by, given whether the member's stream serves it direct
    gets (``direct_gets``)."""
    path = _PATHS[mode]
    return path if direct_gets or not path.direct else FALLBACK
