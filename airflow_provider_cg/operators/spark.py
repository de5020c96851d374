"""Land one member's backlog with ``spark-submit spark_apps/cg_member_job.py``.

Mapped over ``ConsumerGroupMembersOperator`` (``operators/members.py``), one task per member;
a member with no backlog is skipped without starting Spark. The options the job takes are its
contract (``core/landing/contract.py``); this operator builds a ``MemberJobSpec`` from its
rendered fields and refuses what the job would refuse, before spark-submit starts.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import math
import os
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from airflow_provider_cg.core.durations import parse_duration
from airflow_provider_cg.core.errors import ConfigError, GroupNotFound
from airflow_provider_cg.core.groups.lag import epoch_seconds
from airflow_provider_cg.core.jetstream.api import DEFAULT_PREFIX
from airflow_provider_cg.core.landing import contract
from airflow_provider_cg.core.landing.contract import MemberJobSpec
from airflow_provider_cg.core.landing.fields import convert
from airflow_provider_cg.core.landing.modes import PayloadFormat, StopReason
from airflow_provider_cg.core.landing.pipeline.decode import SPARK_AVRO_PACKAGE
from airflow_provider_cg.core.landing.sinks.options import SINK_FIELDS, SinkOptions
from airflow_provider_cg.core.landing.sinks.registry import sink_kind, sink_kinds
from airflow_provider_cg.core.tools.packaging import build_core_zip, member_job_path, ship_module
from airflow_provider_cg.hooks import spark_submit
from airflow_provider_cg.hooks.nats import NatsHook
from airflow_provider_cg.metrics import FollowerReports, count_landed
from airflow_provider_cg.operators.follow import (
    UNTIL_NEXT_RUN,
    check_continuous_start,
    seconds_until_next_run,
)
from airflow_provider_cg.operators.members import (
    SETTLE_TIMEOUT,
    UI_COLOR,
    member_backlog,
    member_states,
    settled_states,
    templated,
)

if TYPE_CHECKING:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from nats.aio.client import Client as NATS

__all__ = ["ConsumerGroupSparkSubmitOperator"]

_MAVEN_COORDINATE = re.compile(r"[A-Za-z0-9_.-]+:[A-Za-z0-9_.-]+:[A-Za-z0-9_.+-]+")
CACHE_ENV = "CG_SPARK_CACHE_DIR"
#: the member job's options the operator takes (the job's own bookkeeping options are the operator's to set)
JOB_FIELDS = tuple(name for name in MemberJobSpec.__dataclass_fields__ if name not in ("no_spark", "summary_file"))
SPARK_SUBMIT_OPTIONS = (
    "conf", "files", "py_files", "archives", "jars", "packages", "exclude_packages", "repositories",
    "driver_class_path", "driver_memory", "executor_memory", "executor_cores", "total_executor_cores",
    "num_executors", "keytab", "principal", "proxy_user", "verbose", "spark_binary", "deploy_mode",
    "yarn_queue", "status_poll_interval",
)


def _cache_dir() -> Path:
    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("AIRFLOW_HOME") or tempfile.gettempdir(), "cg_spark_cache"
    )
    return Path(base)


class ConsumerGroupSparkSubmitOperator(BaseOperator):
    """Land one member's backlog into a sink with ``spark-submit cg_member_job.py``.

    :param stream: origin stream of the group.
    :param group: consumer group.
    :param member: the member this task consumes as (it must hold or win the pin).
    :param sink: the table's kind; with ``sink_path``, ``pg_table``, ``iceberg_table`` and the
        other sink options, every field of the contract's ``SinkOptions`` (``core/landing/contract.py``), all templated: ``sink`` is
        ``"delta"`` (``sink_path``: a path, or ``s3://bucket/prefix`` with ``aws_conn_id``),
        ``"iceberg"`` (``iceberg_table``, a catalog: ``iceberg_catalog_uri`` ``sqlite:////path.db``
        or a PostgreSQL catalog from ``pg_conn_id``, ``iceberg_catalog_name``,
        ``iceberg_warehouse`` where a missing table is created), ``"parquet"`` (``sink_path``,
        a directory visible to the driver) or ``"postgres"`` (``pg_conn_id``, ``pg_table``);
        ``partition_by`` partitions a Delta or Iceberg table the job creates;
        ``target_file_size`` splits a batch's files above it (Parquet, Delta, Iceberg). An
        option of another sink than ``sink`` is refused, naming it.
    :param routes: several tables, each landed exactly once: ``{"<route>": {<sink options of its
        table>, "subjects": [...]}}`` (a dict, or its JSON); a route's options default to the ones
        given here, but each names its own table (``sink_path``, ``iceberg_table``, ``pg_table``).
        Rows go to the route whose name ``route_by`` (a column of the rows or of the
        transformation's output) holds, or, without ``route_by``, messages to the routes whose
        ``subjects`` match theirs. Each table gets its own asset event with its own ranges;
        a record no route takes is dead-lettered (``bad_records``).
    :param iceberg_conn_id: Airflow ``iceberg`` connection of a REST catalog (host: its URL;
        login / password: OAuth2 client id / secret, or extra ``token``: a bearer token); they
        reach the driver as ``CG_ICEBERG_CATALOG_*`` environment, never as an argument.
    :param aws_conn_id: Airflow ``aws`` connection for tables on S3-compatible storage (login:
        access key id, password: secret key, extras ``endpoint_url``, ``region_name``); it reaches
        the driver as ``AWS_*`` environment, never as an argument or a Spark property.
    :param pg_conn_id: Airflow ``postgres`` connection; its DSN reaches the driver as
        ``CG_PG_DSN`` (or ``CG_ICEBERG_CATALOG_URI`` for the iceberg sink), never an argument.
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
    :param batch_size: a member job option; so are ``batch_bytes`` (a batch's payload budget:
        with ``batch_size`` it bounds what a follower that is behind takes at once), ``max_messages``, ``max_bytes``,
        ``max_seconds``, ``standby_timeout``, ``ack_wait``, ``max_ack_pending``, ``max_deliver``,
        ``idle_timeout``, ``progress_interval``, ``read``, ``follow`` and ``commit_interval`` (a
        follower: the run keeps its pin and lands new messages as they arrive for ``follow``
        (seconds, ``"10m"``, or ``"until-next-run"``: until the DAG's next scheduled run),
        cutting a batch at ``batch_size`` or every ``commit_interval`` seconds; it starts
        Spark whatever the backlog), and ``table_commit_interval`` (Delta and Iceberg: the
        members' batches committed within an interval are published together, one table commit;
        default ``commit_interval``). ``None`` (the default) is the job's
        default. Their types, defaults and rules are the job's
        contract (``core/landing/contract.py``: ``MemberJobSpec``), checked here before
        spark-submit starts (templated values once rendered).
    :param handover_wait: a follower's hand-over window (a job option, seconds; 0, the default:
        none). A follower whose member is held by another follower starts this long
        before that one's follow time ends (deferred meanwhile, its worker slot free: DAG runs
        that overlap, ``max_active_runs=2``), waits for the pin warm, and says so; the holder
        lands on past its follow time, at most this long, until its successor is warm, then hands
        the pin over within a batch. So the table never waits for a Spark start between runs.
    :param join: an overflow member (a job option, ``False`` by default): the job adds its
        member to the elastic group once Spark is warm, lands what its partitions hold, and
        drops it before it ends. Its partitions move to it only when it can serve them, and
        back to the members they came from (their followers take them within a batch) as it
        leaves; the backlog is not checked first (the member has no partitions before it
        joins). Example DAG 2 adds its overflow members this way.
    :param stream_life: after the origin stream was deleted and created again under the same
        name, ``"new:<created>"`` lands it as a new stream beside the old one (its rows'
        ``origin_stream`` is ``<stream>#2``), ``"continue:<created>"`` as the same messages (a
        restored backup, checked against what the table landed); after its store went back to a
        sequence (a power loss, a restored snapshot), ``"went-back:<seq>"`` lands the messages
        published since under a life of their own; ``<created>`` and ``<seq>`` as the job's
        refusal names them (templated). Without it such a job fails with exit 1, nothing acked
        (``core/landing/stream_life.py``).
    :param bad_records: what happens to a record its table cannot take (with ``merge_keys``: a
        merge key null, or absent from the message): ``"dead-letter"`` (the default) moves its
        message to the dead-letter stream ``<stream>-<group>-dlq`` with the reason and lands the
        rest; ``"fail"`` fails the task (exit 1, no retry) naming the column, nothing acknowledged.
    :param partitions: informational (from the fan-out); ``backlog`` likewise.
    :param check_backlog: skip without starting Spark when the member has nothing to read (a
        backfill: when the window holds no message of the group).
    :param skip_missing_group: skip (no Spark) while the group does not exist yet, instead of
        failing: for a backfill DAG unpaused before the DAG that creates its group has run.
    :param settle_timeout: before skipping an elastic group's member for an empty backlog,
        wait up to this long for the work queue to catch up with the origin stream.
    :param backfill_start: with ``backfill_end`` (ISO 8601, templated, e.g.
        ``"{{ data_interval_start }}"``): backfill mode. The job re-reads the origin stream's
        messages of ``[backfill_start, backfill_end)`` into the sink (``core/landing/run/backfill.py``);
        ``member``, pinning and the backlog check do not apply.
    :param nats_conn_id: Airflow ``nats`` connection.
    :param conn_id: Spark connection (its host is the master, e.g. ``local[*]``).
    :param env_vars: extra driver environment (not secrets: use connections for those).
    :param properties_file: a Spark properties file to start from.
    :param openlineage_inject_parent_job_info: add the ``spark.openlineage.parent*`` properties
        of this task's run, so the OpenLineage Spark listener links the job's events to the
        task (as the Spark provider's ``SparkSubmitOperator`` does); default: ``[openlineage]
        spark_inject_parent_job_info``. The transport's settings are not injected: they may
        hold a key, and Spark shows its properties.

    The ``spark-submit`` options of the Spark provider's ``SparkSubmitHook`` (``conf``,
    ``packages``, ``py_files``, ``files``, ``jars``, ``driver_memory``, ``executor_memory``, ...)
    are passed through.
    Submits through the Spark provider's public ``SparkSubmitHook`` (``hooks/spark_submit.py``
    keeps the secrets out of sight). Returns the job's summary (result, committed, partitions,
    ...) as the task's only XCom, also when the task is then skipped (result ``empty``,
    ``not-pinned`` or ``revoked``, or a run that committed without writing a row: every message
    landed already, dead-lettered or dropped by the transformation; a skipped task emits no asset
    event, so nothing scheduled on the table runs for it). A job that exits 1 (invalid input, a failing
    transformation) fails the task without retries, with the job's error as the message; exit
    2 (server, database) is retried as configured. With a YARN/Kubernetes cluster-mode driver
    the summary stays with the driver: the result is ``submitted``.
    """

    template_fields: Sequence[str] = (
        *(f for f in JOB_FIELDS if f != "transform"), "avro_package", "pg_conn_id", "iceberg_conn_id", "aws_conn_id",
        "nats_conn_id",
        "conn_id",
        "name", "conf", "packages", "py_files", "files", "jars", "env_vars", "properties_file", "driver_memory",
        "executor_memory", "deploy_mode",
    )
    template_fields_renderers = {"conf": "py", "env_vars": "py"}
    ui_color = UI_COLOR
    # three of the spark-submit options (all set from SPARK_SUBMIT_OPTIONS) the operator reads itself
    deploy_mode: str | None
    py_files: str | None
    conf: dict[str, Any] | None

    def __init__(
        self,
        *,
        stream: str,
        group: str,
        member: str | None = None,
        # the sink options (SinkOptions): explicit, as Airflow's partial() and expand() check names
        sink: str | None = None,
        sink_path: str | None = None,
        pg_table: str | None = None,
        iceberg_table: str | None = None,
        iceberg_catalog_uri: str | None = None,
        iceberg_warehouse: str | None = None,
        iceberg_catalog_name: str | None = None,
        partition_by: str | None = None,
        target_file_size: int | str | None = None,
        merge_keys: str | None = None,
        delete_when: str | None = None,
        routes: dict[str, dict[str, Any]] | str | None = None,
        route_by: str | None = None,
        pg_conn_id: str | None = None,
        iceberg_conn_id: str | None = None,
        aws_conn_id: str | None = None,
        payload_format: str | None = None,
        json_schema: str | None = None,
        avro_schema: str | None = None,
        avro_package: str = SPARK_AVRO_PACKAGE,
        transform: str | None = None,
        transform_sql: str | None = None,
        batch_size: int | str | None = None,
        batch_bytes: int | str | None = None,
        max_messages: int | str | None = None,
        max_bytes: int | str | None = None,
        max_seconds: float | str | None = None,
        follow: float | str | None = None,
        commit_interval: float | str | None = None,
        handover_wait: float | str | None = None,
        join: bool | None = None,
        table_commit_interval: float | str | None = None,
        standby_timeout: float | str | None = None,
        ack_wait: float | str | None = None,
        max_ack_pending: int | str | None = None,
        max_deliver: int | str | None = None,
        idle_timeout: float | str | None = None,
        progress_interval: float | str | None = None,
        read: str | None = None,
        stream_life: str | None = None,
        bad_records: str | None = None,
        partitions: Sequence[int] | None = None,
        backlog: int | None = None,
        check_backlog: bool = True,
        skip_missing_group: bool = False,
        settle_timeout: float = SETTLE_TIMEOUT,
        nats_conn_id: str = NatsHook.default_conn_name,
        conn_id: str = "spark_default",
        name: str | None = None,
        backfill_start: str | None = None,
        backfill_end: str | None = None,
        env_vars: dict[str, str] | None = None,
        properties_file: str | None = None,
        openlineage_inject_parent_job_info: bool | None = None,
        **kwargs: Any,
    ) -> None:
        for field in ("application", "application_args"):
            if field in kwargs:
                raise ConfigError(field, "is set by the operator (use the member job's options instead)")
        spark_options = {k: kwargs.pop(k) for k in list(kwargs) if k in SPARK_SUBMIT_OPTIONS}
        params = dict(locals())  # every sink option and job option is a parameter of its own name
        sink_options = {name: params[name] for name in SINK_FIELDS}
        if "outlets" not in kwargs:  # the table, as an Asset, when its location is known now
            kwargs["outlets"] = _table_outlets(sink_options)
        super().__init__(**kwargs)
        job = {name: params[name] for name in JOB_FIELDS}
        for field, value in job.items():
            setattr(self, field, value)
        self.avro_package, self.pg_conn_id, self.aws_conn_id = avro_package, pg_conn_id, aws_conn_id
        self.iceberg_conn_id = iceberg_conn_id
        self.partitions = list(partitions) if partitions is not None else None
        self.backlog = backlog
        self.check_backlog, self.settle_timeout = check_backlog, settle_timeout
        self.skip_missing_group = skip_missing_group
        self.nats_conn_id, self.conn_id = nats_conn_id, conn_id
        self.name = name or "cg-member"
        self.env_vars, self.properties_file = env_vars, properties_file
        self.openlineage_inject_parent_job_info = openlineage_inject_parent_job_info
        for option in SPARK_SUBMIT_OPTIONS:
            setattr(self, option, spark_options.get(option))
        self._spark_hook: SparkSubmitHook | None = None
        self._follow_seconds: float | None = None
        self._summary: dict[str, Any] | None = None  # the last run's, for lineage
        self._check(rendered=False)
        check_continuous_start(self.dag if self.has_dag() else None, self.start_date)

    @classmethod
    def partial(cls, **kwargs: Any) -> Any:
        """Airflow's ``partial``, with the member job's contract checked over the arguments known
        when the DAG is parsed: a misspelt sink or a bad duration fails the parse, naming the
        field, instead of the land task after the group and members tasks ran. The arguments
        ``expand`` maps are checked there, where they are literal lists."""
        check_mapping_arguments(kwargs)
        return CheckedOperatorPartial(super().partial(**kwargs), kwargs)

    # --- arguments ---------------------------------------------------------------------

    def _job_values(self) -> dict[str, Any]:
        values = {field: getattr(self, field) for field in JOB_FIELDS}
        if values.get("follow") == UNTIL_NEXT_RUN:  # seconds, known once the task runs
            values["follow"] = self._follow_seconds
        return values

    @overload
    def _check(self, rendered: Literal[True]) -> MemberJobSpec: ...

    @overload
    def _check(self, rendered: Literal[False]) -> None: ...

    def _check(self, rendered: bool) -> MemberJobSpec | None:
        """The job's contract over this task's fields (before rendering: what no template
        hides), then the operator's own: ``ConfigError(field, ...)``. Returns the job's spec
        once rendered."""
        values = self._job_values()
        follow = values.get("follow")
        if isinstance(follow, str) and not templated(follow):  # the word is the operator's, not the job's
            parse_duration(follow, "follow", also=f', or "{UNTIL_NEXT_RUN}"')
        spec = None
        if rendered:
            spec = MemberJobSpec.build(values)
        else:
            MemberJobSpec.check_known(values, {k for k, v in values.items() if templated(v)})
        names = _sink_kinds(spec, values)
        for kind in (k for k in sink_kinds() if k.name in names):  # a connection a sink cannot do without
            for connection in kind.connections:
                if connection.required and not getattr(self, connection.param):
                    raise ConfigError(connection.param, f"required for the {kind.name} sink")
        if values["payload_format"] == PayloadFormat.AVRO and (rendered or not templated(self.avro_package)) \
                and not _MAVEN_COORDINATE.fullmatch(str(self.avro_package or "")):
            raise ConfigError("avro_package", "must be Maven coordinates group:artifact:version")
        v = self.settle_timeout
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            raise ConfigError("settle_timeout", "must be a number of seconds >= 0")
        return spec

    # --- run -----------------------------------------------------------------------------

    @cached_property
    def hook(self) -> NatsHook:
        return NatsHook(nats_conn_id=self.nats_conn_id)

    def execute(self, context: Any) -> dict[str, Any]:
        start = self._successor_start()
        if start is not None:
            from airflow.providers.standard.triggers.temporal import DateTimeTrigger

            self.log.info("member %s is held by a follower until %s: this one starts at %s, handover_wait before, "
                          "and takes over warm", self._job_values().get("member"), start[1].isoformat(),
                          start[0].isoformat())
            self.defer(trigger=DateTimeTrigger(moment=start[0]), method_name="execute_after_wait")
        return self._execute(context)

    def execute_after_wait(self, context: Any, event: Any = None) -> dict[str, Any]:
        """After a successor's wait for its start (``handover_wait``): the run."""
        return self._execute(context)

    def _successor_start(self) -> tuple[dt.datetime, dt.datetime] | None:
        """When a follower with a hand-over window starts, if another follower holds its member
        with more than that window to go: ``(start, its follow end)``; else None (at once)."""
        values = self._job_values()
        follow, wait, member = values.get("follow"), values.get("handover_wait"), values.get("member")
        if follow in (None, "") or wait in (None, "", 0) or member is None:
            return None
        try:
            window = convert("handover_wait", wait, float)
            from airflow_provider_cg.core.landing.run.board import pinned_run

            async def holder(nc: NATS) -> dict | None:
                return await pinned_run(nc, DEFAULT_PREFIX, str(values["stream"]), str(values["group"]), str(member))

            found = self.hook.run(holder)
        except ConfigError as e:
            raise AirflowFailException(str(e)) from e
        except Exception as e:  # noqa: BLE001 - the board is a hint: without it, start at once
            self.log.info("the progress board could not be read (%s): starting at once", e)
            return None
        ends = epoch_seconds((found or {}).get("follow_until"))
        if ends is None or window <= 0 or ends - window <= time.time() + 1.0:
            return None
        return dt.datetime.fromtimestamp(ends - window, dt.UTC), dt.datetime.fromtimestamp(ends, dt.UTC)

    def _execute(self, context: Any) -> dict[str, Any]:
        try:
            if getattr(self, "follow", None) == UNTIL_NEXT_RUN:  # job options are attributes (JOB_FIELDS)
                given = getattr(self, "commit_interval", None)
                interval = convert("commit_interval", given, float) if given is not None \
                    else MemberJobSpec.commit_interval
                self._follow_seconds = seconds_until_next_run(context, interval)
                self.log.info("following until the next scheduled run: %.0f s", self._follow_seconds)
            spec = self._check(rendered=True)
            _, mode = spark_submit.spark_master(self.conn_id, self.deploy_mode)
            if mode == "client":  # the driver runs here: its lake directory must be writable here
                spec.check_local_paths()
            # a follower waits for what comes; an overflow member (join) has no partitions until it joins
            if self.check_backlog and not spec.follow and not spec.join:
                (self._check_window if spec.backfill else self._check_backlog)(context, spec)
            shipped = self._ship(spec)
        except (ConfigError, GroupNotFound) as e:
            raise AirflowFailException(str(e)) from e
        self.py_files = ",".join([*shipped, *(p for p in (self.py_files or "").split(",") if p and p not in shipped)])
        self._inject_openlineage(context)
        if self.name == "cg-member":
            self.name = f"cg-{spec.stream}-{spec.group}-{spec.member or 'backfill'}"
        with tempfile.TemporaryDirectory(prefix="cg-summary-") as tmp:
            summary_file = os.path.join(tmp, "summary.json")
            job = MemberJobSpec.build({**spec.values(), "summary_file": summary_file})
            summary = self._submit(spec, job.to_argv(), summary_file)
        who = _writer_name(spec)
        self.log.info("%s: %s (%s)", who, summary.get("result"), summary.get("stop_reason", ""))
        self.log.info("%s", describe_counts(summary))
        if summary.get("read_path_reason"):  # the job read through the consumer: slower, and why
            self.log.warning("%s read through the consumer, the slow path: %s", who, summary["read_path_reason"])
        self._summary = summary
        count_landed(self.nats_conn_id, summary)
        if summary.get("result") in contract.SKIP_RESULTS:
            _push_summary(context, summary)
            raise AirflowSkipException(
                f"{who}: {summary['result']} ({summary.get('stop_reason') or 'nothing consumed'})"
            )
        if not summary.get("rows_written") and summary.get("result") == contract.RESULT_COMMITTED:
            # the table did not change (every message landed already, dead-lettered, or dropped by the
            # transformation): no asset event, so nothing downstream runs for it
            _push_summary(context, summary)
            raise AirflowSkipException(f"{who}: committed, but no row was written to the table "
                                       f"({describe_counts(summary)}): no asset event")
        self._announce(context, spec, summary)
        return summary

    def _inject_openlineage(self, context: Any) -> None:
        """The parent job's OpenLineage properties into ``conf``, when asked (see the parameter)."""
        inject = self.openlineage_inject_parent_job_info
        if inject is None:
            from airflow.providers.common.compat.sdk import conf

            inject = conf.getboolean("openlineage", "spark_inject_parent_job_info", fallback=False)
        if inject:
            from airflow.providers.common.compat.openlineage.utils.spark import (
                inject_parent_job_information_into_spark_properties,
            )

            self.conf = inject_parent_job_information_into_spark_properties(dict(self.conf or {}), context)

    def _announce(self, context: Any, spec: MemberJobSpec, summary: dict[str, Any]) -> None:
        """Attach what this run landed to the asset event of each table it wrote (one, or each
        route's): an outlet Asset whose URI is that table's, or, through an outlet
        ``AssetAlias``, the Asset of the rendered table (a location given by a template or a
        param). An outlet Asset that names another table gets nothing: its event (Airflow sends
        one) carries no landing."""
        from airflow.sdk import Asset, AssetAlias

        from airflow_provider_cg.assets import landed_extras

        events = context.get("outlet_events") if context else None
        if events is None:
            return
        extras = landed_extras(spec, summary, self.hook.get_settings().servers)
        tables = {e["table"] for e in extras}
        for outlet in self.outlets or []:
            if isinstance(outlet, AssetAlias):
                for extra in extras:
                    events[outlet].add(Asset(name=extra.get("name") or extra["table"], uri=extra["table"]),
                                       extra=extra)
            elif isinstance(outlet, Asset) and outlet.uri in tables:
                events[outlet].extra.update(next(e for e in extras if e["table"] == outlet.uri))
            elif isinstance(outlet, Asset) and outlet.uri not in _written_tables(spec):
                self.log.warning("outlet asset %s is not a table this run wrote (%s): no landing on its event; "
                                 "give the table's asset, or an AssetAlias", outlet.uri, ", ".join(sorted(tables)))

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (Airflow's provider calls this when installed): the origin stream in,
        the table out, with the rows this run wrote (``lineage.py``)."""
        from airflow_provider_cg.lineage import operator_lineage

        spec = self.job_spec()
        # where a connection says the table (or its catalog) is: a database's host and name, or
        # a REST catalog's URL
        located = None
        found = next(((c, getattr(self, c.param)) for name in sorted(spec.sink_kinds)
                      for c in sink_kind(name).connections if c.locates_table and getattr(self, c.param)), None)
        if found:
            from airflow.sdk import BaseHook

            conn = BaseHook.get_connection(found[1])
            located = ((conn.host or "", "") if found[0].gives == "iceberg-catalog" else
                       (f"{conn.host or 'localhost'}:{conn.port or 5432}", conn.schema or "postgres"))
        return operator_lineage(spec, self.hook.get_settings().servers, self._summary, located)

    def job_spec(self) -> MemberJobSpec:
        """The member job's spec of this task (its fields rendered)."""
        return MemberJobSpec.build(self._job_values())

    def submit_hook(self, spec: MemberJobSpec, argv: list[str]) -> tuple[SparkSubmitHook, str | None]:
        """The Spark provider's hook for this task's submit and the private properties file to
        delete afterwards (``hooks/spark_submit.py``)."""
        options = {k: getattr(self, k) for k in SPARK_SUBMIT_OPTIONS if getattr(self, k) is not None}
        options.pop("deploy_mode", None)
        if spec.payload_format is PayloadFormat.AVRO:
            packages = [p for p in (options.get("packages") or "").split(",") if p]
            if not any(p.split(":")[:2] == self.avro_package.split(":")[:2] for p in packages):
                options["packages"] = ",".join([*packages, self.avro_package])
        return spark_submit.submit_hook(
            conn_id=self.conn_id, deploy_mode=self.deploy_mode, secrets=self._secrets(spec), env_vars=self.env_vars,
            properties_file=self.properties_file, application_args=argv, name=self.name, follower=bool(spec.follow),
            **options)

    def _submit(self, spec: MemberJobSpec, argv: list[str], summary_file: str) -> dict[str, Any]:
        """spark-submit the job; its summary (or, for a cluster-mode driver, ``submitted``).
        A failed job's own summary says whether retrying can help (exit 2) or not (exit 1)."""
        try:
            hook, props = self.submit_hook(spec, argv)
        except ConfigError as e:
            raise AirflowFailException(str(e)) from e
        self._spark_hook = hook
        reports = FollowerReports(self.hook, self.nats_conn_id, spec.stream, spec.group, spec.member or "",
                                  spec.progress_interval) if spec.follow and spec.member else contextlib.nullcontext()
        try:
            with reports:
                hook.submit(str(member_job_path()))
        except AirflowException as e:
            failed = _read_summary(summary_file)
            if failed is None or failed.get("result") != contract.RESULT_FAILED:
                raise  # killed, or a driver that never started: retry as configured
            error = f"member job: {failed.get('error')}"
            if failed.get("exit_code") == contract.EXIT_INVALID:
                raise AirflowFailException(error) from e  # invalid input, a failing transformation
            raise AirflowException(error) from e
        finally:
            if props:
                with contextlib.suppress(OSError):
                    os.unlink(props)
        summary = _read_summary(summary_file)
        if summary is None:
            self.log.warning("No summary from the driver (a cluster-mode driver keeps it): result 'submitted'")
            summary = {"stream": spec.stream, "group": spec.group, "member": spec.member,
                       "result": contract.RESULT_SUBMITTED}
        return summary

    def _ship(self, spec: MemberJobSpec) -> list[str]:
        """What ``--py-files`` must carry: the core's zip, and the transformation's module."""
        shipped = [str(build_core_zip(_cache_dir() / "cg_core.zip"))]
        if spec.transform:
            from airflow_provider_cg.core.landing.transform import parse_spec

            dag_file = getattr(getattr(self, "dag", None), "fileloc", None)
            near = [os.path.dirname(dag_file)] if dag_file else []
            shipped.append(str(ship_module(parse_spec(spec.transform)[0], _cache_dir(), near)))
        return shipped

    def _secrets(self, spec: MemberJobSpec) -> dict[str, str]:
        env = self.hook.get_settings().to_env()  # registers masks
        env.update(spark_submit.sink_env(spec.sink_kinds, pg_conn_id=self.pg_conn_id, iceberg_conn_id=self.iceberg_conn_id,
                                         aws_conn_id=self.aws_conn_id))
        return env

    def on_kill(self) -> None:
        if self._spark_hook is not None:
            self._spark_hook.on_kill()

    def _check_backlog(self, context: Any, spec: MemberJobSpec) -> None:
        status = member_states(self.hook, spec.stream, spec.group)
        m, backlog = self._own_backlog(spec, status)
        if backlog == 0 and self.settle_timeout > 0:
            # Nothing yet: the work queue may still be catching up with a fresh publish.
            m, backlog = self._own_backlog(spec, settled_states(self.hook, spec.stream, spec.group,
                                                                self.settle_timeout))
        if backlog == 0:
            summary = contract.Summary(spec.stream, spec.group, spec.member,
                                       stop_reason=StopReason.NO_BACKLOG).to_dict()
            _push_summary(context, summary)
            raise AirflowSkipException(
                f"member {spec.member} (partitions {m.partitions}) has no backlog: Spark not started"
            )
        self.log.info("member %s: partitions %s, backlog %d: starting Spark", spec.member, m.partitions, backlog)

    def _check_window(self, context: Any, spec: MemberJobSpec) -> None:
        """A backfill window without messages is skipped before Spark starts."""
        from airflow_provider_cg.core.landing.run.backfill import window_has_messages  # pyarrow: not at parse

        start, end = spec.window()  # (checked by the spec: both given)

        async def go(nc: NATS) -> bool:
            return await window_has_messages(nc, spec.stream, spec.group, start, end)

        try:
            if self.hook.run(go):
                return
            why = "no messages in the window"
            message = (f"no messages of {spec.stream} for group {spec.group} in [{spec.backfill_start}, "
                       f"{spec.backfill_end}): Spark not started")
        except GroupNotFound as e:
            if not self.skip_missing_group:
                raise
            why, message = "the group does not exist yet", f"{e} (yet): nothing to backfill, Spark not started"
        summary = contract.Summary(spec.stream, spec.group, "backfill", window_start=spec.backfill_start,
                                   window_end=spec.backfill_end, stop_reason=f"{why}: Spark not started").to_dict()
        _push_summary(context, summary)
        raise AirflowSkipException(message)

    @staticmethod
    def _own_backlog(spec: MemberJobSpec, status: Any) -> tuple[Any, int]:
        m = {m.member: m for m in status.members}.get(spec.member)
        if m is None or not m.in_membership:
            raise ConfigError("member", f"{spec.member!r} is not a member of group {spec.group!r}")
        return m, member_backlog(status, m)


def _table_outlets(sink_options: dict[str, Any]) -> list:
    """``[Asset]`` of each table (one, or each route's) whose sink options are given as plain
    values, else an ``AssetAlias`` through which a run names the tables it rendered."""
    from airflow.sdk import AssetAlias

    from airflow_provider_cg.assets import LANDED_TABLES, table_assets

    if any(templated(v) for v in sink_options.values()):
        return [AssetAlias(LANDED_TABLES)]
    try:
        return table_assets(**{k: v for k, v in sink_options.items() if v is not None})
    except (ValueError, ConfigError):  # incomplete or invalid: the contract check that follows names the field
        return []


def _literal(value: Any) -> bool:
    """Whether a DAG file wrote ``value`` as it is: not a template, an XCom or a mapped value."""
    if isinstance(value, str):
        return not templated(value)
    if value is None or isinstance(value, bool | int | float):
        return True
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _literal(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_literal(v) for v in value)
    return False


def check_mapping_arguments(given: Mapping[str, Any]) -> None:
    """The member job's contract over a mapped task's arguments as far as they are known at
    parse time: the literal ones checked, every other job field (mapped, templated, an XCom)
    standing as unknown, so no rule that involves one is applied (``ConfigError``)."""
    values = {k: v for k, v in given.items() if k in JOB_FIELDS and _literal(v)}
    follow = values.get("follow")
    if follow == UNTIL_NEXT_RUN:
        del values["follow"]  # seconds, known once the task runs
    elif isinstance(follow, str):
        parse_duration(follow, "follow", also=f', or "{UNTIL_NEXT_RUN}"')
    unknown = {k for k in JOB_FIELDS if k not in values}
    if "routes" not in given:  # no routes in the DAG file: the sink options are the table's own
        unknown.discard("routes")
    MemberJobSpec.check_known(values, unknown)


def _checked_schedule(mapped: Any) -> Any:
    check_continuous_start(getattr(mapped, "dag", None), getattr(mapped, "start_date", None))
    return mapped


#: beyond this many, ``expand``'s literal lists are checked one argument at a time
MAX_CHECKED_COMBINATIONS = 1024


class CheckedOperatorPartial:
    """What ``ConsumerGroupSparkSubmitOperator.partial`` returns: Airflow's partial operator,
    whose ``expand`` and ``expand_kwargs`` first check the literal values they map (each with
    the partial's arguments, ``check_mapping_arguments``); everything else is Airflow's."""

    def __init__(self, partial: Any, given: Mapping[str, Any]) -> None:
        self._partial, self._given = partial, dict(given)

    def expand(self, **mapped: Any) -> Any:
        lists = {k: v for k, v in mapped.items() if isinstance(v, list | tuple)}
        combinations = math.prod(len(v) for v in lists.values())
        if lists and combinations <= MAX_CHECKED_COMBINATIONS:  # as Airflow maps them: every combination
            for combination in itertools.product(*lists.values()):
                check_mapping_arguments({**self._given, **dict(zip(lists, combination, strict=True))})
        else:
            for name, values in lists.items():
                for value in values:
                    check_mapping_arguments({**self._given, name: value})
        return _checked_schedule(self._partial.expand(**mapped))

    def expand_kwargs(self, kwargs: Any, *, strict: bool = True) -> Any:
        for item in kwargs if isinstance(kwargs, list | tuple) else ():
            if isinstance(item, Mapping):
                check_mapping_arguments({**self._given, **item})
        return _checked_schedule(self._partial.expand_kwargs(kwargs, strict=strict))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._partial, name)

    def __repr__(self) -> str:
        return repr(self._partial)


