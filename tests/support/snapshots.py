"""A stream's snapshot and its restore through nats-server's own API (``$JS.API.STREAM.SNAPSHOT``
and ``.RESTORE``, as ``nats stream backup`` and ``restore`` use them): the chunks of a snapshot
come to an inbox, each acknowledged to keep the window moving, and end with an empty message
carrying a status; a restore takes the chunks as requests and an empty one to finish."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

CHUNK = 64 * 1024


@dataclass(frozen=True)
class Snapshot:
    config: dict
    state: dict
    data: bytes


async def snapshot(nc, stream: str, timeout: float = 30.0) -> Snapshot:
    inbox = nc.new_inbox()
    chunks: list[bytes] = []
    done: asyncio.Future = asyncio.get_running_loop().create_future()

    async def chunk(msg) -> None:
        if not msg.data:  # the end: a status (204 when complete)
            status = (msg.headers or {}).get("Status", "")
            if not done.done():
                done.set_result(status)
            return
        chunks.append(msg.data)
        if msg.reply:
            await nc.publish(msg.reply, b"")

    sub = await nc.subscribe(inbox, cb=chunk)
    try:
        reply = json.loads((await nc.request(f"$JS.API.STREAM.SNAPSHOT.{stream}",
                                             json.dumps({"deliver_subject": inbox}).encode(), timeout=timeout)).data)
        assert "error" not in reply, reply
        status = await asyncio.wait_for(done, timeout)
        assert status in ("", "204"), f"snapshot of {stream} ended with status {status}"
    finally:
        await sub.unsubscribe()
    return Snapshot(reply["config"], reply["state"], b"".join(chunks))


async def restore(nc, snap: Snapshot, timeout: float = 30.0) -> dict:
    """The stream restored from ``snap``; its stream info."""
    name = snap.config["name"]
    reply = json.loads((await nc.request(f"$JS.API.STREAM.RESTORE.{name}",
                                         json.dumps({"config": snap.config, "state": snap.state}).encode(),
                                         timeout=timeout)).data)
    assert "error" not in reply, reply
    subject = reply["deliver_subject"]
    for i in range(0, len(snap.data), CHUNK):
        await nc.request(subject, snap.data[i:i + CHUNK], timeout=timeout)
    final = json.loads((await nc.request(subject, b"", timeout=timeout)).data)
    assert "error" not in final, final
    return final
