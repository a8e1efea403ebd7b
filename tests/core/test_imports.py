"""The house reads top to bottom: every module of `wcoj_core` imports only modules of its own
floor or the floors below it (`FLOORS`), and no import cycle runs inside a floor.

Every module's source is parsed (`ast`, nothing imported) and every import in it counted — at
the top, under ``if TYPE_CHECKING:``, inside functions — because a back-edge hidden in a
function or a type annotation is still a floor that uses one above it. Importing ``a.b.c`` also
runs the ``__init__`` of ``a.b`` first, so that package counts too (unless the importer lives in
it: its package is initialised before it already). A cycle fails the test, named module by
module, with the line of each import on it.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "wcoj_core"

# The floors of `wcoj_core`, bottom first: a module by its name, a package's modules by
# ``name.*``. A new module must be placed on one (the test names it until it is).
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground", ("wcoj_core", "errors", "fence", "knobs", "memory", "arrow")),
    ("query", ("query", "query.*", "traces", "updates")),
    ("kernel", ("kernel", "kernel.*")),
    ("store", ("store", "store.*")),
    ("runtime", ("budget", "spill", "session", "spark", "deploy", "deploy.daemon")),
    (
        "arrangements",
        ("meaning", "lineage", "indexes", "state_read", "compaction", "aggregates", "ask"),
    ),
    ("io", ("generate", "input_read", "input_spark", "input_land")),
    ("served", ("served",)),
    ("deploy", ("deploy.*",)),
    ("epoch", ("epoch", "engine", "replay", "attach")),
    ("check", ("check", "check.*", "audit", "audit_sample", "reference")),
    ("cli", ("cli", "cli.*")),
)


def modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of `package` by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _known(name: str, known: Mapping[str, Path]) -> str | None:
    """The longest prefix of a dotted name that is one of the modules (None: outside them)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _targets(
    module: str, node: ast.Import | ast.ImportFrom, is_package: bool, known: Mapping[str, Path]
) -> Iterator[str]:
    """The modules one import statement of `module` names."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            source = ".".join([*base, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        # ``from a import b``: the module a.b when there is one, else a name of a.
        names = [
            f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names
        ]
    for name in names:
        target = _known(name, known)
        if target is None:
            continue
        yield target
        parent = target.rpartition(".")[0]
        while parent:
            if parent in known and not f"{module}.".startswith(f"{parent}."):
                yield parent  # its __init__ runs first
            parent = parent.rpartition(".")[0]


def import_graph(known: Mapping[str, Path]) -> dict[str, dict[str, int]]:
    """Each module's imports of the others, with the line of the first import of each."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        edges: dict[str, int] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _targets(module, node, path.name == "__init__.py", known):
                    if target != module:
                        edges[target] = min(edges.get(target, node.lineno), node.lineno)
        graph[module] = edges
    return graph


def cycles(graph: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """One cycle (a closed path of modules) in each strongly connected component that has one
    (breaking it may leave another in the same component: the test names what remains).

    >>> cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}})
    [['a', 'b', 'c', 'a']]
    >>> cycles({"a": {"b": 1}, "b": {}})
    []
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_closed_path(graph, set(c), c[0]) for c in sorted(components)]


def _closed_path(graph: Mapping[str, Mapping[str, int]], within: set[str], start: str) -> list[str]:
    """The shortest path from `start` back to itself inside one component (breadth first)."""
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        step = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in within:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return [*reversed(path), start]
                if w not in came:
                    came[w] = v
                    step.append(w)
        frontier = step
    raise AssertionError(f"{start} is on no cycle")


def describe(graph: Mapping[str, Mapping[str, int]], cycle: list[str]) -> str:
    """A cycle as its imports, each with the line it is made on."""
    known = modules()
    steps = [
        f"  {a} ({known[a].relative_to(ROOT)}:{graph[a][b]}) imports {b}"
        for a, b in itertools.pairwise(cycle)
    ]
    return " -> ".join(cycle) + "\n" + "\n".join(steps)


def test_wcoj_core_has_no_import_cycle() -> None:
    graph = import_graph(modules())
    found = cycles(graph)
    assert not found, "import cycles in wcoj_core:\n" + "\n".join(describe(graph, c) for c in found)


def floor_of(module: str, floors: Sequence[tuple[str, tuple[str, ...]]] = FLOORS) -> int | None:
    """The floor of a module (its index in `floors`): its own name's, else its package's
    ``.*`` pattern's, the nearest package first.

    >>> floor_of("wcoj_core.store.batches"), floor_of("wcoj_core.deploy"), floor_of("wcoj_core.x")
    (3, 4, None)
    """
    name = module.removeprefix(f"{PACKAGE}.") if module != PACKAGE else PACKAGE
    exact = {p: i for i, (_, patterns) in enumerate(floors) for p in patterns}
    if name in exact:
        return exact[name]
    while "." in name:
        name = name.rpartition(".")[0]
        if f"{name}.*" in exact:
            return exact[f"{name}.*"]
    return None


def upward(graph: Mapping[str, Mapping[str, int]]) -> list[str]:
    """Every import that runs up a floor, and every module on no floor, one line each."""
    known = modules()
    found = [f"{m} is on no floor: add it to FLOORS" for m in graph if floor_of(m) is None]
    for m, targets in sorted(graph.items()):
        here = floor_of(m)
        for target, line in sorted(targets.items()):
            there = floor_of(target)
            if here is None or there is None or there <= here:
                continue
            found.append(
                f"{m} ({FLOORS[here][0]}, {known[m].relative_to(ROOT)}:{line}) imports "
                f"{target} ({FLOORS[there][0]})"
            )
    return found


def test_no_import_runs_up_a_floor() -> None:
    found = upward(import_graph(modules()))
    assert not found, "imports that run up the floors of wcoj_core:\n" + "\n".join(found)


def test_an_import_up_a_floor_is_found() -> None:
    """The floor check is not vacuous: the store importing the engine is named."""
    graph = import_graph(modules())
    graph["wcoj_core.store.batches"] = {**graph["wcoj_core.store.batches"], "wcoj_core.engine": 7}
    assert any(line.startswith("wcoj_core.store.batches (store,") for line in upward(graph))


def test_the_walk_sees_every_kind_of_import(tmp_path: Path) -> None:
    """A cycle through a function-local import, a ``TYPE_CHECKING`` import, a relative import
    and a package's ``__init__`` is each found: the test above cannot pass by not looking."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg import b\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub.c import X\n"
    )
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.c import X\n")
    (pkg / "sub" / "c.py").write_text("from .. import a\nX = 1\n")
    (pkg / "d.py").write_text("import pkg.sub.c\n")
    graph = import_graph(modules(tmp_path, "pkg"))
    assert graph["pkg.a"] == {"pkg.b": 2}
    assert graph["pkg.b"] == {"pkg.sub.c": 3, "pkg.sub": 3}
    assert graph["pkg.sub.c"] == {"pkg.a": 1}  # its own package is not counted
    assert graph["pkg.d"] == {"pkg.sub.c": 1, "pkg.sub": 1}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]
