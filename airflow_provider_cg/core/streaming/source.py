"""A consumer group's member as a Spark Structured Streaming source (PySpark's Python data
source API): ``spark.readStream.format("cg_member")``.

Three kinds of process take part, each with its part:

- the planning process Spark runs beside the query's driver (``initialOffset``,
  ``latestOffset``, ``partitions``, ``commit``): the ``SourceSession`` (``session.py``) holds
  each member's pin there for the query's life, plans micro-batches as offsets and
  acknowledges what Spark has committed, never before;
- Spark's tasks (``read``): each reads its planned ranges by batched direct gets on its Python
  worker's kept connection (``nats_source.read_split``), after checking that the member still
  pins this query, and checks again once read: a task of a query that lost its pin fails, so
  the batch writes nothing;
- the query's driver: it only registers the source. The NATS settings (secrets too) travel
  with the registered class, pickled by value, never in an option (Spark shows options).

Messages come as rows of ``STREAM_ROWS``: ``origin_stream`` and ``origin_seq`` (where the
message is in the origin stream: its id), ``subject``, ``partition``, ``key``, ``payload``
(binary: ``CAST(payload AS STRING)`` for text), ``headers`` (JSON), ``timestamp`` (when the
stream read stored it: the origin for a static group, the work-queue stream, a little later,
for an elastic one) and the group and member. Per-key order holds within a partition and batch (a range is read in
sequence order; one task per range unless ``minPartitions`` splits it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from airflow_provider_cg.core.landing.pipeline.nats_source import (
    READ_FAILED,
    READ_RETRY_SECONDS,
    WORKER,
    read_split,
    server_away,
)
from airflow_provider_cg.core.streaming.source_options import SourceOptions

try:  # PySpark 4.0+
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - without PySpark there is no query to read for
    DataSource = DataSourceStreamReader = SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]
    InputPartition = ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings
    from airflow_provider_cg.core.streaming.session import SourceSession

log = logging.getLogger("airflow_provider_cg.streaming")

SOURCE_NAME = "cg_member"
#: the source's rows: the member job's, less what the job fills in later (decoded text, deliveries)
STREAM_ROWS = ("origin_stream string not null, origin_seq bigint not null, subject string, `partition` int, "
               "key string, payload binary, headers string, `timestamp` timestamp, `group` string, member string")
_COLUMNS = [c.split(" ")[0].strip("`") for c in STREAM_ROWS.split(", ")]
#: in the error of a task whose query lost a member's pin
PIN_LOST = "cg-pin-lost"


def register(spark: SparkSession, settings: NatsConnectionSettings | None = None) -> None:
    """Register the ``cg_member`` source in ``spark``'s session, carrying the NATS connection
    ``settings`` (default: from the ``CG_NATS_*`` environment, as the provider's operator
    gives it to the applications it submits; none there: ``nats://127.0.0.1:4222``)."""
    from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings

    if settings is None:
        settings = NatsConnectionSettings.from_env()
    carried = settings.portable().to_dict()
    spark.dataSource.register(type("MemberSourceOfThisApp", (MemberSource,), {
        "settings": carried, "__module__": "cg_stream_dynamic"}))  # not importable: pickled by value


class MemberSource(DataSource):
    """``spark.readStream.format("cg_member").option("stream", ...).option("group", ...)
    .option("member", ...).load()`` (options: ``source_options.OPTIONS``)."""

    settings: dict | None = None

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return STREAM_ROWS

    def streamReader(self, schema: Any) -> MemberStreamReader:
        return MemberStreamReader(SourceOptions.parse(dict(self.options)), type(self).settings or {})


class MemberStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark's calls, handed to the planning process's ``SourceSession`` (made at the first
    planning call: Spark also makes readers in other processes, which plan nothing), and
    ``read`` in the tasks."""

    def __init__(self, options: SourceOptions, settings: dict) -> None:
        self.options, self.settings = options, settings
        self._session: SourceSession | None = None
        self._available_now = False

    def __getstate__(self) -> dict:  # the tasks get the options and settings, not the session
        return {"options": self.options, "settings": self.settings, "_session": None, "_available_now": False}

    def session(self) -> SourceSession:
        if self._session is None:
            from airflow_provider_cg.core.streaming.session import SourceSession

            _log_to_stderr()
            self._session = SourceSession(self.settings, self.options)
            self._session.available_now = self._available_now
        return self._session

    def prepareForTriggerAvailableNow(self) -> None:
        """An available-now query: it ends at what the members' streams hold when it plans its
        first batch (as the member job's bounded runs do)."""
        self._available_now = True
        if self._session is not None:
            self._session.available_now = True

    def initialOffset(self) -> dict:
        return self.session().initial_offset()

    def getDefaultReadLimit(self) -> Any:
        n = self.options.max_messages
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: Any) -> dict:
        n = getattr(limit, "max_rows", None) if ReadMaxRows is not None and isinstance(limit, ReadMaxRows) else None
        return self.session().latest_offset(start, n)

    def reportLatestOffset(self) -> dict | None:
        return self.session().report_latest() if self._session is not None else None

    def partitions(self, start: dict, end: dict) -> list:
        return [InputPartition([plan, split]) for plan, split in self.session().partitions(start, end)]

    def commit(self, end: dict) -> None:
        self.session().commit(end)

    def stop(self) -> None:
        if self._session is not None:
            self._session.stop()
            self._session = None

    def read(self, partition: Any) -> Iterator[Any]:
        text, split = partition.value
        plan = json.loads(text)
        _check_fence(plan, self.settings)
        for batch in read_split(plan, self.settings, split):
            yield batch.select(_COLUMNS)
        _check_fence(plan, self.settings)  # read while pinned: its batch may be written


def _check_fence(plan: dict, settings: dict) -> None:
    """Fail the task unless the member consumer still pins the query (``session.Fence``)."""
    from airflow_provider_cg.core.jetstream.api import JsApi
    from airflow_provider_cg.core.streaming.session import PIN_LOST_WHY, holder_is

    fence = plan["fence"]

    async def look() -> dict | None:
        """The member consumer's info, asked again while the server is away (``server_away``)
        for up to ``READ_RETRY_SECONDS``, as the read itself is: a task that cannot tell
        writes nothing."""
        deadline = time.monotonic() + READ_RETRY_SECONDS
        while True:
            try:
                nc = await WORKER.get(settings, f"cg-read-{plan['member']}")
                return await JsApi(nc, prefix=plan["js_prefix"]).consumer_info(fence["stream"], fence["consumer"])
            except Exception as e:
                await WORKER.drop()
                if not server_away(e) or time.monotonic() > deadline:
                    raise RuntimeError(f"{READ_FAILED}: member {plan['member']}'s consumer: "
                                       f"{type(e).__name__}: {e}") from None
            await asyncio.sleep(0.5)

    loop = WORKER.event_loop()
    try:
        info = loop.run_until_complete(look())
    finally:
        WORKER.done()
    if not holder_is(info, fence):
        raise RuntimeError(f"{PIN_LOST}: member {plan['member']} of group {plan['group']}: its pin moved to another "
                           f"instance{PIN_LOST_WHY}; this query's batch writes nothing and the query stops")


def _log_to_stderr() -> None:
    """The planning process's own lines (the pins taken and given back) into the driver's log:
    Spark starts that process with no logging set up, and its standard error is the driver's."""
    import sys

    logger = logging.getLogger("airflow_provider_cg")
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)

