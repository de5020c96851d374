"""Build the zip that ``spark-submit --py-files`` ships to a cluster.

The member job needs only the Airflow-free core of this package; everything else on the
cluster is PySpark (with its SQL extra, pyarrow) and nats-py. The zip holds
``airflow_provider_cg/__init__.py`` and ``airflow_provider_cg/core/**`` and is rebuilt only
when a source file is newer than it.
"""

from __future__ import annotations

import os
import zipfile
from importlib import resources
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # airflow_provider_cg/
SPARK_APPS_PACKAGE = "airflow_provider_cg.spark_apps"
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


def ship_module(module: str, dest_dir: str | os.PathLike, search: list[str | os.PathLike] = ()) -> Path:
    """What ``--py-files`` needs for the top-level package or module of ``module`` (the
    transformation's): a zip of the package (rebuilt when a source changes), or the ``.py``
    file of a plain module; looked up on ``sys.path``, then in ``search`` (e.g. the DAG's
    folder). ``ConfigError`` if it cannot be found."""
    from importlib.machinery import PathFinder
    from importlib.util import find_spec

    from airflow_provider_cg.core.errors import ConfigError

    top = module.split(".")[0]
    try:
        spec = find_spec(top)
    except (ImportError, ValueError):
        spec = None
    if spec is None and search:
        spec = PathFinder.find_spec(top, [str(d) for d in search])
    if spec is None or not (spec.origin or spec.submodule_search_locations):
        raise ConfigError("transform", f"module {top!r} is not importable here, so it cannot be shipped to Spark "
                                       "(put it next to the DAG or in the Airflow plugins folder)")
    if not spec.submodule_search_locations:
        if not spec.origin or not spec.origin.endswith(".py"):
            raise ConfigError("transform", f"module {top!r} is not a Python source file ({spec.origin})")
        return Path(spec.origin)
    root = Path(list(spec.submodule_search_locations)[0])
    sources = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    dest = Path(dest_dir) / f"transform-{top}.zip"
    if dest.exists() and sources and dest.stat().st_mtime >= max(p.stat().st_mtime for p in sources):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(f".{os.getpid()}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sources:
            zf.write(p, (Path(top) / p.relative_to(root)).as_posix())
    os.replace(tmp, dest)
    return dest


def member_job_path() -> Path:
    """The spark-submit application file of the member job, as installed.

    It ships inside the package (``airflow_provider_cg/spark_apps/``), in a checkout and in
    a wheel alike; spark-submit needs a real file, which a regular install always has.
    """
    resource = resources.files(SPARK_APPS_PACKAGE) / MEMBER_JOB
    path = Path(str(resource))
    if not path.is_file():
        raise FileNotFoundError(
            f"{MEMBER_JOB} is not a file in {SPARK_APPS_PACKAGE} ({resource}); reinstall airflow-provider-cg "
            "from its wheel (zipped installs are not supported: spark-submit needs a file)"
        )
    return path


def example_dags_folder() -> Path:
    """The example DAGs shipped in the package (``airflow_provider_cg/example_dags``)."""
    return Path(str(resources.files("airflow_provider_cg.example_dags")))
