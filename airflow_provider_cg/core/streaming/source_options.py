"""The streaming source's options (``spark.readStream.format("cg_member").option(...)``),
checked before anything connects: a bad one is refused naming it and its rule.

Spark shows a source's options in query plans and its UI, so none of them may carry a
secret: credentials reach the source through ``register`` (the member job's ``CG_NATS_*``
environment, or settings given in code), and a server URL with credentials in it is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.groups.names import validate_name

#: ``startingPosition`` values: where a query with a new checkpoint starts
STARTS = ("group", "latest")

#: option name (as documented; Spark matches them in any case) and what it is
OPTIONS = {
    "stream": "the group's origin stream (required)",
    "group": "the consumer group (required)",
    "member": "the member the query reads as (or members)",
    "members": "several members, comma-separated: one pin each",
    "startingPosition": "group (default): where the group is; latest: only messages stored after the query "
                        "starts (a new checkpoint only; what it skips stays the group's)",
    "maxMessagesPerTrigger": "at most this many messages per micro-batch (admission control)",
    "pinTimeout": "seconds to wait for each member's pin (default 30): longer makes the query a standby",
    "minPartitions": "split a micro-batch into at least this many tasks (default: one per partition read)",
    "ackWait": "ack wait (s) of a member consumer the source creates (default: the group kind's)",
    "servers": "NATS server URLs, comma-separated, without credentials (default: the registered settings')",
    "jsPrefix": "the JetStream API prefix (default $JS.API)",
    "failOnDataLoss": "true (default): a stream read that went back below the checkpoint stops the query; false: "
                      "the query reads on from where the stream went back",
}


def _positive(name: str, value: str | None, kind: type) -> float | int | None:
    if value is None or str(value).strip() == "":
        return None
    try:
        n = kind(str(value).strip())
    except ValueError:
        raise ConfigError(name, f"must be a positive {'integer' if kind is int else 'number'} (got {value!r})") from None
    if n <= 0:
        raise ConfigError(name, f"must be a positive {'integer' if kind is int else 'number'} (got {value!r})")
    return n


@dataclass(frozen=True)
class SourceOptions:
    stream: str
    group: str
    members: tuple[str, ...]
    starting_position: str = "group"
    max_messages: int | None = None
    pin_timeout: float = 30.0
    min_partitions: int | None = None
    ack_wait: float | None = None
    servers: tuple[str, ...] = ()
    js_prefix: str = "$JS.API"
    fail_on_data_loss: bool = True

    @classmethod
    def parse(cls, given: Mapping[str, str]) -> SourceOptions:
        """From Spark's options (any case), or ``ConfigError(option, rule)``."""
        known = {k.lower(): k for k in OPTIONS}
        values: dict[str, str] = {}
        for k, v in given.items():
            if k.lower() == "path":  # load("...") is not how a member is named
                raise ConfigError("path", "the source takes no path: name the member with option member")
            if k.lower() not in known:
                raise ConfigError(k, f"unknown option of the cg_member source (options: {', '.join(OPTIONS)})")
            values[known[k.lower()]] = v
        for name in ("stream", "group"):
            if not (values.get(name) or "").strip():
                raise ConfigError(name, "required")
            validate_name(name, values[name].strip())
        if values.get("member") and values.get("members"):
            raise ConfigError("members", "give member or members, not both")
        members = tuple(m.strip() for m in (values.get("members") or values.get("member") or "").split(",") if m.strip())
        if not members:
            raise ConfigError("member", "required (or members)")
        if len(set(members)) != len(members):
            raise ConfigError("members", "a member is named twice")
        for m in members:
            validate_name("member", m)
        start = (values.get("startingPosition") or "group").strip().lower()
        if start not in STARTS:
            raise ConfigError("startingPosition", f"must be one of {', '.join(STARTS)} (got {start!r})")
        servers = tuple(s.strip() for s in (values.get("servers") or "").split(",") if s.strip())
        for url in servers:
            parts = urlsplit(url if "://" in url else f"nats://{url}")
            if parts.username or parts.password:
                raise ConfigError("servers", "must not carry credentials (Spark shows its options): they reach the "
                                             "source through register(), e.g. from the CG_NATS_* environment")
        prefix = (values.get("jsPrefix") or "$JS.API").strip()
        if not prefix or any(c in prefix for c in " *>"):
            raise ConfigError("jsPrefix", "must be a subject prefix without spaces or wildcards")
        fail = (values.get("failOnDataLoss") or "true").strip().lower()
        if fail not in ("true", "false"):
            raise ConfigError("failOnDataLoss", f"must be true or false (got {values['failOnDataLoss']!r})")
        return cls(
            stream=values["stream"].strip(), group=values["group"].strip(), members=members,
            starting_position=start,
            max_messages=_positive("maxMessagesPerTrigger", values.get("maxMessagesPerTrigger"), int),  # type: ignore[arg-type]
            pin_timeout=_positive("pinTimeout", values.get("pinTimeout"), float) or 30.0,
            min_partitions=_positive("minPartitions", values.get("minPartitions"), int),  # type: ignore[arg-type]
            ack_wait=_positive("ackWait", values.get("ackWait"), float),
            servers=servers, js_prefix=prefix, fail_on_data_loss=fail == "true",
        )
