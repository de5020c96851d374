"""Errors of the consumer-group core. Messages name the field and the rule; never a secret."""

from __future__ import annotations

__all__ = [
    "ConsumerGroupError",
    "ConfigError",
    "GroupNotFound",
    "JetStreamApiError",
    "ServerUnavailable",
    "NatsConnectError",
    "StoredConfigInvalid",
]


class ConsumerGroupError(Exception):
    """Base class of every error raised by the core."""


class ConfigError(ConsumerGroupError, ValueError):
    """Invalid input. ``field`` names the offending field, ``rule`` the rule it breaks."""

    def __init__(self, field: str, rule: str) -> None:
        self.field = field
        self.rule = rule
        super().__init__(f"{field}: {rule}")


class GroupNotFound(ConsumerGroupError, LookupError):
    """The consumer group does not exist on the stream (in neither kind's KV bucket)."""

    def __init__(self, stream: str, group: str) -> None:
        self.stream, self.group = stream, group
        super().__init__(f"consumer group {group!r} on stream {stream!r} does not exist")


class JetStreamApiError(ConsumerGroupError):
    """The JetStream API refused a request (``code`` HTTP-like status, ``err_code`` JS code)."""

    def __init__(self, code: int, err_code: int, description: str, subject: str = "") -> None:
        self.code, self.err_code, self.description, self.subject = code, err_code, description, subject
        where = f" ({subject})" if subject else ""
        super().__init__(f"JetStream API error {code}/{err_code}: {description}{where}")


class ServerUnavailable(ConsumerGroupError, ConnectionError):
    """The server could not be reached or did not answer in time."""


class NatsConnectError(ServerUnavailable):
    """Connecting to NATS failed. ``reason`` says why: ``auth`` (the server refused the
    credentials), ``tls`` (verification or handshake failed), ``unreachable`` (refused, no
    route, unknown host) or ``timeout``. The message names the servers, never a secret."""

    REASONS = {
        "auth": "authentication refused by",
        "tls": "TLS verification or handshake failed with",
        "unreachable": "cannot reach",
        "timeout": "timed out connecting to",
    }

    def __init__(self, reason: str, servers: str, detail: str = "") -> None:
        self.reason, self.servers, self.detail = reason, servers, detail
        super().__init__(f"{self.REASONS[reason]} NATS at {servers}" + (f" ({detail})" if detail else ""))


class StoredConfigInvalid(ConfigError):
    """The config stored for a group breaks the rules (written by hand or by another tool)."""

    def __init__(self, stream: str, group: str, kind: str, cause: ConfigError) -> None:
        self.stream, self.group, self.kind, self.cause = stream, group, kind, cause
        super().__init__(
            "config",
            f"the stored {kind} config of group {group!r} on stream {stream!r} is invalid ({cause.field}: "
            f"{cause.rule}); fix it, or remove it with `cg rm {stream} {group} --force --kind {kind}`",
        )
