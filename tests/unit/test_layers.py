"""The folders of the core form layers: each imports only from the layers beneath it, so a reader
finds a concept by going down, never around. A module or folder that is not placed here fails
too: a new one takes its layer in the list below (and its line in ``docs/architecture.md``).

A layer is a set of units (a folder, or a module beside the folders); an ``open`` layer's units
may import each other (the circle test keeps them from importing each other both ways), the
units of a closed one may not (one sink family never reaches into another)."""

from __future__ import annotations

from dataclasses import dataclass

from tests.unit.test_one_place import PACKAGE, SOURCES, import_graph


@dataclass(frozen=True)
class Layer:
    units: frozenset[str]
    open: bool = False


def layers(*spec: tuple[str, ...] | str) -> list[Layer]:
    """Bottom first; a tuple is an open layer, a string with spaces a closed one."""
    return [Layer(frozenset(s), open=True) if isinstance(s, tuple) else Layer(frozenset(s.split()))
            for s in spec]


CORE = f"{PACKAGE}.core"
LANDING = f"{CORE}.landing"
SINKS = f"{LANDING}.sinks"

#: the core: errors and durations beneath everything, then the protocol client, the groups, the
#: member job, and the tools beside it (never on a driver)
CORE_LAYERS = layers(("errors", "durations"), "jetstream", "groups", "landing", "streaming", ("tools", "__init__"))

#: the member job: the contract's words and the rows at the bottom, then the sinks, what Spark
#: does to a batch, the contract, the two-phase protocol, the read paths, and the run on top
LANDING_LAYERS = layers(("modes", "fields", "rows", "transform", "stream_life", "failpoints"),
                        "sinks", "pipeline", "contract", "protocol", "reads", ("run", "__init__"))

#: the sinks: what all share, the lake's protocol and PostgreSQL, the table formats on the lake,
#: and what chooses among the families (registry, options, opening, routing, maintenance)
SINK_LAYERS = layers("shared", "lake postgres", "delta iceberg",
                     ("registry", "options", "opening", "routing", "maintenance", "__init__"))


def unit_of(module: str, package: str) -> str | None:
    """The folder or module of ``package`` that ``module`` is in (``__init__`` for the package's
    own), or None outside it."""
    if module == package:
        return "__init__"
    if not module.startswith(package + "."):
        return None
    return module[len(package) + 1:].split(".")[0]


def reaching_up(graph: dict[str, set[str]], package: str, stack: list[Layer]) -> list[str]:
    """Every import inside ``package`` that goes to a higher layer or across a closed one, and
    every unit that no layer places."""
    where = {u: i for i, layer in enumerate(stack) for u in layer.units}
    found = []
    for source in sorted(graph):
        a = unit_of(source, package)
        if a is None:
            continue
        if a not in where:
            found.append(f"{source}: {a!r} is in no layer")
            continue
        for target in sorted(graph[source]):
            b = unit_of(target, package)
            if b is None or b == a:
                continue
            if b not in where:
                found.append(f"{target}: {b!r} is in no layer")
            elif where[b] > where[a] or (where[b] == where[a] and not stack[where[a]].open):
                found.append(f"{source} -> {target}")
    return found


def test_the_core_forms_layers():
    graph = import_graph()
    assert not reaching_up(graph, CORE, CORE_LAYERS)


def test_the_folders_of_landing_form_layers():
    graph = import_graph()
    assert not reaching_up(graph, LANDING, LANDING_LAYERS)


def test_the_sink_families_form_layers():
    graph = import_graph()
    assert not reaching_up(graph, SINKS, SINK_LAYERS)


def test_every_folder_of_the_core_is_placed():
    """Each layered package's folders are all in its stack (a new folder takes its place)."""
    for package, stack in ((CORE, CORE_LAYERS), (LANDING, LANDING_LAYERS), (SINKS, SINK_LAYERS)):
        placed = set().union(*(layer.units for layer in stack))
        units = {unit_of(m, package) for m in import_graph()} - {None}
        assert units <= placed, f"{package}: not in a layer: {sorted(units - placed)}"


def test_the_finder_finds_an_import_reaching_up_or_across():
    stack = layers(("a", "b"), "c d", "e")
    graph = {"p.a.x": {"p.b.y"}, "p.b.y": set(), "p.c.z": {"p.a.x", "p.d.w"}, "p.d.w": set(),
             "p.e": {"p.c.z"}, "p.a.v": {"p.e"}, "p.f": set()}
    assert reaching_up(graph, "p", stack) == ["p.a.v -> p.e", "p.c.z -> p.d.w", "p.f: 'f' is in no layer"]


def test_no_two_modules_of_the_core_share_a_name_but_the_families_roles():
    """A module's name says what it is: two modules of the core share one only when it is the
    same role in parallel places (each sink family's ``declaration``, ``writer``, ...; the
    registry of sinks and of read paths)."""
    roles = {"declaration.py", "writer.py", "reader.py", "maintenance.py", "registry.py", "__init__.py"}
    seen: dict[str, list[str]] = {}
    for p in SOURCES:
        rel = p.as_posix().split(f"/{PACKAGE}/core/", 1)
        if len(rel) == 2:
            seen.setdefault(p.name, []).append(rel[1])
    shared = {name: paths for name, paths in seen.items() if len(paths) > 1 and name not in roles}
    assert not shared, f"modules of the core that share a name: {shared}"
