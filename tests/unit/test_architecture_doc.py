"""``docs/architecture.md`` stays true: its module tree names every module of the package, of
``spark_apps/`` and of ``dags/`` (and nothing that is gone), so a module added or moved without
its line there fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
_PATH = re.compile(r"^[A-Za-z0-9_./]+(/|\.py)$")


def documented_paths() -> set[str]:
    """The paths the first code block's tree names: a line's first word, joined to the folders
    it is indented under (``sinks/shared/declaration.py`` under ``landing/`` is
    ``.../landing/sinks/shared/declaration.py``)."""
    text = DOC.read_text()
    block = text.split("```", 2)[1]
    out: set[str] = set()
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        word = line.split()[0]
        if not _PATH.match(word):
            continue  # a description's continuation
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (stack[-1][1] if stack else "") + word
        if word.endswith("/"):
            stack.append((indent, path))
        else:
            out.add(path)
    return out


def modules() -> set[str]:
    found = set()
    for base in ("airflow_provider_cg", "spark_apps", "dags"):
        for p in (ROOT / base).rglob("*.py"):
            rel = p.relative_to(ROOT).as_posix()
            if p.name == "__init__.py" and rel != "airflow_provider_cg/__init__.py":
                continue
            found.add(rel)
    return found


def test_the_architecture_doc_names_every_module_and_no_other():
    documented, actual = documented_paths(), modules()
    missing, gone = sorted(actual - documented), sorted(documented - actual)
    assert not missing, f"modules without a line in docs/architecture.md: {missing}"
    assert not gone, f"docs/architecture.md names modules that do not exist: {gone}"
