"""The code's layering: the engine never imports the UI, no import cycles, few imports inside functions, nothing
patches sys.path, one seed drawer."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PRODUCT = ("engine", "diffgemma_ui", "standin", "deploy", "training", "tests")


def module_imports(path: Path) -> set[str]:
    """Top-level module names imported at module level by the file at `path`."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def all_imports(path: Path) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in the file at `path`, inside functions too (`from __future__` left out)."""
    return [node for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Import) or isinstance(node, ast.ImportFrom) and node.module != "__future__"]


def project_modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the project (a package by its __init__.py)."""
    modules = {"app": REPO / "app.py"}
    for folder in (*PRODUCT[:-1], "benchmarks"):
        for path in (REPO / folder).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules the module `name` at `path` imports anywhere in it (a package's name: its __init__)."""
    def known(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found = set()
    for node in all_imports(path):
        if isinstance(node, ast.Import):
            found |= {known(alias.name) for alias in node.names}
            continue
        base = node.module or ""
        if node.level:
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = ".".join(filter(None, (package, node.module)))
        found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else known(base) for alias in node.names}
    return found - {None, name}


def test_the_engine_does_not_import_the_ui():
    for path in sorted((REPO / "engine").glob("*.py")):
        assert "diffgemma_ui" not in module_imports(path), path.name
        names = {node.module or "" if isinstance(node, ast.ImportFrom) else alias.name
                 for node in all_imports(path) for alias in node.names}
        assert not any(name.startswith("diffgemma_ui") for name in names), path.name  # inside functions neither


def test_no_import_cycles():
    modules = project_modules()
    graph = {name: imported_modules(name, path, modules) for name, path in modules.items()}
    assert graph["app"] >= {"diffgemma_ui", "engine"} and "engine.settings" in graph["engine.cli"]
    done, path = set(), []

    def visit(name):
        assert name not in path, " -> ".join([*path[path.index(name):], name])
        if name not in done:
            path.append(name)
            for imported in sorted(graph[name]):
                visit(imported)
            path.pop()
            done.add(name)

    for name in sorted(graph):
        visit(name)


def test_at_most_five_imports_inside_functions_each_saying_why():
    files = [REPO / "app.py", *(p for folder in (*PRODUCT, "benchmarks") for p in (REPO / folder).rglob("*.py"))]
    inside = set()
    for path in files:
        lines = path.read_text().splitlines()
        for function in ast.walk(ast.parse(path.read_text())):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inside |= {(str(path.relative_to(REPO)), node.lineno, lines[node.lineno - 1])
                           for node in ast.walk(function) if isinstance(node, (ast.Import, ast.ImportFrom))}
    assert 1 <= len(inside) <= 5, sorted(inside)
    assert all("# noqa: PLC0415 - " in line for _, _, line in inside), sorted(inside)


def test_no_file_patches_sys_path():
    files = [REPO / "app.py", *(p for folder in (*PRODUCT, "benchmarks") for p in (REPO / folder).rglob("*.py"))]
    assert len(files) > 50
    patching = re.compile(r"sys\.path\s*(\.(insert|append|extend)\(|(\[[^]]*\])?\s*\+?=[^=])")
    patched = [str(p.relative_to(REPO)) for p in files if patching.search(p.read_text()) and p.name != "test_layers.py"]
    assert patched == []
    assert patching.search("sys.path[:0] = [x]") and patching.search("sys.path.insert(0, x)")
    assert not patching.search("sys.path == before")


def test_seeds_are_drawn_in_one_place():
    files = [*(REPO / "engine").glob("*.py"), *(REPO / "diffgemma_ui").glob("*.py"), REPO / "app.py"]
    drawers = [p.name for p in files
               if any(word in p.read_text() for word in ("randbits(", "import random", "SystemRandom", "randrange("))]
    assert drawers == ["settings.py"]