def _sink_kinds(spec: MemberJobSpec | None, values: dict[str, Any]) -> frozenset[str]:
    """The sinks of the tables a task lands into, as far as known before rendering."""
    if spec is not None:
        return spec.sink_kinds
    try:
        return SinkOptions.build({k: values.get(k) for k in SINK_FIELDS
                                           if not templated(values.get(k))}).sink_kinds
    except ConfigError:
        return frozenset({values.get("sink") or SinkOptions.sink})


def _written_tables(spec: MemberJobSpec) -> set[str]:
    from airflow_provider_cg.assets import table_uri

    out = set()
    for _, options in spec.tables():
        try:
            out.add(table_uri(options))
        except ValueError:
            continue
    return out


def _writer_name(spec: MemberJobSpec) -> str:
    """How a log line names the writer: the member, or the backfill and its window."""
    if spec.backfill:
        return f"backfill [{spec.backfill_start}, {spec.backfill_end})"
    return f"member {spec.member}"


def describe_counts(summary: dict[str, Any]) -> str:
    """One line naming each count of a summary (``contract.Summary``) for what it counts."""
    return ", ".join(f"{summary.get(k) or 0} {k.replace('_', ' ')}" for k in (*contract.COUNTS, "batches"))


def _read_summary(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _push_summary(context: Any, summary: dict[str, Any]) -> None:
    """The summary of a task that is then skipped, as its ``return_value`` like any other."""
    ti = context.get("ti") if context else None
    if ti is not None:
        ti.xcom_push(key="return_value", value=summary)
