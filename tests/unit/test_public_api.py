"""The stated public API: each module a DAG, a transformation or a tool imports from
(``airflow_provider_cg.PUBLIC_MODULES``) states its names in ``__all__``, every one of them
exists, the reference pages render exactly these modules, and what the docs and the example
DAGs import from them is public."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from airflow_provider_cg import PUBLIC_MODULES

ROOT = Path(__file__).resolve().parents[2]


def test_every_public_module_states_its_names_and_each_exists():
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        stated = getattr(module, "__all__", None)
        assert stated, f"{name} states no __all__"
        assert len(stated) == len(set(stated)), f"{name}: a name twice in __all__"
        missing = [n for n in stated if not hasattr(module, n)]
        assert not missing, f"{name}.__all__ names what it does not have: {missing}"


def test_the_reference_renders_the_public_modules_and_no_other():
    rendered = {m for page in (ROOT / "docs" / "reference").glob("*.md")
                for m in re.findall(r"^::: ([\w.]+)", page.read_text(), re.M)}
    assert rendered == set(PUBLIC_MODULES), (sorted(rendered - set(PUBLIC_MODULES)),
                                             sorted(set(PUBLIC_MODULES) - rendered))
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^\s+filters: public\b", config, re.M), "mkdocstrings must render a module's __all__ only"


def test_what_the_docs_and_the_example_dags_import_from_a_public_module_is_public():
    found = []
    sources = [*(ROOT / "dags").glob("*.py"), *(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]
    for path in sources:
        text = path.read_text()
        blocks = re.findall(r"```python\n(.*?)```", text, re.S) if path.suffix == ".md" else [text]
        for block in blocks:
            try:
                tree = ast.parse(block)
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module in PUBLIC_MODULES:
                    public = importlib.import_module(node.module).__all__
                    found += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names
                              if a.name not in public]
    assert not found, "imported but not in the module's __all__:\n" + "\n".join(found)
