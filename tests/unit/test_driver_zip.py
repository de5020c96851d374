"""The zip a Spark driver gets with ``--py-files`` (``core/tools/packaging.py``) holds every
module of the provider that its modules import at module level or inside functions: a module
left out fails only on a cluster, at the first batch that needs it; and their bytecode, used
only by the Python it was compiled for and only beside its own source."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile

from airflow_provider_cg.core.tools.packaging import build_core_zip

#: imported by the package's __init__ only inside get_provider_info(), which Airflow calls, never a driver
AIRFLOW_ONLY = {"airflow_provider_cg._provider_info"}


def test_every_module_a_driver_module_imports_is_in_the_zip(tmp_path):
    archive = zipfile.ZipFile(build_core_zip(tmp_path / "cg_core.zip"))
    names = set(archive.namelist())
    missing: dict[str, set[str]] = {}
    for name in (n for n in names if n.endswith(".py")):
        for node in ast.walk(ast.parse(archive.read(name))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            for module in modules:
                path = module.replace(".", "/")
                if module.startswith("airflow_provider_cg") and module not in AIRFLOW_ONLY \
                        and f"{path}.py" not in names and f"{path}/__init__.py" not in names:
                    missing.setdefault(module, set()).add(name)
    assert not missing, f"imported by the driver's modules, not in its zip: {missing}"
    assert "airflow_provider_cg/core/landing/run/member.py" in names
    assert not any(n.startswith("airflow_provider_cg/core/tools/") for n in names)  # never on a driver


def _import_in_a_fresh_python(zip_path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(zip_path)}, cwd=zip_path.parent,
                          capture_output=True, text=True, timeout=60)


def test_the_zip_carries_bytecode_a_driver_imports_and_tracebacks_still_show_the_source(tmp_path):
    zip_path = build_core_zip(tmp_path / "cg_core.zip")
    names = set(zipfile.ZipFile(zip_path).namelist())
    assert {n + "c" for n in names if n.endswith(".py")} == {n for n in names if n.endswith(".pyc")}
    done = _import_in_a_fresh_python(zip_path, (
        "import traceback, airflow_provider_cg.core.durations as d\n"
        "print(d.__file__)\n"
        "try:\n    d.parse_duration(-1)\n"
        "except ValueError:\n    traceback.print_exc()\n"))
    assert done.stdout.strip().endswith("cg_core.zip/airflow_provider_cg/core/durations.pyc"), done
    assert 'File "airflow_provider_cg/core/durations.py"' in done.stderr, done.stderr  # named by its path in the zip...
    assert "raise ConfigError(field" in done.stderr, done.stderr  # ...with its source line


def test_bytecode_of_another_python_or_another_source_is_not_run(tmp_path):
    """A cluster's other Python version (another magic number) and a source changed after the
    bytecode was written both import the source as it is."""
    built = zipfile.ZipFile(build_core_zip(tmp_path / "cg_core.zip"))
    mixed = tmp_path / "mixed.zip"
    with zipfile.ZipFile(mixed, "w") as zf:
        for name in built.namelist():
            data = built.read(name)
            if name == "airflow_provider_cg/core/durations.pyc":
                data = b"\x00\x00\r\n" + data[4:]  # no Python's magic number
            if name == "airflow_provider_cg/core/errors.py":
                data += b"\nCHANGED_AFTER_THE_BYTECODE = True\n"
            zf.writestr(name, data)
    done = _import_in_a_fresh_python(mixed, (
        "import airflow_provider_cg.core.durations as d, airflow_provider_cg.core.errors as e\n"
        "print(d.__file__, e.CHANGED_AFTER_THE_BYTECODE)\n"))
    assert done.returncode == 0 and done.stdout.split() == [f"{mixed}/airflow_provider_cg/core/durations.py",
                                                            "True"], done
