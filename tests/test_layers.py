"""The packages of tilecraft form layers: a package imports only from the layers below its own.

``LAYERS`` is the rule that docs/architecture.md draws, lowest layer first. Every import
counts, at the top of a module or inside a function; only imports under
``if TYPE_CHECKING:`` are exempt, since they never run. Inside a package, modules may
import each other, but not in a cycle through their top-level imports (a cycle that only
a function-level import closes, such as a node's ``__str__`` calling its printer, is how
Python lets two modules of one package know each other).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "tilecraft"

LAYERS = [
    {"errors", "tables"},
    {"target"},
    {"te"},
    {"ops", "schedule"},
    {"ir", "graph"},
    {"codegen", "runtime", "frontend"},
    {"build"},
    {"database", "measure"},
    {"search"},
    {"tune"},
    {"model"},
    {"cli"},
]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str:
    """The top-level unit of ``tilecraft.x.y``: ``x`` (a subpackage or a module of the root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


@functools.cache  # every module is read by its own test and again by the cycle test
def imports_of(path: Path, root: Path = ROOT) -> list[tuple[str, int, bool]]:
    """(imported tilecraft module, line, at the top level) for every import of ``path`` that runs."""
    module = module_name(path, root)
    tree = ast.parse(path.read_text(), filename=str(path))
    top_level = {id(node) for node in tree.body}
    found = []
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # ``from . import te`` imports the module ``tilecraft.te``, not a name of ``tilecraft``
            names = [f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}", root) else base
                     for alias in node.names]
        else:
            continue
        found += [(name, node.lineno, id(node) in top_level) for name in dict.fromkeys(names)
                  if name.split(".")[0] == "tilecraft"]
    return found


def _statements(body: list[ast.stmt]):
    """Every statement in ``body`` and the blocks nested in it, but those under ``if TYPE_CHECKING:``.
    Imports are statements, so expressions are never walked (the whole tree is ten times as many nodes)."""
    for node in body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        yield node
        for block in ("body", "orelse", "finalbody", "handlers", "cases"):
            nested = getattr(node, block, None)
            if isinstance(nested, list):
                yield from _statements(nested)


def _is_module(name: str, root: Path) -> bool:
    path = root.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def layer_of(package: str) -> int:
    for index, layer in enumerate(LAYERS):
        if package in layer:
            return index
    raise AssertionError(f"tilecraft.{package} is in no layer: add it to LAYERS in tests/test_layers.py and to "
                         "the diagram in docs/architecture.md")


MODULES = sorted(ROOT.rglob("*.py"))


def test_every_package_has_a_layer():
    packages = {package_of(module_name(path)) for path in MODULES} - {""}
    for package in packages:
        layer_of(package)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_a_module_imports_only_from_lower_layers(path):
    source = package_of(module_name(path))
    if not source:  # tilecraft/__init__.py gathers the public API from every layer
        return
    wrong = [f"line {line}: {name}" for name, line, _ in imports_of(path)
             if package_of(name) not in ("", source) and layer_of(package_of(name)) >= layer_of(source)]
    assert not wrong, (f"tilecraft.{source} may import only from layers below its own ({LAYERS[:layer_of(source)]}); "
                       f"{path.name} imports {wrong}: move the code to the layer it belongs to")


def test_no_cycle_among_top_level_imports():
    graph = {module_name(path): {name for name, _, top in imports_of(path) if top} for path in MODULES}
    done: set[str] = set()

    def visit(module: str, trail: list[str]) -> None:
        if module in trail:
            cycle = trail[trail.index(module):] + [module]
            raise AssertionError(f"modules import each other at the top level: {' -> '.join(cycle)}")
        if module in done:
            return
        for imported in sorted(graph.get(module, ())):
            visit(imported, trail + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_the_checker_sees_an_import_against_the_layers(tmp_path):
    """The rule can fail: a function-level import of a higher layer is caught, a TYPE_CHECKING one is not."""
    fake = tmp_path / "tilecraft"
    (fake / "te").mkdir(parents=True)
    (fake / "search").mkdir()
    for package in (fake, fake / "te", fake / "search"):
        (package / "__init__.py").write_text("")
    (fake / "search" / "policy.py").write_text("")
    (fake / "te" / "expr.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..search.policy import SketchPolicy\n"
        "def f():\n    from ..search import policy\n")
    assert imports_of(fake / "te" / "expr.py", root=fake) == [("tilecraft.search.policy", 5, False)]
    assert layer_of("search") > layer_of("te")
