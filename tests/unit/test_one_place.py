"""One place per concept, kept so: the package's modules import no circle (a function-level or
``TYPE_CHECKING`` import counts too: it is still a dependency a reader follows), and no module
compares a sink's or a layout's name but that sink's or layout's own (its family's folder under
``sinks/``, ``groups/layouts/``): everything else asks the registry or the layout object; read modes,
payload formats and stop reasons are ``core/landing/modes.py``'s members, never spelled."""

from __future__ import annotations

import ast
from pathlib import Path

from airflow_provider_cg.core.groups import layouts
from airflow_provider_cg.core.landing.modes import PayloadFormat, ReadMode, StopReason
from airflow_provider_cg.core.landing.sinks.registry import sink_kinds, sink_names

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "airflow_provider_cg"
SOURCES = [*sorted((ROOT / PACKAGE).rglob("*.py")), *sorted((ROOT / "spark_apps").rglob("*.py"))]


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {_module(p): p for p in SOURCES if p.is_relative_to(ROOT / PACKAGE)}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith(PACKAGE)]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_imports_no_circle():
    found = cycles(import_graph())
    assert not found, f"modules that import each other: {found}"


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _own(path: Path, where: str) -> bool:
    return where in path.relative_to(ROOT).as_posix()


def name_comparisons(source: str, label: str, names: set[str], constants: frozenset[str] = frozenset()) -> list[str]:
    """``x == "delta"``, ``x in ("delta", ...)``, ``match`` cases: a name compared as a string,
    or as one of the ``constants`` that spell it (``x == PARTITION_STREAMS``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                values = list(operand.elts) if isinstance(operand, ast.Tuple | ast.List | ast.Set) else [operand]
                hits = [v.value for v in values if isinstance(v, ast.Constant) and v.value in names]
                hits += [v.id if isinstance(v, ast.Name) else v.attr for v in values
                         if isinstance(v, ast.Name) and v.id in constants
                         or isinstance(v, ast.Attribute) and v.attr in constants]
                if hits:
                    found.append(f"{label}:{node.lineno}: {hits[0]!r}")
        elif isinstance(node, ast.MatchValue) and isinstance(node.value, ast.Constant) and node.value.value in names:
            found.append(f"{label}:{node.lineno}: {node.value.value!r}")
    return found


def family_of(kind) -> str:
    """The folder under ``sinks/`` a sink's declaration lives in (``sinks/<family>/declaration.py``)."""
    return type(kind).__module__.split(".")[-2]


def test_no_module_but_a_sinks_own_compares_a_sink_name():
    names = set(sink_names())
    assert {family_of(k) for k in sink_kinds()} == {"lake", "delta", "iceberg", "postgres"}
    found = []
    for p in SOURCES:
        # a family's modules may spell its own sink's name, no other
        own = {k.name for k in sink_kinds() if _own(p, f"core/landing/sinks/{family_of(k)}/")}
        found += name_comparisons(p.read_text(), str(p.relative_to(ROOT)), names - own)
    assert not found, "ask the registry (sinks/registry.py) instead:\n" + "\n".join(found)


def test_no_module_but_a_layouts_own_compares_a_layout_name():
    names = {*layouts.NAMES, layouts.DRAINING, layouts.FILLING}
    constants = frozenset({"WORK_QUEUE", "PARTITION_STREAMS", "DRAINING", "FILLING", "DEFAULT"})
    found = [hit for p in SOURCES if not _own(p, "core/groups/layouts/")
             for hit in name_comparisons(p.read_text(), str(p.relative_to(ROOT)), names, constants)]
    assert not found, "ask the layout object (groups/layouts/) instead:\n" + "\n".join(found)


def test_the_comparison_finder_finds_them():
    sample = 'if sink == "delta" or kind in ("x", "iceberg") or name != "parquet" or x == gl.DRAINING:\n    pass\n'
    assert len(name_comparisons(sample, "sample", {"delta", "iceberg"})) == 2
    assert len(name_comparisons(sample, "sample", set(), frozenset({"DRAINING"}))) == 1


