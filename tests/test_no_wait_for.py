"""No ``asyncio.wait_for`` in the project's code: ``asyncio.timeout`` instead.

On Python 3.11 (the oldest the project supports) ``wait_for`` loses a cancel that meets an inner
call that has just finished: it returns the inner result, or raises the inner error, as though no
cancel came. A loop that retries on that error then never stops; the reference broker's cluster
dialler did so, and a node whose start failed hung instead of exiting
(``tests/broker_impl/cluster/test_transport_stop.py``). ``asyncio.timeout`` runs the call in the
same task and never drops a cancel.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("broker_impl", "harness", "plugins", "faults", "spark_reports", "tools", "bench", "scripts")


def test_the_project_never_calls_asyncio_wait_for() -> None:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Attribute) and node.attr == "wait_for":
                    if isinstance(node.value, ast.Name) and node.value.id == "asyncio":
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
                elif isinstance(node, ast.ImportFrom) and node.module == "asyncio":
                    if any(a.name == "wait_for" for a in node.names):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"asyncio.wait_for used (use asyncio.timeout): {found}"
