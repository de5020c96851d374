"""GroupOverflowSensor: wait until a consumer group (or one member) has enough work waiting."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSensorTimeout

from airflow_provider_cg.core.errors import ConfigError, ConsumerGroupError, GroupNotFound, ServerUnavailable
from airflow_provider_cg.core.groups.problems import describe as describe_problem
from airflow_provider_cg.hooks.nats import NatsHook
from airflow_provider_cg.triggers.overflow import (
    ONCE,
    GroupOverflowTrigger,
    check_thresholds,
    event_payload,
    exceeds,
    read_figures,
)

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from airflow_provider_cg.core.groups.status import GroupStatus

__all__ = ["GroupOverflowSensor"]


class GroupOverflowSensor(BaseSensorOperator):
    """Succeed once ``min_pending``, ``min_ack_pending`` or ``max_oldest_age`` is reached (any one; OR).

    Figures as in :mod:`airflow_provider_cg.triggers.overflow`; the event payload (pending,
    ack_pending, backlog, partitions, ...) is pushed to XCom in both modes.

    :param stream: the origin stream of the group.
    :param group: the consumer group.
    :param member: watch one member; ``None`` (default) watches the whole group.
    :param min_pending: messages waiting for delivery (int >= 1).
    :param min_ack_pending: messages delivered and not yet acknowledged (int >= 1).
    :param max_oldest_age: the oldest pending message older than this many seconds (> 0).
    :param nats_conn_id: Airflow connection of type ``nats``.
    :param deferrable: wait in the triggerer (default) instead of a worker slot. The
        trigger enforces ``timeout`` itself and it is also passed to ``defer``.

    :param max_failures: fail the task after this many polls in a row that cannot reach the
        server or are refused by it (default 5; each is logged), instead of waiting for
        ``timeout``; ``None`` keeps trying until ``timeout``.

    ``poke_interval`` (default 10 s), ``timeout``, ``soft_fail``, ``mode`` as for any
    sensor. A missing group or member fails the task (skipped with ``soft_fail``).
    """

    template_fields: Sequence[str] = ("stream", "group", "member", "nats_conn_id")
    ui_color = "#d9ead3"

    def __init__(
        self,
        *,
        stream: str,
        group: str,
        member: str | None = None,
        min_pending: int | None = None,
        min_ack_pending: int | None = None,
        max_oldest_age: float | None = None,
        nats_conn_id: str = NatsHook.default_conn_name,
        deferrable: bool = True,
        poke_interval: timedelta | float = 10,
        max_failures: int | None = 5,
        **kwargs: Any,
    ) -> None:
        seconds = poke_interval.total_seconds() if isinstance(poke_interval, timedelta) else poke_interval
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
            raise ConfigError("poke_interval", "must be a number of seconds > 0 (or a timedelta)")
        super().__init__(poke_interval=poke_interval, **kwargs)
        check_thresholds(min_pending, min_ack_pending, max_oldest_age)
        if max_failures is not None and (isinstance(max_failures, bool) or not isinstance(max_failures, int)
                                         or max_failures < 1):
            raise ConfigError("max_failures", "must be an integer >= 1 (or None)")
        self.max_failures = max_failures
        self._failures = 0
        if self.poke_interval <= 0:
            raise ConfigError("poke_interval", "must be > 0 seconds")
        self.stream = stream
        self.group = group
        self.member = member
        self.min_pending = min_pending
        self.min_ack_pending = min_ack_pending
        self.max_oldest_age = max_oldest_age
        self.nats_conn_id = nats_conn_id
        self.deferrable = deferrable

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        self.defer(
            trigger=GroupOverflowTrigger(
                stream=self.stream,
                group=self.group,
                member=self.member,
                min_pending=self.min_pending,
                min_ack_pending=self.min_ack_pending,
                max_oldest_age=self.max_oldest_age,
                poke_interval=self.poke_interval,
                nats_conn_id=self.nats_conn_id,
                mode=ONCE,
                deadline=time.time() + self.timeout,
                max_failures=self.max_failures,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Resume after the trigger fired: the payload to XCom, or fail / time out."""
        event = event or {}
        status = event.get("status")
        if status == "overflow":
            self._log_hit(event)
            return event
        if status == "timeout":
            raise AirflowSensorTimeout(
                f"Sensor has timed out after {self.timeout}s: the thresholds were not reached "
                f"(last figures: pending={event.get('pending')}, ack_pending={event.get('ack_pending')})"
            )
        if status == "error":
            raise AirflowFailException(event.get("error"))
        raise AirflowException(f"unexpected trigger event: {event!r}")

    @cached_property
    def hook(self) -> NatsHook:
        return NatsHook(nats_conn_id=self.nats_conn_id)

    def poke(self, context: Any) -> bool | PokeReturnValue:
        from airflow_provider_cg.hooks.nats import scrub

        hook = self.hook

        async def _read(nc: NATS) -> tuple[GroupStatus, dict[str, Any]]:
            return await read_figures(nc, self.stream, self.group, self.member, self.max_oldest_age)

        try:
            status, figures = hook.run(_read)
        except (ConfigError, GroupNotFound) as e:
            raise AirflowFailException(str(e)) from e
        except (ServerUnavailable, ConnectionError, ConsumerGroupError) as e:
            self._failures += 1
            message = scrub(str(e), hook.get_settings())
            if self.max_failures is not None and self._failures >= self.max_failures:
                raise AirflowFailException(f"{self._failures} polls in a row failed; the last: {message}") from None
            self.log.warning("Poll %s in a row failed, trying again: %s", self._failures, message)
            return False
        self._failures = 0
        self.log.info(
            "pending=%s ack_pending=%s backlog=%s oldest pending=%ss source lag=%s (min_pending=%s, "
            "min_ack_pending=%s, max_oldest_age=%s)", figures["pending"], figures["ack_pending"], figures["backlog"],
            figures.get("oldest_pending_age_s"), figures.get("source_lag"), self.min_pending, self.min_ack_pending,
            self.max_oldest_age,
        )
        if figures.get("source_stalled"):
            self.log.warning("its source is stalled: %s", figures["source_stalled"])
        for kind, found in sorted((figures.get("problems") or {}).items()):
            self.log.warning("%s", describe_problem(kind, found))
        if not exceeds(figures, self.min_pending, self.min_ack_pending, self.max_oldest_age):
            return False
        payload = event_payload(
            "overflow", self.stream, self.group, self.member, self.min_pending, self.min_ack_pending,
            figures, status.ts, max_oldest_age=self.max_oldest_age,
        )
        self._log_hit(payload)
        return PokeReturnValue(is_done=True, xcom_value=payload)

    def _log_hit(self, event: dict[str, Any]) -> None:
        self.log.info(
            "Threshold reached: pending=%s ack_pending=%s backlog=%s",
            event.get("pending"), event.get("ack_pending"), event.get("backlog"),
        )
