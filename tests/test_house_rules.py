"""The house rules, checked: short modules and functions, no import cycles, layers, public surfaces.

`make lint` runs this file; the suite runs it too. The rules (docs/development.md):

- a module of the library or the example agents is at most MAX_MODULE_LINES lines, a function at most
  MAX_FUNCTION_LINES (its docstring not counted), unless named below with the reason;
- no import cycle between modules, counting imports inside functions (only ``if TYPE_CHECKING:``
  imports, which never run, are left out);
- layers: ``handlers`` (the agent side) imports none of the others, ``policy_server`` only
  ``handlers``, ``trainer`` ``handlers`` and ``policy_server``; none of the three imports ``agents``
  (``rft demo``'s entry point is named as a string in ``handlers/cli.py``'s table);
- across top-level packages, a module imports another package's public surface only: the package
  or one of its sub-packages (an ``__init__``), never a module inside it;
- ``bench/`` imports nothing from ``tests/``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("handlers", "policy_server", "trainer")
CHECKED = (*LIBRARY, "agents")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

# What each top-level package may import of the others.
ALLOWED_LAYERS: dict[str, set[str]] = {
    "handlers": set(),
    "policy_server": {"handlers"},
    "trainer": {"handlers", "policy_server"},
    "agents": {"handlers", "policy_server", "trainer"},
}

# Named exceptions: "path" or "path:Qualified.name" -> why it may be longer.
LONG_MODULES: dict[str, str] = {}
LONG_FUNCTIONS: dict[str, str] = {}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module's dotted name
    target: str  # the imported module or package's dotted name
    line: int


def module_files(roots: tuple[str, ...] = CHECKED) -> Iterator[Path]:
    for root in roots:
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield path


def dotted(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package(name: str) -> bool:
    return (REPO_ROOT / Path(*name.split(".")) / "__init__.py").is_file()


def is_module(name: str) -> bool:
    path = REPO_ROOT / Path(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file() or path.is_dir()


def _type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, wherever it stands (``if TYPE_CHECKING:`` left out)."""
    for child in ast.iter_child_nodes(node):
        if _type_checking_block(child):
            continue
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        yield from _import_nodes(child)


def _absolute(module: str | None, level: int, source: str, package: bool) -> str:
    if not level:
        return module or ""
    base = source.split(".") if package else source.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def imports_of(path: Path) -> Iterator[Import]:
    """The project modules ``path`` imports: ``from p import m`` counts as m when m is a module."""
    source = dotted(path)
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = _absolute(node.module, node.level, source, path.name == "__init__.py")
            names = [
                f"{base}.{alias.name}" if is_module(f"{base}.{alias.name}") else base for alias in node.names
            ]
        for name in dict.fromkeys(names):
            if name.split(".")[0] in (*CHECKED, "tests", "bench"):
                yield Import(source, name, node.lineno)


def _function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    assert node.end_lineno is not None
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        assert first.end_lineno is not None
        lines -= first.end_lineno - first.lineno + 1
    return lines


def _functions(
    node: ast.AST, prefix: str = ""
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            yield f"{prefix}{child.name}", child
            yield from _functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")


def _relative(path: Path) -> str:
    return path.relative_to(REPO_ROOT).as_posix()


def test_modules_are_short() -> None:
    long = [
        f"{_relative(path)}: {lines} lines"
        for path in module_files()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
        and _relative(path) not in LONG_MODULES
    ]
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concern): {long}"


def test_functions_are_short() -> None:
    long = []
    for path in module_files():
        for name, node in _functions(ast.parse(path.read_text())):
            lines = _function_lines(node)
            if lines > MAX_FUNCTION_LINES and f"{_relative(path)}:{name}" not in LONG_FUNCTIONS:
                long.append(f"{_relative(path)}:{node.lineno} {name}: {lines} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines, docstring aside: {long}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
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
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def test_no_import_cycles() -> None:
    graph: dict[str, set[str]] = {}
    for path in module_files():
        graph.setdefault(dotted(path), set()).update(
            found.target for found in imports_of(path) if found.target != dotted(path)
        )
    cycles = _cycles(graph)
    assert not cycles, f"import cycles (imports inside functions count): {cycles}"


def test_layers_and_public_surfaces() -> None:
    wrong = []
    for path in module_files():
        own = dotted(path).split(".")[0]
        for found in imports_of(path):
            other = found.target.split(".")[0]
            where = f"{_relative(path)}:{found.line} imports {found.target}"
            if other == own:
                continue
            if other not in ALLOWED_LAYERS[own]:
                wrong.append(f"{where}: {own} may import only {sorted(ALLOWED_LAYERS[own]) or 'itself'}")
            elif not is_package(found.target):
                wrong.append(f"{where}: import {other}'s public surface (the package or a sub-package)")
    assert not wrong, "\n".join(wrong)


def test_bench_imports_no_tests() -> None:
    wrong = [
        f"{_relative(path)}:{found.line} imports {found.target}"
        for path in module_files(("bench",))
        for found in imports_of(path)
        if found.target.split(".")[0] == "tests"
    ]
    assert not wrong, f"bench/ may not import tests/ (move shared code where both may import it): {wrong}"


def test_the_checks_catch_what_they_check(tmp_path: Path) -> None:
    """The cycle finder sees a cycle, and an import inside a function counts."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    tree = ast.parse("import os\ndef f():\n    from x import y\nif TYPE_CHECKING:\n    import z\n")
    assert [type(node).__name__ for node in _import_nodes(tree)] == ["Import", "ImportFrom"]
    function = ast.parse('def f():\n    """Doc\n    string."""\n    return 1\n').body[0]
    assert isinstance(function, ast.FunctionDef) and _function_lines(function) == 2


@pytest.mark.parametrize("root", CHECKED)
def test_every_checked_root_exists(root: str) -> None:
    assert any(module_files((root,))), f"{root}/ has no Python modules: the house rules would check nothing"
