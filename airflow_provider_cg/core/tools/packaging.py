"""Build the zip that ``spark-submit --py-files`` ships to a cluster.

The member job needs only the part of the Airflow-free core a driver runs: the JetStream
client, groups and partitioning, the landing engine and its sinks (not ``core/tools``: the
CLI, the embedded server, this module). Everything else on the cluster is PySpark (with its
SQL extra, pyarrow) and nats-py. The zip is rebuilt only when a source file is newer than it.

Beside each source the zip holds its bytecode for the Python that built it: ``zipimport``
cannot cache what it compiles, so without it every driver and every Python worker of every
job compiled the whole core again (about 0.6 CPU-s each). A cluster on another Python
version finds a bytecode of the wrong magic number, which ``zipimport`` skips for the
source; the bytecode is checked against its source's hash, so it never runs stale.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import zipfile
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # airflow_provider_cg/
SPARK_APPS_PACKAGE = "airflow_provider_cg.spark_apps"
EXAMPLE_DAGS_PACKAGE = "airflow_provider_cg.example_dags"
MEMBER_JOB = "cg_member_job.py"
#: what a Spark driver imports: everything in core/ but its tools
DRIVER_PARTS = ("errors.py", "durations.py", "__init__.py", "jetstream", "groups", "landing", "streaming")


def _sources() -> list[Path]:
    core = PACKAGE_ROOT / "core"
    files = [PACKAGE_ROOT / "__init__.py"]
    for part in DRIVER_PARTS:
        path = core / part
        files += [path] if path.is_file() else sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
    return files


def build_core_zip(dest: str | os.PathLike) -> Path:
    """Write (or reuse an up-to-date) zip of the core at ``dest``; return its path."""
    dest = Path(dest)
    sources = _sources()
    names = {p.relative_to(PACKAGE_ROOT.parent).as_posix(): p for p in sources}
    if dest.exists() and dest.stat().st_mtime >= max(p.stat().st_mtime for p in sources) \
            and _names(dest) == {*names, *(n + "c" for n in names)}:
        return dest  # (a module moved or removed since is not up to date, whatever the times say)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(f".{os.getpid()}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, p in names.items():
            source = p.read_bytes()
            zf.writestr(zipfile.ZipInfo.from_file(p, name), source, zipfile.ZIP_DEFLATED)
            zf.writestr(name + "c", hash_checked_bytecode(source, name))
    os.replace(tmp, dest)
    return dest


def hash_checked_bytecode(source: bytes, name: str) -> bytes:
    """A ``.pyc`` of ``source`` for this Python (PEP 552's checked-hash form: ``zipimport`` checks
    it against the source beside it, as a zip's times are too coarse to trust); its tracebacks
    name ``name``."""
    code = compile(source, name, "exec", dont_inherit=True)
    flags = 0b11  # hash-based, check the source
    return importlib.util.MAGIC_NUMBER + flags.to_bytes(4, "little") + importlib.util.source_hash(source) \
        + marshal.dumps(code)


def _names(zip_path: Path) -> set[str]:
    try:
        with zipfile.ZipFile(zip_path) as zf:
            return set(zf.namelist())
    except (OSError, zipfile.BadZipFile):
        return set()


def ship_module(module: str, dest_dir: str | os.PathLike, search: Sequence[str | os.PathLike] = ()) -> Path:
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


def _shipped_folder(package: str, top_level: str) -> Path:
    """A folder that sits at the top of the repository (``top_level``) and ships inside the
    package as ``package``: an installed wheel or an editable install resolve it with
    importlib.resources; a plain checkout on ``sys.path`` finds it next to the package."""
    try:
        return Path(str(resources.files(package)))
    except ModuleNotFoundError:
        return PACKAGE_ROOT.parent / top_level


def member_job_path() -> Path:
    """The spark-submit application file of the member job (``spark_apps/`` in the
    repository, ``airflow_provider_cg/spark_apps/`` in a wheel). spark-submit needs a real
    file, which a regular install always has."""
    path = _shipped_folder(SPARK_APPS_PACKAGE, "spark_apps") / MEMBER_JOB
    if not path.is_file():
        raise FileNotFoundError(
            f"{MEMBER_JOB} is not a file in {SPARK_APPS_PACKAGE} ({path}); reinstall airflow-provider-cg "
            "from its wheel (zipped installs are not supported: spark-submit needs a file)"
        )
    return path


def spark_app_path(name: str) -> Path:
    """One of the shipped spark-submit applications (``spark_apps/<name>``), e.g. the example
    streaming application ``cg_stream_windows.py``."""
    path = _shipped_folder(SPARK_APPS_PACKAGE, "spark_apps") / name
    if not path.is_file():
        raise FileNotFoundError(f"{name} is not a file in {SPARK_APPS_PACKAGE} ({path})")
    return path


def example_dags_folder() -> Path:
    """The example DAGs (``dags/`` in the repository, ``airflow_provider_cg/example_dags`` in a wheel)."""
    return _shipped_folder(EXAMPLE_DAGS_PACKAGE, "dags")
