"""The zip a Spark driver gets with ``--py-files`` (``core/tools/packaging.py``) holds every
module of the provider that its modules import at module level or inside functions: a module
left out fails only on a cluster, at the first batch that needs it."""

from __future__ import annotations

import ast
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
