"""The dead-letter stream ``<stream>-<group>-dlq``: poison messages, with their own headers
and why (``Cg-*``), deduplicated by origin so a republish after a crash is dropped."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from airflow_provider_cg.core.errors import ConsumerGroupError
from airflow_provider_cg.core.jetstream.api import JsApi

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS


class DeadLetters:
    """The dead-letter stream ``<stream>-<group>-dlq``; poison messages keep their error."""

    def __init__(self, nc: NATS, api: JsApi, stream: str, group: str, replicas: int = 1) -> None:
        self.nc, self.api = nc, api
        self.name = f"{stream}-{group}-dlq"
        self.prefix = f"cg.dlq.{stream}.{group}"
        self.replicas = replicas
        self._ready = False

    async def _ensure(self) -> None:
        if self._ready:
            return
        cfg = {"name": self.name, "subjects": [f"{self.prefix}.>"], "retention": "limits",
               "storage": "file", "num_replicas": self.replicas, "duplicate_window": 3600 * 10**9}
        try:
            await self.api.add_stream(cfg)
        except ConsumerGroupError as e:
            if getattr(e, "err_code", 0) != 10058:  # already exists
                raise
        self._ready = True

    async def publish(self, subject: str, data: bytes, headers: dict[str, str]) -> None:
        await self._ensure()
        js = self.nc.jetstream()
        await js.publish(f"{self.prefix}.{subject}", data, headers=headers, stream=self.name)


def dead_letter_headers(own_json: str | None, error: str, origin: str, seq: int, member: str,
                        deliveries: int | None = None) -> dict[str, str]:
    """A dead-lettered message's headers: its own (from the row's ``headers`` JSON), then why
    and where from (``Cg-*``), and a ``Nats-Msg-Id`` that makes a republish after a crash a
    duplicate the dead-letter stream drops."""
    own = json.loads(own_json) if own_json else {}
    hdrs = {k: (v if isinstance(v, str) else ",".join(v)) for k, v in own.items()}
    hdrs.update({"Cg-Error": error[:1024], "Cg-Origin-Stream": origin, "Cg-Origin-Seq": str(seq),
                 "Cg-Member": member, "Nats-Msg-Id": f"{origin}:{seq}"})
    if deliveries is not None:
        hdrs["Cg-Deliveries"] = str(deliveries)
    return hdrs
