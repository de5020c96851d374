"""Build the zip that ``spark-submit --py-files`` ships to a cluster.

The member job needs only the Airflow-free core of this package; everything else on the
cluster is PySpark (with its SQL extra, pyarrow) and nats-py. The zip holds
``airflow_provider_cg/__init__.py`` and ``airflow_provider_cg/core/**`` and is rebuilt only
when a source file is newer than it.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # airflow_provider_cg/
SPARK_APPS = PACKAGE_ROOT.parent / "spark_apps"
MEMBER_JOB = "cg_member_job.py"


def _sources() -> list[Path]:
    files = [PACKAGE_ROOT / "__init__.py"]
    files += sorted(p for p in (PACKAGE_ROOT / "core").rglob("*.py") if "__pycache__" not in p.parts)
    return files


def build_core_zip(dest: str | os.PathLike) -> Path:
    """Write (or reuse an up-to-date) zip of the core at ``dest``; return its path."""
    dest = Path(dest)
    sources = _sources()
    if dest.exists() and dest.stat().st_mtime >= max(p.stat().st_mtime for p in sources):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(f".{os.getpid()}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sources:
            zf.write(p, p.relative_to(PACKAGE_ROOT.parent).as_posix())
    os.replace(tmp, dest)
    return dest


def member_job_path() -> Path:
    """The spark-submit application file of the member job.

    In a source checkout it is ``spark_apps/cg_member_job.py``; an installed wheel carries a
    copy as package data under ``airflow_provider_cg/spark_apps/``.
    """
    for candidate in (SPARK_APPS / MEMBER_JOB, PACKAGE_ROOT / "spark_apps" / MEMBER_JOB):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"{MEMBER_JOB} not found next to the package")
