"""No function over 80 lines in any folder of Python code: a function fits on a screen.

Every top-level folder with Python in it is read (``FOLDERS``; a test fails when a folder
holding tracked ``.py`` files is missing from it), the tests' own files included. Read from the
source with ``ast`` (nothing is imported); a function's length is from its ``def`` line to its
last line, docstring and decorators' lines after the ``def`` included. ``LONGER`` lists the
functions still over the limit, each with the length it has: one may only shrink (and leaves the
list once it fits), and none may join it.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("bench", "broker_impl", "faults", "harness", "plugins", "scripts", "spark_reports", "tests")
LIMIT = 80

#: Over the limit today, each to be split (then its entry deleted here): ``path::qualified name`` -> lines.
LONGER: dict[str, int] = {}


def lengths(root: Path, folders: tuple[str, ...]) -> dict[str, int]:
    """Every function and method under ``folders``: ``path::Class.name`` -> its lines."""
    out: dict[str, int] = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            out.update(_lengths(ast.parse(path.read_text(), rel), rel))
    return out


def _lengths(tree: ast.AST, rel: str, prefix: str = "") -> dict[str, int]:
    out: dict[str, int] = {}
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                out[f"{rel}::{name}"] = (node.end_lineno or node.lineno) - node.lineno + 1
            out.update(_lengths(node, rel, f"{name}."))
        else:
            out.update(_lengths(node, rel, prefix))
    return out


def test_no_function_is_longer_than_a_screen() -> None:
    found = lengths(REPO, FOLDERS)
    over = {name: n for name, n in found.items() if n > LIMIT}
    new = sorted(f"{name} ({n} lines)" for name, n in over.items() if name not in LONGER)
    grown = sorted(
        f"{name} ({n} lines, was {LONGER[name]})" for name, n in over.items() if n > LONGER.get(name, n)
    )
    assert not new, f"over {LIMIT} lines: split them\n  " + "\n  ".join(new)
    assert not grown, "a function on the list grew: split it instead\n  " + "\n  ".join(grown)


def test_every_folder_of_python_is_measured() -> None:
    git = shutil.which("git")
    if git is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are not known")
    tracked = subprocess.run(
        [git, "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    folders = {path.split("/")[0] for path in tracked if "/" in path}
    assert folders <= set(FOLDERS), f"add to FOLDERS: {sorted(folders - set(FOLDERS))}"


def test_the_list_of_longer_functions_only_shrinks() -> None:
    found = lengths(REPO, FOLDERS)
    stale = sorted(
        f"{name} (now {found.get(name, 'gone')}, listed {n})"
        for name, n in LONGER.items()
        if found.get(name, 0) < n
    )
    assert not stale, "shorter or gone: lower or delete its entry in LONGER\n  " + "\n  ".join(stale)


def test_the_measure_counts_nested_functions_and_methods_on_their_own(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(3))
    (tmp_path / "pkg" / "m.py").write_text(
        f"def f():\n{body}\n    def g():\n        return 1\n    return g\n\n"
        "class C:\n    async def h(self):\n        pass\n"
    )
    assert lengths(tmp_path, ("pkg",)) == {"pkg/m.py::f": 7, "pkg/m.py::f.g": 2, "pkg/m.py::C.h": 2}
