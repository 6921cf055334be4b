"""The package's import rules (docs/architecture.md): each stage imports only the stages below
it, no module imports the package's own modules inside a function, and no modules import each
other in a cycle. Read from the source files, so a new module is checked as soon as it exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parent.parent / "python" / "fastsearch"

#: What each part of the package may import from the rest of it (besides itself, ``errors`` and
#: ``_core``, which every part may use). The same table is drawn in docs/architecture.md.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "ir": set(),
    "database": set(),
    "testing": set(),
    "costmodel": {"ir"},
    "measure": {"ir"},
    "graph": {"ir"},
    "search": {"ir", "costmodel", "database"},
    "metaschedule": {"ir", "costmodel", "search"},
    "tvm": {"metaschedule"},
    "tuning": {"ir", "costmodel", "search", "measure", "database", "graph"},
    "cli": {"ir", "measure", "graph", "tuning", "testing"},
}
EVERYONE = {"errors", "_core"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, ast.Module]:
    return {_module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(SOURCE.rglob("*.py"))}


def _imports(tree: ast.Module) -> list[tuple[str, bool]]:
    """(imported fastsearch module, whether at module level) for every import in ``tree``."""
    top = set(map(id, tree.body))
    # Imports under ``if TYPE_CHECKING:`` or ``try:`` at module level count as module level.
    for node in tree.body:
        if isinstance(node, (ast.If, ast.Try)):
            top.update(id(n) for n in ast.walk(node))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "fastsearch":
            if node.module == "fastsearch":
                out.extend((f"fastsearch.{a.name}", id(node) in top) for a in node.names)
            else:
                out.append((node.module, id(node) in top))
        elif isinstance(node, ast.Import):
            out.extend((a.name, id(node) in top) for a in node.names if a.name.split(".")[0] == "fastsearch")
    return out


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


MODULES = _modules()


def test_every_part_is_in_the_table():
    parts = {_part(m) for m in MODULES} - {""} - EVERYONE
    assert parts <= set(ALLOWED), f"parts missing from ALLOWED: {sorted(parts - set(ALLOWED))}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _part(m)))
def test_imports_follow_the_stages(module: str):
    mine = _part(module)
    for imported, _ in _imports(MODULES[module]):
        theirs = _part(imported)
        if theirs in (mine, "") or theirs in EVERYONE:
            continue
        assert theirs in ALLOWED[mine], f"{module} imports {imported}: {mine} may not import {theirs}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_function_local_imports_of_the_package(module: str):
    local = [imported for imported, at_top in _imports(MODULES[module]) if not at_top]
    # A docstring's example is not code; everything else is imported at the top.
    assert not local, f"{module} imports {local} inside a function"


def test_no_import_cycle():
    graph = {
        m: {i for i, _ in _imports(t) if i in MODULES and i != m and m != "fastsearch"}
        for m, t in MODULES.items()
    }
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        if m in path:
            raise AssertionError("import cycle: " + " -> ".join([*path[path.index(m) :], m]))
        if m in done:
            return
        for n in sorted(graph[m]):
            visit(n, [*path, m])
        done.add(m)

    for m in sorted(graph):
        visit(m, [])


#: Longest function allowed, in lines, by language (issue 26's sizes).
MAX_PYTHON_LINES = 100
MAX_RUST_LINES = 150
RUST_SOURCE = SOURCE.parent.parent / "rust"


def test_no_python_function_is_too_long():
    long = [
        f"{name}.{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for name, tree in MODULES.items()
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_PYTHON_LINES
    ]
    assert not long, f"functions over {MAX_PYTHON_LINES} lines: {long}"


def _rust_functions(text: str) -> list[tuple[str, int]]:
    """(name, lines) of each function in rustfmt-formatted source: from its `fn` line to the
    closing brace at the same indentation."""
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)(?:pub(?:\([^)]*\))? )?(?:const )?fn (\w+)", line)
        if not m or line.rstrip().endswith(";"):
            continue
        close = m.group(1) + "}"
        end = next((j for j in range(i + 1, len(lines)) if lines[j] == close), i)
        out.append((m.group(2), end - i + 1))
    return out


def test_no_rust_function_is_too_long():
    long = [
        f"{path.relative_to(RUST_SOURCE)}: {name} ({n} lines)"
        for path in sorted(RUST_SOURCE.rglob("*.rs"))
        for name, n in _rust_functions(path.read_text())
        if n > MAX_RUST_LINES
    ]
    assert not long, f"functions over {MAX_RUST_LINES} lines: {long}"


def test_the_rust_core_exports_a_documented_facade():
    """The core crate's modules are private and its root re-exports what callers use, each item
    documented: `missing_docs` is a warning, which the lint run (`clippy -D warnings`) fails on."""
    lib = (RUST_SOURCE / "core" / "src" / "lib.rs").read_text()
    assert "#![warn(missing_docs)]" in lib
    public_modules = re.findall(r"^pub mod (\w+)", lib, flags=re.MULTILINE)
    assert not public_modules, f"public modules in lib.rs: {public_modules}"
    assert re.search(r"^pub use ", lib, flags=re.MULTILINE), "lib.rs re-exports nothing"
