"""The code's layering: the engine never imports the UI at module level, nothing patches sys.path, one seed drawer."""

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


def test_the_engine_does_not_import_the_ui():
    for path in sorted((REPO / "engine").glob("*.py")):
        assert "diffgemma_ui" not in module_imports(path), path.name


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
