"""Message-queue provider for ``MessageQueueTrigger(scheme="nats-cg", ...)`` (event-driven DAGs).

Usage::

    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
    from airflow.sdk import Asset, AssetWatcher

    backlog = Asset(
        "orders_backlog",
        watchers=[
            AssetWatcher(
                name="orders_backlog",
                trigger=MessageQueueTrigger(
                    scheme="nats-cg", stream="ORDERS", group="workers", min_pending=1000,
                    poke_interval=10, nats_conn_id="nats_default",
                ),
            )
        ],
    )

The keyword arguments are :class:`~airflow_provider_cg.triggers.overflow.GroupOverflowTrigger`'s;
``mode`` defaults to ``"crossing"``: one event (one DAG run) per crossing of the threshold.

The deprecated queue-URI form is accepted too::

    MessageQueueTrigger(queue="nats-cg://<conn_id>/<stream>/<group>[/<member>]?min_pending=N&min_ack_pending=M&max_oldest_age=A&poke_interval=S")
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider

from airflow_provider_cg._provider_info import QUEUE_SCHEME
from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.triggers.overflow import GroupOverflowTrigger

__all__ = ["NatsCgMessageQueueProvider"]

_INT_PARAMS = ("min_pending", "min_ack_pending")
_FLOAT_PARAMS = ("poke_interval", "max_oldest_age")


def parse_queue_uri(queue: str) -> dict[str, Any]:
    """Trigger kwargs from ``nats-cg://<conn_id>/<stream>/<group>[/<member>]?min_pending=N...``."""
    parsed = urlparse(queue)
    if parsed.scheme != QUEUE_SCHEME:
        raise ConfigError("queue", f"must start with {QUEUE_SCHEME}://")
    parts = [unquote(p) for p in parsed.path.split("/") if p]
    if len(parts) not in (2, 3):
        raise ConfigError("queue", f"expected {QUEUE_SCHEME}://<conn_id>/<stream>/<group>[/<member>]")
    out: dict[str, Any] = {"stream": parts[0], "group": parts[1]}
    if len(parts) == 3:
        out["member"] = parts[2]
    if parsed.netloc:
        out["nats_conn_id"] = unquote(parsed.netloc)
    for name, values in parse_qs(parsed.query, keep_blank_values=True).items():
        if name not in _INT_PARAMS + _FLOAT_PARAMS:
            raise ConfigError(name, "unknown query parameter (use min_pending, min_ack_pending, max_oldest_age, poke_interval)")
        try:
            out[name] = int(values[-1]) if name in _INT_PARAMS else float(values[-1])
        except ValueError:
            raise ConfigError(name, "must be a number") from None
    return out


class NatsCgMessageQueueProvider(BaseMessageQueueProvider):
    """Consumer-group backlog thresholds as an event source (scheme ``nats-cg``)."""

    scheme = QUEUE_SCHEME

    def queue_matches(self, queue: str) -> bool:
        return queue.startswith(f"{QUEUE_SCHEME}://")

    def trigger_class(self) -> type[GroupOverflowTrigger]:
        return GroupOverflowTrigger

    def trigger_kwargs(self, queue: str, **kwargs: Any) -> dict:
        """Kwargs parsed from the URI; explicit keyword arguments win (they are passed as well)."""
        return {k: v for k, v in parse_queue_uri(queue).items() if k not in kwargs}
