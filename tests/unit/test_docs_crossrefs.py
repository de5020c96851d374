"""The reference's hook (docs/_hooks/crossrefs.py) on what mkdocstrings renders: Sphinx roles
become links or code, private bases their public classes, and a role it cannot render is a
warning, which fails ``make docs`` (strict)."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from types import SimpleNamespace

HOOK = Path(__file__).resolve().parents[2] / "docs" / "_hooks" / "crossrefs.py"


def _hook():
    spec = importlib.util.spec_from_file_location("crossrefs", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _page(markdown: str):
    return SimpleNamespace(file=SimpleNamespace(content_string=markdown, src_path="reference/x.md"))


def test_roles_become_links_and_private_bases_their_public_classes(caplog):
    hook = _hook()
    html = ('<p>through :class:<code>NatsHook</code>, calls :class:<code>~airflow_provider_cg.core.groups.admin.'
            'ConsumerGroups</code> and :func:<code>len</code>.</p>'
            '<p class="doc doc-class-bases">\n Bases: <code><autoref identifier="airflow_provider_cg.operators.groups.'
            '_ConsumerGroupOperator" optional hover>_ConsumerGroupOperator</autoref></code></p>')
    with caplog.at_level(logging.WARNING):
        out = hook.on_page_content(html, page=_page("::: airflow_provider_cg.operators.groups\n"))
    assert ":class:" not in out and ":func:" not in out and not caplog.records
    assert '<autoref identifier="airflow_provider_cg.hooks.nats.NatsHook" optional hover><code>NatsHook</code>' in out
    assert "<code>ConsumerGroups</code>" in out and "<code>len</code>" in out
    assert "_ConsumerGroupOperator" not in out
    assert "MovesNoData" in out and 'title="airflow.sdk.bases.operator.BaseOperator">BaseOperator' in out


def test_a_role_left_unrendered_is_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        _hook().on_page_content("<p>see :class:`Foo`</p>", page=_page(""))
    assert any("Sphinx role :class: is left unrendered" in r.getMessage() for r in caplog.records)
