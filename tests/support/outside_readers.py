"""Readers of the landed tables that are neither this provider nor the libraries it writes
with: DuckDB (its ``delta``, ``iceberg`` and ``avro`` extensions, from their PyPI packages: the
machines reach no extension repository) and Polars. Local tables; a test skips when a reader
is not installed."""

from __future__ import annotations

import glob
import importlib
import os

import pytest


def iceberg_metadata_path(metadata_location: str) -> str:
    return metadata_location.removeprefix("file://")


def _duckdb():
    duckdb = pytest.importorskip("duckdb")
    conn = duckdb.connect()
    for name in ("delta", "avro", "iceberg"):  # iceberg needs avro loaded first (it would download it)
        package = pytest.importorskip(f"duckdb_extension_{name}")
        (path,) = glob.glob(os.path.join(os.path.dirname(package.__file__), "extensions", "*",
                                         f"{name}.duckdb_extension"))
        conn.execute(f"LOAD '{path}'")
    return conn


def duckdb_rows(fmt: str, location: str, columns: list[str], where: str = "true") -> list[tuple]:
    """``SELECT columns FROM delta_scan(location) | iceberg_scan(metadata) WHERE where``."""
    scan = f"delta_scan('{location}')" if fmt == "delta" else f"iceberg_scan('{iceberg_metadata_path(location)}')"
    conn = _duckdb()
    try:
        return conn.execute(f"SELECT {', '.join(columns)} FROM {scan} WHERE {where}").fetchall()
    finally:
        conn.close()


def polars_rows(fmt: str, location: str, columns: list[str]) -> list[tuple]:
    pl = pytest.importorskip("polars")
    importlib.import_module("deltalake" if fmt == "delta" else "pyiceberg")
    frame = pl.read_delta(location, columns=columns) if fmt == "delta" else \
        pl.scan_iceberg(iceberg_metadata_path(location)).select(columns).collect()
    return list(frame.iter_rows())
