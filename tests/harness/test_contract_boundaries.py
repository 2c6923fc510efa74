"""The contract lives in ``harness.spec``: the harness imports no plugin, fault or checker
module, and plugins, faults and checkers import nothing of the harness but its contract."""

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


#: What of the harness the contract itself may still import: its errors (a leaf) and, until the
#: scenario sections move down into the spec, the scenario model.
SPEC_MAY_IMPORT = ("harness.errors", "harness.scenario")


@pytest.mark.parametrize(
    "path", sorted(p.relative_to(REPO) for p in (REPO / "harness" / "spec").rglob("*.py")), ids=str
)
def test_the_contract_imports_none_of_the_harness_machinery(path: Path) -> None:
    """The spec sits at the bottom: a run, the history writer or the runner appear in it only as
    protocols (``harness.spec.hooks.Run``, ``harness.spec.history.Recorder``)."""
    every = []
    for node in ast.walk(ast.parse((REPO / path).read_text(), str(path))):  # TYPE_CHECKING ones too
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            every.append(node.module)
        elif isinstance(node, ast.Import):
            every += [a.name for a in node.names]
    bad = [
        m
        for m in every
        if m.split(".")[0] == "harness" and not m.startswith("harness.spec") and m not in SPEC_MAY_IMPORT
    ]
    assert not bad, f"{path} imports harness machinery {bad}; describe what it needs as a protocol"
