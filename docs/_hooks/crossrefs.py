"""MkDocs hook: the API reference as a reader sees it. The docstrings are Sphinx-style, as
Airflow's are (``:class:`~pkg.mod.Name```), which mkdocstrings leaves as literal text: each role
becomes a link to the object's entry where the site documents it (code, otherwise), and a class
whose base is private (``Bases: _ConsumerGroupOperator``) shows the public classes it inherits
from instead. A role left over fails the strict build."""

from __future__ import annotations

import importlib
import logging
import re
from typing import Any

log = logging.getLogger("mkdocs.hooks.crossrefs")

ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|attr|exc|obj|data):<code>(~?)([\w.]+)(\(\))?</code>")
BASES = re.compile(r'(<p class="doc doc-class-bases">\s*Bases: )(.*?)(</p>)', re.S)
BASE = re.compile(r'<code><(?:span title|autoref identifier)="([\w.]+)"[^>]*>[\w.]+</(?:span|autoref)></code>'
                  r'|<code>(?:<a [^>]*>)?[^<]*(?:</a>)?</code>')
PACKAGE = "airflow_provider_cg"


def _resolve(name: str, page_module: str | None) -> str:
    """The dotted path a role names: as written, or relative to the page's module."""
    if "." in name or page_module is None:
        return name
    try:
        obj = getattr(importlib.import_module(page_module), name)
    except (ImportError, AttributeError):
        return name
    if isinstance(obj, type) or callable(obj):  # where it is defined, as the reference lists it
        return f"{obj.__module__}.{obj.__qualname__}"
    return f"{page_module}.{name}"


def _role(match: re.Match[str], page_module: str | None) -> str:
    _, tilde, name, call = match.groups()
    target = _resolve(name, page_module)
    shown = (target.rsplit(".", 1)[-1] if tilde or "." not in name else name) + (call or "")
    if not target.startswith(PACKAGE):
        return f"<code>{shown}</code>"
    return f'<autoref identifier="{target}" optional hover><code>{shown}</code></autoref>'


def _public_bases(path: str) -> list[str]:
    """The public classes a private class stands for: its bases, private ones replaced in turn."""
    module, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return [path]
    out: list[str] = []
    for base in cls.__bases__:
        full = f"{base.__module__}.{base.__qualname__}"
        for public in (_public_bases(full) if base.__name__.startswith("_") else [full]):
            if public not in out:
                out.append(public)
    return out


def _bases(match: re.Match[str]) -> str:
    head, body, tail = match.groups()
    shown = []
    for base in BASE.finditer(body):
        path = base.group(1)
        if path and path.rsplit(".", 1)[-1].startswith("_"):
            for public in _public_bases(path):
                name = public.rsplit(".", 1)[-1]
                shown.append(f'<autoref identifier="{public}" optional hover><code>{name}</code></autoref>'
                             if public.startswith(PACKAGE) else f'<code><span title="{public}">{name}</span></code>')
        else:
            shown.append(base.group(0))
    return f"{head}{', '.join(shown)}{tail}"


def on_page_content(html: str, page: Any, **_: Any) -> str:
    modules = re.findall(r"^::: ([\w.]+)", page.file.content_string if page.file else "", re.M)
    page_module = modules[0] if len(modules) == 1 else None
    sections = re.split(r'(id="(airflow_provider_cg(?:\.\w+)+)")', html)
    out, current = [], page_module
    for i, part in enumerate(sections):  # roles resolve against the module whose entry they are in
        if i % 3 == 2:
            current = ".".join(p for p in part.split(".") if not p[:1].isupper()) or current
            continue
        out.append(ROLE.sub(lambda m, mod=current: _role(m, mod), part) if i % 3 == 0 else part)
    html = BASES.sub(_bases, "".join(out))
    for left in sorted(set(re.findall(r":(?:class|func|meth|mod|attr|exc|obj|data):", html))):
        log.warning("%s: a Sphinx role %s is left unrendered", page.file.src_path, left)
    return html
