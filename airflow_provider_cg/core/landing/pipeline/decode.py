"""Payload decoding: in Spark (a column expression per format), or in the driver without Spark.

``SparkDecoder`` adds the decoded column to a batch's DataFrame and a column ``_cg_error``
that names why a row is poison (null for a good row), so decoding runs in Spark tasks with
the rest of the batch's work and only the few bad rows' reasons come back to the driver:

    raw   nothing to decode
    text  ``payload_text``: the payload as UTF-8 (invalid UTF-8 is poison)
    json  ``value``: ``from_json`` with the user's DDL schema (``NOT NULL`` fields enforced)
    avro  ``value``: ``from_avro`` with the user's Avro record schema (Spark's Avro package);
          a payload Spark cannot read comes back as nulls, so a record whose fields are all
          null, or whose non-nullable fields are null, is taken as unreadable

``text_decoder`` is the driver-side decoder of a job run without Spark (``--no-spark``).
No Airflow import.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.modes import PayloadFormat

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

ERROR = "_cg_error"  # why a row is poison; null for a good row
CORRUPT = "_cg_corrupt_record"
#: Spark's Avro package, added to spark-submit for ``avro`` payloads by the operator. 4.1.1 is
#: the newest build on the Maven mirrors this project is tested against; it runs on Spark 4.1
#: and 4.2 (tested with 4.2.0). Give the one of your cluster's Spark version where it differs.
SPARK_AVRO_PACKAGE = "org.apache.spark:spark-avro_2.13:4.1.1"


def text_decoder() -> Callable[[pa.Table], tuple[pa.Table, dict[int, str]]]:
    """Decode payloads as UTF-8 into ``payload_text`` in the driver; invalid UTF-8 is poison."""

    def decode(table: pa.Table) -> tuple[pa.Table, dict[int, str]]:
        payload = table.column("payload")
        bad: dict[int, str] = {}
        try:
            text = payload.cast(pa.string())
        except pa.ArrowInvalid:
            values = []
            for i, b in enumerate(payload.to_pylist()):
                try:
                    values.append(b.decode("utf-8"))
                except UnicodeDecodeError as e:
                    bad[i] = f"payload: not valid UTF-8 ({e.reason} at byte {e.start})"
                    values.append(None)
            text = pa.chunked_array([pa.array(values, pa.string())])
        return _set_column(table, "payload_text", text), bad

    return decode


def parse_avro_schema(text: str) -> dict:
    """The user's Avro schema: JSON text of a record schema (``value`` is a struct of its fields)."""
    try:
        schema = json.loads(text) if isinstance(text, str) else None
    except json.JSONDecodeError as e:
        raise ConfigError("avro_schema", f"not JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(schema, dict) or schema.get("type") != "record" or not isinstance(schema.get("fields"), list) \
            or not schema["fields"]:
        raise ConfigError("avro_schema", 'must be an Avro record schema ({"type": "record", "name": ..., '
                                         '"fields": [...]}) with at least one field')
    for f in schema["fields"]:
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or "type" not in f:
            raise ConfigError("avro_schema", "every field needs a name and a type")
    return schema


def _avro_required(schema: dict) -> list[str]:
    """Fields that cannot be null in a record of ``schema`` (their type is no union with null)."""
    out = []
    for f in schema["fields"]:
        t = f["type"]
        if t == "null" or (isinstance(t, list) and "null" in t):
            continue
        out.append(f["name"])
    return out


class SparkDecoder:
    """Decoding of one payload format as Spark column expressions; see the module docstring.

    Built once per job: a bad schema, or ``avro`` without Spark's Avro package on the
    classpath, fails here (exit 1) rather than at the first batch."""

    def __init__(self, spark: SparkSession | None, kind: PayloadFormat | str,
                 schema: str | None = None) -> None:
        from pyspark.sql import functions as F
        from pyspark.sql.types import StringType, StructField, StructType

        if kind not in tuple(PayloadFormat):
            raise ConfigError("payload_format", f"must be one of {', '.join(PayloadFormat)}")
        self.kind = kind = PayloadFormat(kind)
        self.can_fail = kind is not PayloadFormat.RAW
        self._required: list[str] = []
        if kind is PayloadFormat.JSON:
            if not schema:
                raise ConfigError("json_schema", "required when the payload format is json")
            try:
                ddl = StructType.fromDDL(schema)
            except Exception as e:  # the parser's message names the token
                first = (str(e).strip().splitlines() or [""])[0]
                raise ConfigError("json_schema", f"not a valid Spark DDL schema: {first[:300]}") from None
            if not isinstance(ddl, StructType):
                raise ConfigError("json_schema", "must be the payload's fields, e.g. 'id BIGINT, amount DOUBLE'")
            self._fields = [f.name for f in ddl.fields]
            self._required = [f.name for f in ddl.fields if not f.nullable]
            self._json_schema = StructType([StructField(f.name, f.dataType, True) for f in ddl.fields]
                                           + [StructField(CORRUPT, StringType(), True)])
        elif kind is PayloadFormat.AVRO:
            if not schema:
                raise ConfigError("avro_schema", "required when the payload format is avro")
            parsed = parse_avro_schema(schema)
            self._avro_schema = json.dumps(parsed)
            self._fields = [f["name"] for f in parsed["fields"]]
            self._required = _avro_required(parsed)
            if spark is not None:  # (the job always gives one for avro: it needs Spark)
                self._check_avro(spark)
        self._F = F

    def _check_avro(self, spark: SparkSession) -> None:
        from pyspark.sql.types import BinaryType, StructField, StructType

        empty = spark.createDataFrame([], StructType([StructField("payload", BinaryType())]))
        try:
            empty.select(self._avro_column(empty)).schema  # noqa: B018 - analysis only: no job
        except Exception as e:
            text = str(e)
            if "avro" in text.lower() and ("not found" in text.lower() or "AVRO_NOT_LOADED" in text
                                           or "ClassNotFound" in text or "Failed to find data source" in text):
                raise ConfigError("payload_format", "avro needs Spark's Avro package on the classpath "
                                  f"(spark-submit --packages {SPARK_AVRO_PACKAGE}, or the operator's "
                                  "avro_package)") from None
            first = (text.strip().splitlines() or [""])[0]
            raise ConfigError("avro_schema", f"Spark refuses it: {first[:300]}") from None

    def _avro_column(self, df: DataFrame) -> Column:
        from pyspark.sql.avro.functions import from_avro

        return from_avro(df["payload"], self._avro_schema, {"mode": "PERMISSIVE"}).alias("value")

    def apply(self, df: DataFrame) -> DataFrame:
        """``df`` (a batch, column ``payload`` binary) with the decoded column and ``_cg_error``."""
        F = self._F
        if self.kind is PayloadFormat.RAW:
            return df.withColumn(ERROR, F.lit(None).cast("string"))
        if self.kind is PayloadFormat.TEXT:
            return (df.withColumn("payload_text", F.col("payload").cast("string"))
                      .withColumn(ERROR, F.when(~F.is_valid_utf8(F.col("payload")),
                                                F.lit("payload: not valid UTF-8"))))
        if self.kind is PayloadFormat.JSON:
            parsed = F.from_json(F.col("payload").cast("string"), self._json_schema,
                                 {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
            df = df.withColumn("_cg_parsed", parsed)
            v = F.col("_cg_parsed")
            error = F.when(v.isNull() | v[CORRUPT].isNotNull(), F.lit("payload: not JSON matching the schema"))
            value = F.struct(*[v[name].alias(name) for name in self._fields])
        else:
            df = df.withColumn("_cg_parsed", self._avro_column(df))
            v = F.col("_cg_parsed")
            # Spark's PERMISSIVE from_avro gives nulls for a payload it cannot read: a record of
            # nulls, or one whose non-nullable fields are null (an Avro datum never has those)
            every_null = v.isNull()
            for name in self._fields:
                every_null = every_null & v[name].isNull()
            unreadable = every_null
            for name in self._required:
                unreadable = unreadable | v[name].isNull()
            return (df.withColumn(ERROR, F.when(unreadable, F.lit("payload: not Avro of the schema")))
                      .withColumn("value", v).drop("_cg_parsed"))
        for name in self._required:
            error = error.when(v[name].isNull(), F.lit(f"payload.{name}: is required (NOT NULL in the schema)"))
        return df.withColumn(ERROR, error).withColumn("value", value).drop("_cg_parsed")


def _set_column(table: pa.Table, name: str, values: Any) -> pa.Table:
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), name, values)
    return table.append_column(name, values)
