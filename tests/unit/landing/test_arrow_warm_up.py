"""A follower's warm-up without Spark (``ArrowPipeline.warm_up``): the process's one-time costs
of a batch (pyarrow importing pandas on its first conversion, the Parquet writer) are paid while
the follower waits, not by its first batch; a failure is only a lost head start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_cg.core.landing.pipeline.decode import text_decoder
from airflow_provider_cg.core.landing.pipeline.processing import ArrowPipeline

REPO = Path(__file__).resolve().parents[3]

FRESH = """
import sys
from airflow_provider_cg.core.landing.pipeline.processing import ArrowPipeline
from airflow_provider_cg.core.landing.pipeline.decode import text_decoder
before = "pandas" in sys.modules
ArrowPipeline(text_decoder()).warm_up()
print(before, "pandas" in sys.modules)
"""


def test_the_warm_up_pays_the_first_conversions_import():
    try:
        import pandas  # noqa: F401 - only pyarrow's own use of it is what the warm-up pays for
    except ImportError:
        pytest.skip("pandas is not installed: pyarrow has nothing to import")
    out = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


def test_a_failing_warm_up_raises_nothing_and_decodes_one_row():
    seen = []

    def decode(table):
        seen.append(table.num_rows)
        raise ValueError("not today")

    ArrowPipeline(decode).warm_up()  # logged at debug level only
    assert seen == [1]
    decoded = []

    def spy(table):
        decoded.append(table.num_rows)
        return text_decoder()(table)

    ArrowPipeline(spy).warm_up()
    assert decoded == [1]
