"""The layout rules that import-linter does not check (docs/architecture.md).

* No module imports another module's private names: neither ``from gpupool.x import _name`` nor
  ``x._name`` on an imported gpupool module. A name used by another module is public in its own.
* No source file is over 600 lines, except those docs/architecture.md names under "Files over 600 lines",
  each with its reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "gpupool"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
MAX_LINES = 600


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_module(dotted: str) -> bool:
    base = SRC.parent.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def private_uses(path: Path, source: str) -> list[str]:
    """``file:line: what`` for each private name of another gpupool module that ``source`` imports or reads."""
    tree = ast.parse(source)
    me = _module_name(path) if path.is_relative_to(SRC) else ""
    found: list[str] = []
    aliases: dict[str, str] = {}  # local name -> gpupool module it names
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("gpupool.") and a.asname:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpupool"):
            if node.module == me:
                continue
            for a in node.names:
                if _is_private(a.name):
                    found.append(f"{path.name}:{node.lineno}: from {node.module} import {a.name}")
                elif _is_module(f"{node.module}.{a.name}"):  # ``from gpupool.engine import kernels``: a module
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and _is_private(node.attr) and aliases[node.value.id] != me):
            found.append(f"{path.name}:{node.lineno}: {aliases[node.value.id]}.{node.attr}")
    return found


def test_no_module_imports_private_names_of_another() -> None:
    found = [use for p in sorted(SRC.rglob("*.py")) for use in private_uses(p, p.read_text(encoding="utf-8"))]
    assert found == [], "private names used across modules (make them public where they live):\n" + "\n".join(found)


def test_private_use_check_sees_both_forms(tmp_path: Path) -> None:
    src = ("from gpupool.engine.filters import _spec_allowed, feasible\n"
           "from gpupool.engine import core\n"
           "from gpupool.engine.core import Engine\n"
           "import gpupool.k8s.wire as wire\n"
           "x = core._helper + wire._secret + core.Engine + Engine._class_private\n")
    uses = private_uses(tmp_path / "m.py", src)
    assert [u.split(": ", 1)[1] for u in uses] == [
        "from gpupool.engine.filters import _spec_allowed", "gpupool.engine.core._helper", "gpupool.k8s.wire._secret"]


def _allowed_long_files() -> dict[str, str]:
    """``src/gpupool/...py`` -> reason, from the doc's list of files over the limit."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("## Files over 600 lines", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^- `(src/gpupool/[^`]+\.py)`[^:]*: (.+)$",
                                                               section, re.M)}


def test_no_file_over_600_lines_unless_the_architecture_page_says_why() -> None:
    allowed = _allowed_long_files()
    long = {str(p.relative_to(ROOT)): sum(1 for _ in p.open(encoding="utf-8")) for p in SRC.rglob("*.py")}
    long = {k: v for k, v in long.items() if v > MAX_LINES}
    unexplained = sorted(f"{k} ({v} lines)" for k, v in long.items() if k not in allowed)
    assert unexplained == [], f"over {MAX_LINES} lines with no reason in docs/architecture.md: {unexplained}"
    stale = sorted(k for k in allowed if k not in long)
    assert stale == [], f"docs/architecture.md lists files that are no longer over {MAX_LINES} lines: {stale}"
