"""Spark batch consumption of a consumer group: one mapped spark-submit per member.

``ConsumerGroupMembersOperator`` returns one dict per member (``member``, ``partitions``,
``backlog``) for ``ConsumerGroupSparkSubmitOperator.partial(...).expand_kwargs(...)``; each
mapped task runs ``airflow_provider_cg/spark_apps/cg_member_job.py`` for its member, unless the member has no
backlog (then it is skipped without starting Spark)::

    members = ConsumerGroupMembersOperator(task_id="members", stream="ORDERS", group="lake")
    ConsumerGroupSparkSubmitOperator.partial(
        task_id="consume", stream="ORDERS", group="lake", sink_path="/data/lake/orders",
    ).expand_kwargs(members.output)

Secrets (the NATS connection's password/token/keys, the PostgreSQL DSN) never appear in the
spark-submit command line, the rendered template fields or XCom: in local and client mode
they reach the driver as process environment (``CG_NATS_*``, ``CG_PG_DSN``); for YARN and
Kubernetes masters they go into a 0600 properties file (``spark.yarn.appMasterEnv.*`` /
``spark.kubernetes.driverEnv.*``) that is deleted after the submit; a ``properties_file``
you pass is copied into it (Spark then skips ``spark-defaults.conf``, as with any
``--properties-file``). Standalone cluster deploy mode is refused (no private channel).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from airflow_provider_cg.core import config as cgconfig
from airflow_provider_cg.core.decode import FORMATS as PAYLOAD_FORMATS
from airflow_provider_cg.core.decode import SPARK_AVRO_PACKAGE, parse_avro_schema
from airflow_provider_cg.core.errors import ConfigError, GroupNotFound
from airflow_provider_cg.core.packaging import build_core_zip, member_job_path, ship_module

SKIP_RESULTS = frozenset({"empty", "not-pinned", "revoked"})
SINKS = ("parquet", "postgres")
_MAVEN_COORDINATE = re.compile(r"[A-Za-z0-9_.-]+:[A-Za-z0-9_.-]+:[A-Za-z0-9_.+-]+")
UI_COLOR = "#fce5cd"
CACHE_ENV = "CG_SPARK_CACHE_DIR"


def _templated(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _cache_dir() -> Path:
    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("AIRFLOW_HOME") or tempfile.gettempdir(), "cg_spark_cache"
    )
    return Path(base)


def _member_states(nats_conn_id: str, stream: str, group: str) -> Any:
    """``ConsumerGroups.status`` of the group (one connection)."""
    from airflow_provider_cg.core.groups import ConsumerGroups
    from airflow_provider_cg.hooks.nats import NatsHook

    async def go(nc):
        return await ConsumerGroups(nc).status(stream, group)

    return NatsHook(nats_conn_id=nats_conn_id).run(go)


def member_backlog(status: Any, member: Any) -> int:
    """Messages waiting for ``member``: its partitions' stored messages for an elastic group
    (the work queue holds only unacked ones), its consumer's pending + ack pending for a
    static group (the whole partition count while the consumer does not exist yet)."""
    if status.kind == "static" and member.consumer_exists:
        return int(member.num_pending + member.num_ack_pending)
    return int(member.backlog)


def _settled_states(nats_conn_id: str, stream: str, group: str, settle_timeout: float) -> Any:
    """``_member_states``; for an elastic group, first wait (at most ``settle_timeout``) until
    its work queue has caught up with the origin stream: source lag 0 and the size unchanged
    for 0.5 s. (Sourcing is asynchronous: right after a publish the lag can still read 0.)"""
    status = _member_states(nats_conn_id, stream, group)
    deadline = time.monotonic() + settle_timeout
    while status.kind == "elastic" and time.monotonic() < deadline:
        time.sleep(0.5)
        again = _member_states(nats_conn_id, stream, group)
        settled = again.source_lag in (0, None) and again.backlog == status.backlog
        status = again
        if settled:
            break
    return status


def member_fanout(
    stream: str, group: str, nats_conn_id: str = "nats_default", settle_timeout: float = 0.0
) -> list[dict[str, Any]]:
    """``[{"member", "partitions", "backlog"}, ...]`` for the group's current members (sync).

    ``settle_timeout`` > 0: first wait (at most that long) until an elastic group's work
    queue has caught up with the origin stream (source lag 0, size unchanged for 0.5 s), so
    the backlogs are complete right after the group was created or messages published.
    """
    status = _settled_states(nats_conn_id, stream, group, settle_timeout)
    return [
        {"member": m.member, "partitions": list(m.partitions), "backlog": member_backlog(status, m)}
        for m in status.members
        if m.in_membership and m.partitions
    ]


class ConsumerGroupMembersOperator(BaseOperator):
    """Return one dict per member (``member``, ``partitions``, ``backlog``) to map over.

    Members without partitions (more members than partitions) are left out; so is any
    consumer not in the membership. ``only_with_backlog=True`` also drops idle members.
    """

    template_fields: Sequence[str] = ("stream", "group", "nats_conn_id")
    ui_color = UI_COLOR

    def __init__(
        self,
        *,
        stream: str,
        group: str,
        nats_conn_id: str = "nats_default",
        only_with_backlog: bool = False,
        settle_timeout: float = 30.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.stream, self.group, self.nats_conn_id = stream, group, nats_conn_id
        self.only_with_backlog = only_with_backlog
        self.settle_timeout = settle_timeout
        for field in ("stream", "group"):
            if not _templated(getattr(self, field)):
                cgconfig.validate_name(field, getattr(self, field), field)

    def execute(self, context: Any) -> list[dict[str, Any]]:
        try:
            cgconfig.validate_name("stream", self.stream, "stream")
            cgconfig.validate_name("group", self.group, "group")
            members = member_fanout(self.stream, self.group, self.nats_conn_id, self.settle_timeout)
        except (ConfigError, GroupNotFound) as e:
            raise AirflowFailException(str(e)) from e
        if self.only_with_backlog:
            members = [m for m in members if m["backlog"] > 0]
        for m in members:
            self.log.info("member %s: partitions %s, backlog %d", m["member"], m["partitions"], m["backlog"])
        return members


SPARK_SUBMIT_OPTIONS = (
    "conf", "files", "py_files", "archives", "jars", "packages", "exclude_packages", "repositories",
    "driver_class_path", "driver_memory", "executor_memory", "executor_cores", "total_executor_cores",
    "num_executors", "keytab", "principal", "proxy_user", "verbose", "spark_binary", "deploy_mode",
    "yarn_queue", "status_poll_interval",
)


class ConsumerGroupSparkSubmitOperator(BaseOperator):
    """Land one member's backlog into a sink with ``spark-submit cg_member_job.py``.

    :param stream: origin stream of the group.
    :param group: consumer group.
    :param member: the member this task consumes as (it must hold or win the pin).
    :param sink: ``"parquet"`` (``sink_path``) or ``"postgres"`` (``pg_conn_id``, ``pg_table``).
    :param sink_path: Parquet lake directory (visible to the driver).
    :param pg_table: target table of the PostgreSQL sink.
    :param pg_conn_id: Airflow ``postgres`` connection; its DSN reaches the driver as
        ``CG_PG_DSN`` (never an argument).
    :param payload_format: ``raw`` | ``text`` | ``json`` (``json_schema``: Spark DDL) |
        ``avro`` (``avro_schema``: the JSON of an Avro record schema; payloads are binary
        Avro datums). Spark decodes them in its tasks; bad payloads go to the dead-letter stream.
    :param avro_package: the Maven coordinates of Spark's Avro package, added to
        ``packages`` for ``avro`` payloads (default ``SPARK_AVRO_PACKAGE``: give the one of
        your cluster's Spark version).
    :param transform: your transformation, ``package.module:function``: called in the Spark
        driver with each batch as a DataFrame (one row per message, decoded payload in
        ``value`` / ``payload_text``) and a ``BatchContext``; returns the DataFrame to land.
        Its top-level package (or module) must be importable here; the operator ships it with
        ``--py-files``. Named by the DAG author only (not templated, never read from a
        connection). Each message's effect lands once, whatever the transformation does.
    :param transform_sql: or a Spark SQL statement over the temporary view ``batch`` (templated).
    :param batch_size: messages per two-phase batch.
    :param max_messages: stop after this many messages (also ``max_bytes``, ``max_seconds``).
    :param standby_timeout: seconds to wait for the pin before ending ``not-pinned``.
    :param ack_wait: ack wait (s) of a member consumer the job creates; ``None``: orbit's
        default for elastic groups (5 s), 60 s for static ones. An existing consumer is used
        as it is. ``max_deliver``, ``idle_timeout`` as the job's.
    :param partitions: informational (from the fan-out); ``backlog`` likewise.
    :param check_backlog: skip without starting Spark when the member has nothing to read.
    :param settle_timeout: before skipping an elastic group's member for an empty backlog,
        wait up to this long for the work queue to catch up with the origin stream.
    :param backfill_start: with ``backfill_end`` (ISO 8601, templated, e.g.
        ``"{{ data_interval_start }}"``): backfill mode. The job re-reads the origin stream's
        messages of ``[backfill_start, backfill_end)`` into the sink (``core/backfill.py``);
        ``member``, pinning and the backlog check do not apply.
    :param nats_conn_id: Airflow ``nats`` connection.
    :param conn_id: Spark connection (its host is the master, e.g. ``local[*]``).
    :param env_vars: extra driver environment (not secrets: use connections for those).
    :param properties_file: a Spark properties file to start from.
    :param conf, packages, py_files, files, jars, driver_memory, executor_memory, ...: the
        ``spark-submit`` options of the Spark provider's ``SparkSubmitHook``, passed through.

    Submits through the Spark provider's public ``SparkSubmitHook``. Returns the job's
    summary (result, committed, partitions, ...) as the task's only XCom, also when the task
    is then skipped (result ``empty``, ``not-pinned`` or ``revoked``). With a YARN/Kubernetes
    cluster-mode driver the summary stays with the driver: the result is ``submitted``.
    """

    template_fields: Sequence[str] = (
        "stream", "group", "member", "backfill_start", "backfill_end", "sink", "sink_path", "pg_table",
        "pg_conn_id", "payload_format", "json_schema", "avro_schema", "avro_package", "transform_sql", "batch_size", "max_messages", "max_bytes",
        "max_seconds", "standby_timeout", "ack_wait", "max_deliver", "idle_timeout", "nats_conn_id",
        "conn_id", "name", "conf", "packages", "py_files", "files", "jars", "env_vars", "properties_file",
        "driver_memory", "executor_memory", "deploy_mode",
    )
    template_fields_renderers = {"conf": "py", "env_vars": "py"}
    ui_color = UI_COLOR

    def __init__(
        self,
        *,
        stream: str,
        group: str,
        member: str | None = None,
        sink: str = "parquet",
        sink_path: str | None = None,
        pg_table: str = "cg_events",
        pg_conn_id: str | None = None,
        payload_format: str = "raw",
        json_schema: str | None = None,
        avro_schema: str | None = None,
        avro_package: str = SPARK_AVRO_PACKAGE,
        transform: str | None = None,
        transform_sql: str | None = None,
        batch_size: int | str = 100_000,
        max_messages: int | str | None = None,
        max_bytes: int | str | None = None,
        max_seconds: float | str | None = None,
        standby_timeout: float | str = 30.0,
        ack_wait: float | str | None = None,
        max_deliver: int | str = 5,
        idle_timeout: float | str = 2.0,
        partitions: Sequence[int] | None = None,
        backlog: int | None = None,
        check_backlog: bool = True,
        settle_timeout: float = 5.0,
        nats_conn_id: str = "nats_default",
        conn_id: str = "spark_default",
        name: str | None = None,
        backfill_start: str | None = None,
        backfill_end: str | None = None,
        env_vars: dict[str, str] | None = None,
        properties_file: str | None = None,
        **kwargs: Any,
    ) -> None:
        for field in ("application", "application_args"):
            if field in kwargs:
                raise ConfigError(field, "is set by the operator (use the member job's options instead)")
        spark_options = {k: kwargs.pop(k) for k in list(kwargs) if k in SPARK_SUBMIT_OPTIONS}
        super().__init__(**kwargs)
        self.stream, self.group, self.member = stream, group, member
        self.backfill_start, self.backfill_end = backfill_start, backfill_end
        self.sink, self.sink_path, self.pg_table, self.pg_conn_id = sink, sink_path, pg_table, pg_conn_id
        self.payload_format, self.json_schema = payload_format, json_schema
        self.avro_schema, self.avro_package = avro_schema, avro_package
        self.transform, self.transform_sql = transform, transform_sql
        self.batch_size, self.max_messages, self.max_bytes, self.max_seconds = (
            batch_size, max_messages, max_bytes, max_seconds,
        )
        self.standby_timeout, self.ack_wait, self.max_deliver = standby_timeout, ack_wait, max_deliver
        self.idle_timeout = idle_timeout
        self.partitions = list(partitions) if partitions is not None else None
        self.backlog = backlog
        self.check_backlog, self.settle_timeout = check_backlog, settle_timeout
        self.nats_conn_id, self.conn_id = nats_conn_id, conn_id
        self.name = name or "cg-member"
        self.env_vars, self.properties_file = env_vars, properties_file
        for option in SPARK_SUBMIT_OPTIONS:
            setattr(self, option, spark_options.get(option))
        self._hook: SparkSubmitHook | None = None
        self.validate(rendered=False)

    # --- arguments ---------------------------------------------------------------------

    def validate(self, rendered: bool = True) -> None:
        """Check every option (templated strings only once rendered, then also convert
        rendered numbers); ``ConfigError(field, ...)``."""

        def ready(v: Any) -> bool:
            return rendered or not _templated(v)

        if bool(self.backfill_start) != bool(self.backfill_end):
            raise ConfigError("backfill_end" if self.backfill_start else "backfill_start",
                              "backfill_start and backfill_end go together")
        if not self.backfill and not self.member:
            raise ConfigError("member", "required (unless backfill_start/backfill_end are given)")
        for field, kind in (("stream", "stream"), ("group", "group"), ("member", "member")):
            if field == "member" and self.backfill:
                continue
            if ready(getattr(self, field)):
                cgconfig.validate_name(field, getattr(self, field), kind)
        if ready(self.sink) and self.sink not in SINKS:
            raise ConfigError("sink", f"must be one of {', '.join(SINKS)}")
        if ready(self.payload_format) and self.payload_format not in PAYLOAD_FORMATS:
            raise ConfigError("payload_format", f"must be one of {', '.join(PAYLOAD_FORMATS)}")
        if ready(self.sink) and self.sink == "parquet" and not self.sink_path:
            raise ConfigError("sink_path", "required for the parquet sink")
        if ready(self.sink) and self.sink == "postgres" and not self.pg_conn_id:
            raise ConfigError("pg_conn_id", "required for the postgres sink")
        if ready(self.payload_format) and self.payload_format == "json" and not self.json_schema:
            raise ConfigError("json_schema", "required when payload_format is json")
        if ready(self.payload_format) and self.payload_format == "avro":
            if not self.avro_schema:
                raise ConfigError("avro_schema", "required when payload_format is avro")
            if ready(self.avro_schema):
                try:
                    parse_avro_schema(self.avro_schema)
                except ConfigError as e:
                    raise ConfigError("avro_schema", e.rule) from None
            if ready(self.avro_package) and not _MAVEN_COORDINATE.fullmatch(str(self.avro_package or "")):
                raise ConfigError("avro_package", "must be Maven coordinates group:artifact:version")
        if self.transform is not None:
            from airflow_provider_cg.core.transform import parse_spec

            if self.transform_sql is not None:
                raise ConfigError("transform", "give transform or transform_sql, not both")
            parse_spec(self.transform)

        for field in ("batch_size", "max_messages", "max_bytes", "max_deliver"):
            if ready(getattr(self, field)):
                setattr(self, field, _number(field, getattr(self, field), int, "a positive integer"))
        for field in ("max_seconds", "standby_timeout", "ack_wait", "idle_timeout"):
            if ready(getattr(self, field)):
                setattr(self, field, _number(field, getattr(self, field), float, "a positive number of seconds"))
        v = self.settle_timeout
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            raise ConfigError("settle_timeout", "must be a number of seconds >= 0")

    @property
    def backfill(self) -> bool:
        return bool(self.backfill_start or self.backfill_end)

    def job_args(self) -> list[str]:
        """The member job's command-line options (nothing secret)."""
        if self.backfill:
            who = ["--backfill-start", str(self.backfill_start), "--backfill-end", str(self.backfill_end)]
        else:
            who = ["--member", self.member]
        args = ["--stream", self.stream, "--group", self.group, *who, "--sink", self.sink]
        if self.sink == "parquet":
            args += ["--sink-path", str(self.sink_path)]
        else:
            args += ["--pg-table", self.pg_table]
        args += ["--payload-format", self.payload_format]
        if self.json_schema and self.payload_format == "json":
            args += ["--json-schema", self.json_schema]
        if self.avro_schema and self.payload_format == "avro":
            args += ["--avro-schema", self.avro_schema]
        if self.transform:
            args += ["--transform", self.transform]
        if self.transform_sql:
            args += ["--transform-sql", self.transform_sql]
        for field in ("batch_size", "max_messages", "max_bytes", "max_seconds", "standby_timeout",
                      "ack_wait", "max_deliver", "idle_timeout"):
            v = getattr(self, field)
            if v is not None:
                args += ["--" + field.replace("_", "-"), _plain(v)]
        return args

    # --- secrets -------------------------------------------------------------------------

    def _secrets(self) -> dict[str, str]:
        from airflow_provider_cg.hooks.nats import NatsHook

        env = NatsHook(nats_conn_id=self.nats_conn_id).get_settings().to_env()  # registers masks
        if self.sink == "postgres":
            env["CG_PG_DSN"] = _pg_dsn(self.pg_conn_id)
        return env

    def _submit_hook(self, args: list[str], secrets: dict[str, str]) -> tuple[SparkSubmitHook, str | None]:
        """A ``SparkSubmitHook`` (public constructor only) that carries the secrets as process
        environment (local/client mode) or in a private 0600 properties file (YARN and
        Kubernetes: their drivers get ``spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*``).
        Returns the hook and the properties file to delete afterwards."""
        master, deploy_mode = spark_master(self.conn_id, self.deploy_mode)
        env = dict(self.env_vars or {})
        props = None
        if master.startswith(("yarn", "k8s://")):
            prefix = "spark.yarn.appMasterEnv." if master.startswith("yarn") else "spark.kubernetes.driverEnv."
            props = _write_properties(self.properties_file, {prefix + k: v for k, v in secrets.items()})
        elif deploy_mode == "cluster":
            raise AirflowFailException(
                "deploy_mode: Spark standalone cluster mode cannot pass the NATS credentials privately; "
                "use client mode"
            )
        else:  # Popen environment of spark-submit, inherited by the driver it starts here
            env.update(secrets)
        options = {k: getattr(self, k) for k in SPARK_SUBMIT_OPTIONS if getattr(self, k) is not None}
        options["conf"] = with_redaction(options.get("conf"))
        if self.payload_format == "avro":
            packages = [p for p in (options.get("packages") or "").split(",") if p]
            if not any(p.split(":")[:2] == self.avro_package.split(":")[:2] for p in packages):
                options["packages"] = ",".join([*packages, self.avro_package])
        hook = SparkSubmitHook(
            conn_id=self.conn_id,
            application_args=args,
            env_vars=env or None,
            properties_file=props or self.properties_file,
            name=self.name,
            **options,
        )
        return hook, props

    # --- run -----------------------------------------------------------------------------

    def execute(self, context: Any) -> dict[str, Any]:
        try:
            self.validate()
            if self.check_backlog and not self.backfill:
                self._check_backlog(context)
        except (ConfigError, GroupNotFound) as e:
            raise AirflowFailException(str(e)) from e
        zip_path = build_core_zip(_cache_dir() / "cg_core.zip")
        shipped = [str(zip_path)]
        if self.transform:
            from airflow_provider_cg.core.transform import parse_spec

            try:
                dag_file = getattr(getattr(self, "dag", None), "fileloc", None)
                near = [os.path.dirname(dag_file)] if dag_file else []
                shipped.append(str(ship_module(parse_spec(self.transform)[0], _cache_dir(), near)))
            except ConfigError as e:
                raise AirflowFailException(str(e)) from e
        others = [p for p in (self.py_files or "").split(",") if p and p not in shipped]
        self.py_files = ",".join([*shipped, *others])
        if self.name == "cg-member":
            self.name = f"cg-{self.stream}-{self.group}-{self.member or 'backfill'}"
        with tempfile.TemporaryDirectory(prefix="cg-summary-") as tmp:
            summary_file = os.path.join(tmp, "summary.json")
            hook, props = self._submit_hook([*self.job_args(), "--summary-file", summary_file], self._secrets())
            self._hook = hook
            try:
                hook.submit(str(member_job_path()))
            finally:
                if props:
                    with contextlib.suppress(OSError):
                        os.unlink(props)
            summary = _read_summary(summary_file)
        if summary is None:
            summary = {"stream": self.stream, "group": self.group, "member": self.member, "result": "submitted"}
            self.log.warning("No summary from the driver (a cluster-mode driver keeps it): result 'submitted'")
        self.log.info(
            "member %s: %s, %s rows committed in %s batches (%s)", self.member, summary.get("result"),
            summary.get("committed"), summary.get("batches"), summary.get("stop_reason", ""),
        )
        if summary.get("result") in SKIP_RESULTS:
            _push_summary(context, summary)
            raise AirflowSkipException(
                f"member {self.member}: {summary['result']} ({summary.get('stop_reason') or 'nothing consumed'})"
            )
        return summary

    def on_kill(self) -> None:
        if self._hook is not None:
            self._hook.on_kill()

    def _check_backlog(self, context: Any) -> None:
        status = _member_states(self.nats_conn_id, self.stream, self.group)
        m, backlog = self._own_backlog(status)
        if backlog == 0 and self.settle_timeout > 0:
            # Nothing yet: the work queue may still be catching up with a fresh publish.
            m, backlog = self._own_backlog(
                _settled_states(self.nats_conn_id, self.stream, self.group, self.settle_timeout)
            )
        if backlog == 0:
            summary = {"stream": self.stream, "group": self.group, "member": self.member, "result": "empty",
                       "committed": 0, "partitions": {}, "stop_reason": "no backlog: Spark not started"}
            _push_summary(context, summary)
            raise AirflowSkipException(
                f"member {self.member} (partitions {m.partitions}) has no backlog: Spark not started"
            )
        self.log.info("member %s: partitions %s, backlog %d: starting Spark", self.member, m.partitions, backlog)

    def _own_backlog(self, status: Any) -> tuple[Any, int]:
        m = {m.member: m for m in status.members}.get(self.member)
        if m is None or not m.in_membership:
            raise ConfigError("member", f"{self.member!r} is not a member of group {self.group!r}")
        return m, member_backlog(status, m)


SPARK_DEFAULT_REDACTION = r"(?i)secret|password|token|access[.]key"
#: the names the member job's secrets travel under (spark.*Env.CG_NATS_CREDS, ..._NKEY_SEED,
#: ..._TLS_KEY, CG_PG_DSN): Spark's default pattern matches none of them
CG_REDACTION = r"(?i)CG_NATS_|CG_PG_DSN"


def with_redaction(conf: dict[str, Any] | None) -> dict[str, Any]:
    """``conf`` with ``spark.redaction.regex`` extended so the Spark UI, event logs and
    ``spark-submit --verbose`` redact the member job's secret properties too."""
    out = dict(conf or {})
    base = out.get("spark.redaction.regex") or SPARK_DEFAULT_REDACTION
    if CG_REDACTION not in base:
        out["spark.redaction.regex"] = f"(?:{base})|{CG_REDACTION}"
    return out


def _number(field: str, value: Any, kind: type, rule: str) -> Any:
    """``value`` (a number, or a rendered template string) as ``kind`` if it is > 0; ``None`` stays."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = kind(value.strip())
        except ValueError:
            raise ConfigError(field, f"must be {rule} (got {value!r})") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 or value != value:
        raise ConfigError(field, f"must be {rule}")
    if kind is int and value != int(value):
        raise ConfigError(field, f"must be {rule}")
    return kind(value) if kind is int else value


def _plain(v: Any) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def spark_master(conn_id: str, deploy_mode: str | None = None) -> tuple[str, str]:
    """``(master, deploy mode)`` of a Spark connection, as the Spark provider reads them: the
    host (plus ``:port``) is the master, ``deploy-mode`` in the extras unless given here."""
    try:
        from airflow.sdk import BaseHook
    except ImportError:  # pragma: no cover
        from airflow.hooks.base import BaseHook  # type: ignore[no-redef]
    conn = BaseHook.get_connection(conn_id)
    master = conn.host or "yarn"
    if conn.port:
        master = f"{master}:{conn.port}"
    mode = deploy_mode or (conn.extra_dejson or {}).get("deploy-mode") or "client"
    return master, mode


def _read_summary(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def _push_summary(context: Any, summary: dict[str, Any]) -> None:
    """The summary of a task that is then skipped, as its ``return_value`` like any other."""
    ti = context.get("ti") if context else None
    if ti is not None:
        ti.xcom_push(key="return_value", value=summary)


def _pg_dsn(pg_conn_id: str) -> str:
    """A libpq DSN from an Airflow postgres connection (masked in logs)."""
    try:
        from airflow.sdk import BaseHook
    except ImportError:  # pragma: no cover
        from airflow.hooks.base import BaseHook  # type: ignore[no-redef]
    from urllib.parse import quote

    conn = BaseHook.get_connection(pg_conn_id)
    auth = quote(conn.login or "", safe="")
    if conn.password:
        auth += ":" + quote(conn.password, safe="")
    host = conn.host or "localhost"
    dsn = f"postgresql://{auth + '@' if auth else ''}{host}:{conn.port or 5432}/{quote(conn.schema or '', safe='')}"
    if conn.password:
        from airflow.sdk.log import mask_secret

        mask_secret(conn.password)
        mask_secret(dsn)
    return dsn


def _write_properties(base: str | None, extra: dict[str, str]) -> str:
    """A 0600 properties file: ``base``'s content (if any) plus ``extra``. Returns its path."""
    fd, path = tempfile.mkstemp(prefix="cg-spark-", suffix=".conf")
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        if base:
            f.write(Path(base).read_text(encoding="utf-8").rstrip("\n") + "\n")
        for k, v in extra.items():
            f.write(f"{k} {_escape_property(v)}\n")
    return path


def _escape_property(value: str) -> str:
    """Escape a value for a Java properties file (backslashes, newlines)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
