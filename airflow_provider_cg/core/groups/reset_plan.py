"""What a reset asks and what it would do: the target (one of ``MODES``, as ``kafka-consumer-groups
--reset-offsets`` names them, with its value parsed and checked), and the plan ``GroupReset.plan``
makes of it (per member and partition: the position now and after, the messages processed
again or skipped). Plans are JSON-able: the CLI and the operator show them, and ``execute``
re-reads the target from its description (``target_of``)."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_provider_cg.core.durations import parse_duration
from airflow_provider_cg.core.errors import ConfigError, ConsumerGroupError

MODES = ("to_datetime", "by_duration", "to_earliest", "to_latest", "to_seq", "shift_by")


class ResetRefused(ConsumerGroupError):
    """A reset that must not run now (an active instance, a server without the API)."""


def flag(mode: str) -> str:
    return "--" + mode.replace("_", "-")


@dataclass(frozen=True)
class ResetTarget:
    """Where to move: one of ``MODES`` and its value."""

    mode: str
    value: Any = None

    @classmethod
    def parse(cls, **given: Any) -> ResetTarget:
        """From options named as ``MODES`` (exactly one given): ``ConfigError`` naming the option."""
        unknown = set(given) - set(MODES)
        if unknown:
            raise ConfigError(sorted(unknown)[0], "is not a reset option")
        chosen = {k: v for k, v in given.items() if v is not None and v is not False}
        if len(chosen) != 1:
            raise ConfigError("reset", "give exactly one of " + ", ".join(flag(m) for m in MODES))
        mode, value = chosen.popitem()
        if mode in ("to_earliest", "to_latest"):
            return cls(mode)
        if mode == "to_datetime":
            return cls(mode, parse_datetime(value))
        if mode == "by_duration":
            return cls(mode, parse_duration(value))
        n = _int(mode, value)
        if mode == "to_seq" and n < 1:
            raise ConfigError(mode, "must be a stream sequence >= 1")
        if mode == "shift_by" and n == 0:
            raise ConfigError(mode, "must not be 0 (negative: back, positive: forward)")
        return cls(mode, n)

    def describe(self) -> str:
        if self.value is None:
            return flag(self.mode)
        if isinstance(self.value, dt.datetime):
            return f"{flag(self.mode)} {self.value.isoformat().replace('+00:00', 'Z')}"
        if self.mode == "by_duration":
            return f"{flag(self.mode)} {self.value:g}s"
        return f"{flag(self.mode)} {self.value}"


def _int(field_name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ConfigError(field_name, f"must be an integer (got {value!r})")
    try:
        return int(str(value).strip())
    except ValueError:
        raise ConfigError(field_name, f"must be an integer (got {value!r})") from None


def parse_datetime(value: Any) -> dt.datetime:
    if isinstance(value, dt.datetime):
        out = value
    else:
        try:
            out = dt.datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError("to_datetime", "must be an ISO 8601 date-time such as 2026-11-25T09:00:00Z "
                              f"(got {value!r})") from None
    return (out if out.tzinfo else out.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)


@dataclass
class PositionChange:
    """One position a reset moves: an elastic partition, or a static member (all its partitions)."""

    member: str
    partitions: list[int]
    current: int  # origin sequence of the next message to process
    new: int
    replay: int  # messages between the new and the current position, read again (landed ones are no-ops)
    skip: int  # messages from the current position up to the new one, never read


@dataclass
class ResetPlan:
    stream: str
    group: str
    kind: str
    member: str | None  # None: the whole group
    target: str
    origin_first_seq: int
    origin_last_seq: int
    changes: list[PositionChange] = field(default_factory=list)
    pinned: dict[str, str] = field(default_factory=dict)  # member -> pinned client id
    executed: bool = False

    @property
    def replay(self) -> int:
        return sum(c.replay for c in self.changes)

    @property
    def skip(self) -> int:
        return sum(c.skip for c in self.changes)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "replay": self.replay, "skip": self.skip}


def target_of(described: str) -> tuple[str, Any]:
    name, _, value = described.partition(" ")
    mode = name[2:].replace("-", "_")
    if not value:
        return mode, None
    parsed = ResetTarget.parse(**{mode: value})
    return parsed.mode, parsed.value
