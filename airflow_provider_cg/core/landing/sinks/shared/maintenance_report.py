"""What one maintenance run did (``MaintenanceReport``), and the retry every format's maintenance
needs beside landing members. Each family's ``maintenance.py`` maintains its tables;
``sinks/maintenance.py`` checks the options, opens the table and runs its sink's
(``SinkKind.maintain``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable


Result = TypeVar("Result")


@dataclass
class MaintenanceReport:
    """What one maintenance run did (numbers only: safe for logs and XCom)."""

    table: str
    compacted: dict[str, Any] = field(default_factory=dict)
    removed_files: int = 0
    expired_snapshots: int = 0
    checkpoint: bool = False
    #: what the protocol log's clean-up removed (``protocol_log.clean_protocol_log``)
    protocol_log: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "compacted": self.compacted, "removed_files": self.removed_files,
                "expired_snapshots": self.expired_snapshots, "checkpoint": self.checkpoint,
                "protocol_log": self.protocol_log, "duration_s": round(self.duration_s, 3)}


def retrying_conflicts(action: Callable[[], Result], reload: Callable[[], object],
                       attempts: int = 5) -> Result:
    """``action`` again after a commit lost to a member's concurrent commit (optimistic
    concurrency of both formats: the member's commit stands, maintenance re-reads and retries)."""
    for attempt in range(attempts):
        try:
            return action()
        except Exception as e:  # noqa: BLE001 - each library's own conflict error, by name
            if attempt == attempts - 1 or not any(w in type(e).__name__ for w in ("CommitFailed", "Conflict")):
                raise
            time.sleep(0.1 * (attempt + 1))
            reload()
    raise AssertionError("unreachable")
