"""What a Python source imports, read with ast (nothing is imported): the one scanner the
module_utils import test and the installed-collection test share."""
from __future__ import annotations

import ast

HEAVY = ("pandas", "matplotlib", "numpy")   # controller-only libraries: never in module_utils


def imports(source: str):
    """(module name, line, guarded) for every import in a source; guarded = inside a `try` whose
    handlers catch ImportError (or a parent of it). importlib.import_module("x") and
    __import__("x") with a literal name count as imports of x."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def guarded(node):
        while node in parents:
            child, node = node, parents[node]
            if isinstance(node, ast.Try) and child in node.body:
                for handler in node.handlers:
                    names = []
                    if handler.type is None:
                        return True
                    for t in (handler.type.elts if isinstance(handler.type, ast.Tuple)
                              else [handler.type]):
                        names.append(getattr(t, "id", getattr(t, "attr", "")))
                    if {"ImportError", "ModuleNotFoundError", "Exception"} & set(names):
                        return True
        return False

    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__")):
            names = [node.args[0].value]
        found += [(name, node.lineno, guarded(node)) for name in names]
    return found


def heavy_imports(source: str, heavy=HEAVY):
    """(name, line) of every import of a `heavy` library, guarded or not."""
    return [(name, line) for name, line, _guarded in imports(source) if name.split(".")[0] in heavy]


def imported_names(source: str):
    """Every dotted name an import statement names, hidden ones too: `import a.b` gives a.b and
    `from a import b, c` gives a, a.b and a.c (b may be a module or a name in a: the caller knows
    which exist). The import-cycle test reads the graph from these."""
    found = [name for name, _line, _guarded in imports(source)]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [node.module + "." + alias.name for alias in node.names if alias.name != "*"]
    return found
