"""No import cycle among the collection's Python files (plugins/): a cycle makes the import order
matter and hides which module is the leaf (issue 25 found report/export.py <-> peer_export.py,
one side imported inside a function). The sources are parsed, not imported (tests/importscan.py),
so an import inside a function counts as one at the top.
"""
from __future__ import annotations

import os
from typing import Dict, List, Set

from importscan import imported_names  # tests/: the shared import scanner

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFIX = "ansible_collections.servelab.serving."


def plugin_modules(repo: str = REPO) -> Dict[str, str]:
    """Dotted module name (ansible_collections.servelab.serving.plugins...) -> its file."""
    out = {}
    for root, dirs, files in os.walk(os.path.join(repo, "plugins")):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(root, name), repo)[:-3].split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            out[PREFIX + ".".join(rel)] = os.path.join(root, name)
    return out


def import_graph(modules: Dict[str, str]) -> Dict[str, Set[str]]:
    """module -> the collection modules it imports (a `from pkg import mod` edge goes to mod)."""
    graph = {}
    for module, path in modules.items():
        with open(path, encoding="utf-8") as fh:
            names = imported_names(fh.read())
        graph[module] = {n for n in names if n in modules and n != module}
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative
    so a deep graph cannot hit the recursion limit), each sorted; sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
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
                    work.append((child, iter(sorted(graph.get(child, ())))))
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
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_the_cycle_finder_sees_a_cycle_through_a_hidden_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_follows_from_imports_of_modules(tmp_path):
    pkg = tmp_path / "plugins" / "plugin_utils"
    pkg.mkdir(parents=True)
    (pkg / "one.py").write_text(
        "def f():\n    from ansible_collections.servelab.serving.plugins.plugin_utils import two\n")
    (pkg / "two.py").write_text(
        "from ansible_collections.servelab.serving.plugins.plugin_utils.one import f\n")
    graph = import_graph(plugin_modules(str(tmp_path)))
    assert cycles(graph) == [[PREFIX + "plugins.plugin_utils.one",
                              PREFIX + "plugins.plugin_utils.two"]]


def test_plugins_have_no_import_cycle():
    modules = plugin_modules()
    assert PREFIX + "plugins.plugin_utils.report.export" in modules
    found = cycles(import_graph(modules))
    assert found == [], "import cycles in plugins/ (move what both sides need to a leaf module): " + \
        "; ".join(" <-> ".join(m[len(PREFIX):] for m in c) for c in found)
