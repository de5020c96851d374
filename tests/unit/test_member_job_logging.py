"""The member job's log (pure logic): a library's record with a traceback comes out as one line;
the job's own records are left as they are."""

from __future__ import annotations

import importlib.util
import io
import logging
import sys

from airflow_provider_cg.core.tools.packaging import member_job_path


def _filter_class():
    spec = importlib.util.spec_from_file_location("cg_member_job_under_test", member_job_path())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.OneLineLibraryErrors


def _log(name: str) -> str:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(_filter_class()())
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        try:
            raise OSError("When creating key 'm/' in bucket 'b': Could not connect to server\nsecond line")
        except OSError:
            logger.warning("Failed to delete uncommitted manifest: %s", "s3://b/m.avro", exc_info=sys.exc_info())
    finally:
        logger.removeHandler(handler)
    return out.getvalue()


def test_a_library_traceback_becomes_one_line():
    text = _log("pyiceberg.table.update.snapshot")
    assert "Traceback" not in text and "second line" not in text
    assert text.strip() == ("Failed to delete uncommitted manifest: s3://b/m.avro (OSError: When creating key 'm/' "
                            "in bucket 'b': Could not connect to server)")


def test_the_jobs_own_records_keep_their_traceback():
    assert "Traceback" in _log("airflow_provider_cg.landing")
