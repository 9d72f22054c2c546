"""The package's import graph has no cycle, module by module.

Every import counts: module level, function-local and ``if TYPE_CHECKING:``
alike (grimp reads them all), so a cycle cannot hide behind a deferred import.
A failure prints one cycle of each knot found.
"""

from __future__ import annotations

from pathlib import Path

import grimp

import rateloop

#: No module owns more than one concept's worth of code (ARCHITECTURE: under ~500 lines).
MAX_MODULE_LINES = 500


def _graph() -> dict[str, list[str]]:
    graph = grimp.build_graph(
        "rateloop", exclude_type_checking_imports=False, cache_dir=None
    )
    return {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}


def _knots(edges: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components with a cycle in them (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    knots: list[list[str]] = []
    for root, imported in edges.items():
        if root in index:
            continue
        work = [(root, iter(imported))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges[node]:
                    knots.append(sorted(component))
    return knots


def _one_cycle(edges: dict[str, list[str]], knot: list[str]) -> list[str]:
    """A shortest cycle through the knot's first module, staying inside the knot."""
    members = set(knot)
    start = knot[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in edges[node]:
                if child == start:
                    return [*paths[node], start]
                if child in members and child not in paths:
                    paths[child] = [*paths[node], child]
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover


def test_the_import_graph_has_no_cycle() -> None:
    edges = _graph()
    found = _knots(edges)
    shown = "\n".join(" -> ".join(_one_cycle(edges, knot)) for knot in found)
    assert not found, f"import cycles:\n{shown}"


def test_no_module_is_over_500_lines() -> None:
    root = Path(rateloop.__file__).parent
    sizes = {
        str(path.relative_to(root)): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(root.rglob("*.py"))
    }
    assert len(sizes) > 100  # the whole package was read
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_the_search_finds_knots_and_self_imports() -> None:
    edges = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"], "e": ["e"]}
    assert sorted(_knots(edges)) == [["a", "b", "c"], ["e"]]
    assert _one_cycle(edges, ["a", "b", "c"]) == ["a", "b", "c", "a"]
