"""Records the sink refuses (``TwoPhaseSink.refusals``: a merge key null or missing), on every
path: the message's problem, not the table's. Their messages become poison rows of the batch
(the dead-letter stream, with the reason) or, with ``bad_records=fail``, the run ends
(``BadRecords``, exit 1) before anything is prepared or acknowledged. In Spark the refused rows
are observed in the job that stages the batch (a metric) and filtered out of what it writes."""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import pyarrow as pa

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.pipeline.decode import ERROR
from airflow_provider_cg.core.landing.rows import BatchId
from airflow_provider_cg.core.landing.sinks.routing import RoutedSink
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import TwoPhaseSink
from airflow_provider_cg.core.landing.transform import TransformError

if TYPE_CHECKING:
    from collections.abc import Container, Iterable

    import numpy as np
    from pyspark.sql import Column, DataFrame, Observation

#: batches computed again because the sink refused some of their rows, before giving up
MAX_REFUSAL_ROUNDS = 10
FAIL = "fail"  # ``bad_records``: refused records end the run


class BadRecords(ConfigError):
    """Records their table cannot take, under ``bad_records=fail``: the run ends (exit 1) before
    anything is prepared or acknowledged. ``refused``: (origin_stream, origin_seq) -> why."""

    def __init__(self, refused: dict[tuple[str, int], str]) -> None:
        self.refused = refused
        first = refused[min(refused)]
        column, _, rule = first.partition(": ")
        shown = ", ".join(f"{stream} #{seq}" for stream, seq in sorted(refused)[:5])
        more = f" and {len(refused) - 5} more" if len(refused) > 5 else ""
        super().__init__(column, f"{rule} in {len(refused)} message(s) ({shown}{more}); nothing was acknowledged "
                                 "(bad_records=fail; with dead-letter, the default, they go to the dead-letter "
                                 "stream and the rest lands)")


def refuse(bad_records: str, refused: dict[tuple[str, int], str]) -> dict[tuple[str, int], str]:
    """Refused records as poison (their messages to the dead-letter stream), or ``BadRecords``."""
    if refused and bad_records == FAIL:
        raise BadRecords(refused)
    return refused


def origins(table: pa.Table, rows: Iterable[int]) -> list[tuple[str, int]]:
    streams, seqs = table.column("origin_stream"), table.column("origin_seq")
    return [(streams[i].as_py(), int(seqs[i].as_py())) for i in rows]


class InputNumbers(Mapping[tuple[str, int], int]):
    """Each input of a batch, ``(origin_stream, origin_seq)``, to its number as read: made when
    first looked up, as only a batch whose sink refuses records looks (a dict of every input,
    built for each batch, was 8 % of a Spark follower's driver CPU)."""

    def __init__(self, table: pa.Table, numbers: np.ndarray) -> None:
        self._table, self._numbers = table, numbers
        self._made: dict[tuple[str, int], int] | None = None

    def _map(self) -> dict[tuple[str, int], int]:
        if self._made is None:
            keys = zip(self._table.column("origin_stream").to_pylist(), self._table.column("origin_seq").to_pylist(),
                       strict=True)
            self._made = dict(zip(keys, self._numbers.tolist(), strict=True))
        return self._made

    def __getitem__(self, origin: tuple[str, int]) -> int:
        return self._map()[origin]

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return iter(self._map())

    def __len__(self) -> int:
        return self._table.num_rows


def marked_poison(decoded: DataFrame, row: Column, refused: dict[int, str]) -> DataFrame:
    """``decoded`` with the inputs in ``refused`` (by ``row``, their number) marked poison, why
    they are refused as their error (a decoding error of theirs stays first)."""
    if not refused:
        return decoded
    from pyspark.sql import functions as F

    by_reason: dict[str, list[int]] = {}
    for n, why in refused.items():
        by_reason.setdefault(why, []).append(int(n))
    reason = None
    for why, ns in by_reason.items():
        hit = row.isin(ns)
        reason = F.when(hit, F.lit(why)) if reason is None else reason.when(hit, F.lit(why))
    if reason is None:
        return decoded
    return decoded.withColumn(ERROR, F.coalesce(F.col(ERROR), reason))


def refusing(sink: TwoPhaseSink, out: DataFrame | pa.Table, batch_id: BatchId
             ) -> tuple[DataFrame | pa.Table, Observation | None]:
    """The batch's output minus the rows the sink refuses, and an observation of those rows'
    origins and reasons (None when the sink refuses nothing, or the output lacks the origin
    columns: the sink's schema check then names them)."""
    from pyspark.sql import DataFrame

    if not isinstance(out, DataFrame):
        return out, None
    why = sink.refusal_column(out.columns) if not isinstance(sink, RoutedSink) else None
    if why is None:
        return out, None
    return observe_refusals(out, why, batch_id)


def observe_refusals(frame: DataFrame, why: Column,
                     batch_id: BatchId) -> tuple[DataFrame, Observation | None]:
    """``frame`` minus the rows ``why`` (a Spark column: why a row is refused, or null) refuses,
    and an observation of their origins and reasons. Without the origin columns nothing can be
    refused: the sink's schema check names the missing column."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    if not {"origin_stream", "origin_seq"} <= set(frame.columns):
        return frame, None
    observation = Observation(f"cg_refused_{batch_id.uid}_{batch_id.batch_seq}_{secrets.token_hex(2)}")
    frame = frame.observe(observation, F.collect_list(F.when(why.isNotNull(), F.struct(
        F.col("origin_stream").alias("origin_stream"), F.col("origin_seq").alias("origin_seq"),
        why.alias("why")))).alias("refused"))
    return frame.where(why.isNull()), observation


def refused_inputs(metrics: dict, at: Mapping[tuple[str, int], int],
                   refused: Container[int]) -> dict[tuple[str, int], str]:
    """The inputs (origin_stream, origin_seq) of the refused rows the job observed, new ones
    only; ``at`` maps each input of the batch to its number. A refused row that names no input
    of the batch cannot be dead-lettered: the transformation changed its origin columns."""
    found: dict[tuple[str, int], str] = {}
    for r in metrics.get("refused") or ():
        d = r.asDict()
        origin = (d["origin_stream"], d["origin_seq"])
        if origin[1] is None or origin not in at:
            raise TransformError(f"transform: a row the sink refuses ({d['why']}) names no message of the batch "
                                 f"(origin_stream {origin[0]!r}, origin_seq {origin[1]}): keep both columns as "
                                 "the batch gives them")
        origin = (origin[0], int(origin[1]))
        if at[origin] not in refused:
            found.setdefault(origin, d["why"])
    return found
