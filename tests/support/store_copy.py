"""An older copy of a nats-server's store, put back: what a power loss under nats-server's lazy
fsync leaves, and what restoring a disk, VM or volume snapshot does. The stream keeps its
creation time; its last sequence goes back, and the next messages published take the
sequences of the ones it lost (``core/landing/protocol/origin_guard.py``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from airflow_provider_cg.core.tools.server import EmbeddedNatsServer


class StoreCopy:
    """``take`` copies the store of ``server`` (SIGKILLed for it, as a crash would leave it,
    then started again); ``put_back`` SIGKILLs it and starts it on that copy."""

    def __init__(self, server: EmbeddedNatsServer, where: Path) -> None:
        self.server, self.where = server, Path(where)

    @property
    def _store(self) -> Path:
        return self.server.store_dir / "js"

    def take(self) -> StoreCopy:
        self.server.kill()
        shutil.copytree(self._store, self.where)
        self.server.start()
        return self

    def put_back(self) -> None:
        self.server.kill()
        shutil.rmtree(self._store)
        shutil.copytree(self.where, self._store)
        self.server.start()
