"""The contract lives in ``harness.spec``: the harness imports no plugin, fault or checker
module, plugins, faults and checkers import nothing of the harness but its contract, and the
contract imports nothing of the harness outside ``harness.spec``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PARTS = ("faults", "plugins", "spark_reports", "broker_impl")
#: What a part may import from the harness: the package (which re-exports the contract) and the spec.
CONTRACT = ("harness", "harness.spec")


def imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return out


def test_importing_every_harness_module_loads_no_plugin_fault_or_checker() -> None:
    code = (
        "import importlib, pkgutil, sys, harness\n"
        "for m in pkgutil.walk_packages(harness.__path__, 'harness.'):\n"
        "    if m.name != 'harness.pytest_plugin':\n"
        "        importlib.import_module(m.name)\n"
        f"print(sorted(n for n in sys.modules if n.split('.')[0] in {PARTS!r}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize(
    "path", sorted(p.relative_to(REPO) for p in (REPO / "harness").rglob("*.py")), ids=str
)
def test_no_harness_module_imports_a_part(path: Path) -> None:
    bad = [m for m in imports(REPO / path) if m.split(".")[0] in PARTS]
    assert not bad, f"{path} imports {bad}"


@pytest.mark.parametrize(
    "path", sorted(p.relative_to(REPO) for part in PARTS[:3] for p in (REPO / part).rglob("*.py")), ids=str
)
def test_parts_import_only_the_contract(path: Path) -> None:
    bad = [
        m
        for m in imports(REPO / path)
        if m.split(".")[0] == "harness" and m not in CONTRACT and not m.startswith("harness.spec.")
    ]
    assert not bad, f"{path} imports harness internals {bad}; use harness.spec"


def _is_module(name: str) -> bool:
    base = REPO.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def every_import(source: str, module: str) -> list[tuple[int, str]]:
    """Every module an ``import`` in ``source`` (the text of ``module``) names, with its line: at
    module level, inside a function or class, and under ``if TYPE_CHECKING:`` alike. Relative
    imports are resolved against the module's package; ``from a import b`` names ``a.b`` when
    ``b`` is a module, else ``a``."""
    package = module.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            frm = ".".join([*base, *([node.module] if node.module else [])])
            for a in node.names:
                out.append((node.lineno, f"{frm}.{a.name}" if _is_module(f"{frm}.{a.name}") else frm))
    return sorted(set(out))


def machinery(source: str, module: str) -> list[str]:
    """The harness modules outside ``harness.spec`` that ``module`` imports, as ``name (line n)``;
    the ``harness`` package itself is one of them (its ``__init__`` is the harness's)."""
    return [
        f"{m} (line {line})"
        for line, m in every_import(source, module)
        if m.split(".")[0] == "harness" and m != "harness.spec" and not m.startswith("harness.spec.")
    ]


def module_name(path: Path) -> str:
    parts = path.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize(
    "path", sorted(p.relative_to(REPO) for p in (REPO / "harness" / "spec").rglob("*.py")), ids=str
)
def test_the_contract_imports_none_of_the_harness_machinery(path: Path) -> None:
    """The spec sits at the bottom and stands alone: it imports no harness module outside
    ``harness.spec``, not inside a function and not for typing either. A run, the history
    writer or the runner appear in it only as protocols (``harness.spec.hooks.Run``,
    ``harness.spec.history.Recorder``); the scenario model and the errors live in it."""
    bad = machinery((REPO / path).read_text(), module_name(path))
    assert not bad, f"{path} imports harness machinery {bad}; describe what it needs in harness.spec"


def test_the_spec_check_sees_every_kind_of_import() -> None:
    """The check above on a planted module of ``harness.spec``: a harness import at module level,
    inside a function, under TYPE_CHECKING, relative, or of a name from the ``harness`` package
    is each caught; imports of the spec itself (absolute or relative), of the standard library
    and of third-party packages are not."""
    source = (
        "from __future__ import annotations\n"  # 1
        "from typing import TYPE_CHECKING\n"  # 2
        "import pluggy\n"  # 3
        "from harness.spec.errors import ScenarioError\n"  # 4
        "from . import history\n"  # 5
        "from .fault import Fault\n"  # 6
        "from harness import spec\n"  # 7
        "from harness.errors import ClusterError\n"  # 8
        "if TYPE_CHECKING:\n"  # 9
        "    from harness.runner import Run\n"  # 10
        "def f():\n"  # 11
        "    import harness.store\n"  # 12
        "    from .. import nemesis\n"  # 13
        "    from ..scenario import load\n"  # 14
        "    from harness import hookimpl\n"  # 15
    )
    assert machinery(source, "harness.spec.planted") == [
        "harness.errors (line 8)",
        "harness.runner (line 10)",
        "harness.store (line 12)",
        "harness.nemesis (line 13)",
        "harness.scenario (line 14)",
        "harness (line 15)",
    ]