def test_every_package_of_the_source_tree_is_in_the_wheel():
    """``setup.cfg`` lists the packages: one missing there is missing from the wheel users install."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = {p.strip() for p in cfg["options"]["packages"].split() if p.strip()}
    on_disk = {".".join(d.relative_to(ROOT).parts) for d in (ROOT / PACKAGE).rglob("*")
               if d.is_dir() and (d / "__init__.py").exists()} | {PACKAGE}
    assert on_disk <= listed, f"packages not in setup.cfg's packages: {sorted(on_disk - listed)}"


def mode_comparisons(source: str, label: str) -> list[str]:
    """A read mode or payload format compared as text: ``spec.read == "executors"``,
    ``payload_format in ("json", "avro")``, ``self.kind != "raw"`` (an SQL type ``"text"`` or a
    substring test is not one)."""
    names = {str(m) for m in (*ReadMode, *PayloadFormat)}
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        if not any(any(w in ast.unparse(o) for w in ("read", "payload_format", "kind")) for o in operands
                   if not isinstance(o, ast.Constant | ast.Tuple)):
            continue
        found += name_comparisons(ast.unparse(node), f"{label}:{node.lineno}", names)
    return found


def test_the_mode_comparison_finder_finds_them():
    sample = ('a = spec.read == "executors"\nb = payload_format in ("json", "avro")\nc = self.kind != "raw"\n'
              'd = typ == "text"\ne = "avro" in text.lower()\nf = spec.read is ReadMode.AUTO\n')
    assert len(mode_comparisons(sample, "sample")) == 3


def test_no_module_but_modes_compares_a_read_mode_or_a_payload_format_as_text():
    found = [hit for p in SOURCES if not _own(p, "core/landing/modes.py")
             for hit in mode_comparisons(p.read_text(), str(p.relative_to(ROOT)))]
    assert not found, "compare ReadMode / PayloadFormat members (core/landing/modes.py) instead:\n" + "\n".join(found)


def stop_reasons_as_text(source: str, label: str) -> list[str]:
    """A stop reason written as a string: ``x.stop_reason = "pin lost"`` (or in a tuple
    assignment), ``stop_reason="..."``, ``revoke("...")``, ``return "..."`` in ``reason()``, and
    a comparison with one."""
    reasons = {str(r) for r in StopReason}
    found = []

    def text(node: ast.AST | None) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, str)

    for node in ast.walk(ast.parse(source)):
        values: list[ast.AST | None] = []
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and target.attr == "stop_reason":
                    values.append(node.value)
                elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    values += [v for t, v in zip(target.elts, node.value.elts, strict=False)
                               if isinstance(t, ast.Attribute) and t.attr == "stop_reason"]
        elif isinstance(node, ast.keyword) and node.arg == "stop_reason":
            values.append(node.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "revoke":
            values += node.args
        elif isinstance(node, ast.FunctionDef) and node.name == "reason":
            values += [n.value for n in ast.walk(node) if isinstance(n, ast.Return)]
        elif isinstance(node, ast.Compare):
            values += [v for v in [node.left, *node.comparators] if text(v) and v.value in reasons]  # type: ignore[attr-defined]
        for v in values:
            branches = [v.body, v.orelse] if isinstance(v, ast.IfExp) else [v]
            found += [f"{label}:{node.lineno}: {b.value!r}" for b in branches if text(b)]  # type: ignore[union-attr]
    return found


def test_stop_reasons_are_written_as_stop_reasons():
    found = [hit for p in SOURCES if not _own(p, "core/landing/modes.py")
             for hit in stop_reasons_as_text(p.read_text(), str(p.relative_to(ROOT)))]
    assert not found, "a StopReason (core/landing/modes.py), or a sentence with details (an f-string):\n" + \
        "\n".join(found)


def test_the_stop_reason_finder_finds_them():
    sample = ('s.stop_reason = "pin lost"\ns.result, s.stop_reason = 1, "x"\nf(stop_reason="y")\n'
              'stop.revoke("z")\nok = s.stop_reason = StopReason.PIN_LOST\n'
              's.stop_reason = "a" if c else StopReason.PIN_LOST\nif r == "pin lost": pass\n'
              'def reason(self):\n    return "max_bytes"\n')
    assert len(stop_reasons_as_text(sample, "sample")) == 7
