"""Submit a user's Spark Structured Streaming application for one member of a group.

The application reads its member through the ``cg_member`` source (``core/streaming/``) and
is the user's: its queries, state, checkpoint and sink. The operator gives it what the
landing tasks get: the NATS connection as the driver's private environment (``CG_NATS_*``,
never an argument or a Spark property; the source's ``register(spark)`` reads it), the
credentials of the tables it writes (``aws_conn_id``, ``pg_conn_id``, ``iceberg_conn_id``), the
provider's core on ``--py-files``, and its member as ``CG_STREAM``, ``CG_GROUP`` and
``CG_MEMBER`` (``member_options()`` reads them). One task per member, mapped over
``ConsumerGroupMembersOperator``'s output as the landing tasks are::

    members = ConsumerGroupMembersOperator(task_id="members", stream="ORDERS", group="lake")
    ConsumerGroupStreamingAppOperator.partial(
        task_id="windows", stream="ORDERS", group="lake", application="/apps/windows.py",
    ).expand_kwargs(members.output)

The task runs as long as the application does: an available-now query ends when the member's
backlog is landed (a bounded run, like the landing tasks'); a processing-time one runs until
stopped (``application_args`` can bound it). A failed application fails the task; its retries
restart it from its checkpoint, exactly once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from airflow_provider_cg.core.errors import ConfigError, GroupNotFound
from airflow_provider_cg.core.groups import names as groupnames
from airflow_provider_cg.core.groups.lag import member_backlog
from airflow_provider_cg.core.tools.packaging import build_core_zip
from airflow_provider_cg.hooks import spark_submit
from airflow_provider_cg.hooks.nats import NatsHook
from airflow_provider_cg.operators.members import SETTLE_TIMEOUT, UI_COLOR, member_states, settled_states
from airflow_provider_cg.operators.spark import SPARK_SUBMIT_OPTIONS, _cache_dir

if TYPE_CHECKING:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

__all__ = ["ConsumerGroupStreamingAppOperator"]

#: the table kinds whose credentials the application may need, by the connection that gives them
_SINK_OF = {"pg_conn_id": "postgres", "iceberg_conn_id": "iceberg"}


class ConsumerGroupStreamingAppOperator(BaseOperator):
    """``spark-submit`` a user's streaming ``application`` for one member (see the module doc).

    :param application: the application's file (templated), e.g. one of ``spark_apps``.
    :param application_args: its arguments (templated); never put a secret here.
    :param stream: the group's origin stream; ``group``; ``member``: the member it reads as.
    :param nats_conn_id: Airflow ``nats`` connection (reaches the driver as ``CG_NATS_*``).
    :param conn_id: Spark connection (its host is the master).
    :param aws_conn_id: ``aws`` connection of tables on S3-compatible storage (``AWS_*``).
    :param pg_conn_id: ``postgres`` connection (``CG_PG_DSN``); ``iceberg_conn_id``: a REST
        catalog (``CG_ICEBERG_CATALOG_*``).
    :param check_backlog: skip without starting Spark while the member has nothing to read (for
        an application whose query runs available-now, as example DAG 7's; off by default: a
        long-running query waits for what comes).
    :param settle_timeout: before skipping an elastic group's member for an empty backlog, wait
        up to this long for its work queue to catch up with the origin stream.
    :param partitions: informational (from the fan-out); ``backlog`` likewise.
    :param env_vars: extra driver environment (not secrets: use connections for those).

    The ``spark-submit`` options of the Spark provider's ``SparkSubmitHook`` (``conf``,
    ``packages``, ``py_files``, ``jars``, ``driver_memory``, ...) are passed through. Returns
    ``{"stream", "group", "member", "application", "result": "finished"}``.
    """

    template_fields: Sequence[str] = ("application", "application_args", "stream", "group", "member", "conf",
                                      "packages", "py_files", "env_vars", "name")
    template_fields_renderers = {"conf": "py", "env_vars": "py"}
    ui_color = UI_COLOR

    def __init__(self, *, application: str, stream: str, group: str, member: str,
                 application_args: Sequence[str] | None = None, nats_conn_id: str = NatsHook.default_conn_name,
                 conn_id: str = "spark_default", aws_conn_id: str | None = None, pg_conn_id: str | None = None,
                 iceberg_conn_id: str | None = None, check_backlog: bool = False,
                 settle_timeout: float = SETTLE_TIMEOUT, partitions: Sequence[int] | None = None,
                 backlog: int | None = None, env_vars: dict[str, str] | None = None,
                 properties_file: str | None = None, name: str | None = None,
                 # the SparkSubmitHook's options (SPARK_SUBMIT_OPTIONS), named: Airflow's partial() checks names
                 conf: dict[str, Any] | None = None, files: str | None = None, py_files: str | None = None,
                 archives: str | None = None, jars: str | None = None, packages: str | None = None,
                 exclude_packages: str | None = None, repositories: str | None = None,
                 driver_class_path: str | None = None, driver_memory: str | None = None,
                 executor_memory: str | None = None, executor_cores: int | None = None,
                 total_executor_cores: int | None = None, num_executors: int | None = None,
                 keytab: str | None = None, principal: str | None = None, proxy_user: str | None = None,
                 verbose: bool | None = None, spark_binary: str | None = None, deploy_mode: str | None = None,
                 yarn_queue: str | None = None, status_poll_interval: int | None = None, **kwargs: Any) -> None:
        given = dict(locals())
        spark_options = {k: given[k] for k in SPARK_SUBMIT_OPTIONS}
        super().__init__(**kwargs)
        self.application, self.application_args = application, list(application_args or [])
        self.stream, self.group, self.member = stream, group, member
        self.nats_conn_id, self.conn_id = nats_conn_id, conn_id
        self.aws_conn_id, self.pg_conn_id, self.iceberg_conn_id = aws_conn_id, pg_conn_id, iceberg_conn_id
        self.check_backlog, self.settle_timeout = check_backlog, settle_timeout
        self.partitions = list(partitions) if partitions is not None else None
        self.backlog = backlog
        self.env_vars, self.properties_file = env_vars, properties_file
        self.name = name or "cg-stream"
        for option in SPARK_SUBMIT_OPTIONS:
            setattr(self, option, spark_options.get(option))
        self._spark_hook: SparkSubmitHook | None = None
        for field in ("stream", "group", "member"):
            value = getattr(self, field)
            if isinstance(value, str) and "{{" not in value:
                groupnames.validate_name(field, value, field)

    @cached_property
    def hook(self) -> NatsHook:
        return NatsHook(nats_conn_id=self.nats_conn_id)

    def _checked(self) -> None:
        for field in ("stream", "group", "member"):
            groupnames.validate_name(field, getattr(self, field), field)
        if not isinstance(self.application, str) or not self.application.strip():
            raise ConfigError("application", "required: the application's file")
        _, mode = spark_submit.spark_master(self.conn_id, getattr(self, "deploy_mode", None))
        if mode == "client" and not os.path.isfile(self.application):
            raise ConfigError("application", f"no such file here: {self.application}")

    def execute(self, context: Any) -> dict[str, Any]:
        try:
            self._checked()
            if self.check_backlog:
                self._skip_without_backlog()
        except (ConfigError, GroupNotFound) as e:
            raise AirflowFailException(str(e)) from e
        secrets = self.hook.get_settings().to_env()  # registers masks
        given = {"pg_conn_id": self.pg_conn_id, "iceberg_conn_id": self.iceberg_conn_id}
        sinks = [kind for param, kind in _SINK_OF.items() if given[param]]
        secrets.update(spark_submit.sink_env(sinks, pg_conn_id=self.pg_conn_id, iceberg_conn_id=self.iceberg_conn_id,
                                             aws_conn_id=self.aws_conn_id))
        env = {**(self.env_vars or {}), "CG_STREAM": self.stream, "CG_GROUP": self.group, "CG_MEMBER": self.member}
        options = {k: getattr(self, k) for k in SPARK_SUBMIT_OPTIONS if getattr(self, k) is not None}
        options.pop("deploy_mode", None)
        core = str(build_core_zip(_cache_dir() / "cg_core.zip"))
        options["py_files"] = ",".join([core, *(p for p in (options.get("py_files") or "").split(",") if p)])
        if self.name == "cg-stream":
            self.name = f"cg-stream-{self.stream}-{self.group}-{self.member}"
        try:
            hook, props = spark_submit.submit_hook(
                conn_id=self.conn_id, deploy_mode=getattr(self, "deploy_mode", None), secrets=secrets, env_vars=env,
                properties_file=self.properties_file, application_args=self.application_args, name=self.name,
                **options)
        except ConfigError as e:
            raise AirflowFailException(str(e)) from e
        self._spark_hook = hook
        try:
            hook.submit(self.application)
        finally:
            if props:
                with contextlib.suppress(OSError):
                    os.unlink(props)
        return {"stream": self.stream, "group": self.group, "member": self.member, "application": self.application,
                "result": "finished"}

    def _skip_without_backlog(self) -> None:
        """``check_backlog``: skip (no Spark) while the member has nothing to read."""
        status = member_states(self.hook, self.stream, self.group)
        backlog = _backlog(status, self.member)
        if backlog == 0 and self.settle_timeout > 0:  # the work queue may still be catching up
            backlog = _backlog(settled_states(self.hook, self.stream, self.group, self.settle_timeout), self.member)
        if backlog == 0:
            raise AirflowSkipException(f"member {self.member} has no backlog: Spark not started")
        self.log.info("member %s: backlog %d: starting the application", self.member, backlog)

    def on_kill(self) -> None:
        if self._spark_hook is not None:
            self._spark_hook.on_kill()


def _backlog(status: Any, member: str) -> int:
    m = {m.member: m for m in status.members}.get(member)
    if m is None or not m.in_membership:
        raise ConfigError("member", f"{member!r} is not a member of the group")
    return member_backlog(status, m)

