"""What a module imports, read from its source with ``ast`` (nothing is imported): for the
layering tests, which check who may import whom."""

from __future__ import annotations

import ast
import pathlib

#: Calls that import the module their first argument names.
IMPORT_CALLS = frozenset({"import_module", "__import__"})


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    """The dotted name of the module at ``path``, ``root`` being the directory on ``sys.path``."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: pathlib.Path, root: pathlib.Path) -> list[tuple[int, str]]:
    """(line, absolute module name) for each import in the module at ``path`` (under
    ``root``), wherever it is, inside functions too: ``import a.b``, ``from a.b import c``
    (relative ones resolved), and ``importlib.import_module("a.b")`` / ``__import__("a.b")``
    with a literal name."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - (node.level - 1)]
                found.append((node.lineno, ".".join([*base, *([node.module] if node.module else [])])))
            else:
                found.append((node.lineno, node.module or ""))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called in IMPORT_CALLS and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found
