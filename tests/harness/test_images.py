"""The node image's tag without Docker: it holds the modules a node container runs and what they
import of ``faults`` (``harness.images.node_tooling``), so a change to a host-side fault leaves the
tag, and with it every matrix cell's key, as it was."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from harness import images
from harness.images import NODE_MODULES, REPO, ImageBuilder, node_tooling
from harness.spec.broker import ImageRecipe

#: Imports every node module (a package's ``__main__`` too) from the current directory only, and
#: prints the file each ``faults`` module was loaded from.
IMPORT_ALL = """
import importlib, json, sys
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    if hasattr(module, "__path__"):
        importlib.import_module(name + ".__main__")
print(json.dumps({n: getattr(m, "__file__", None) for n, m in sys.modules.items() if n.split(".")[0] == "faults"}))
"""


def test_the_node_modules_import_from_a_tree_of_their_tooling_alone(tmp_path: Path) -> None:
    for rel, f in node_tooling().items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, tmp_path / rel)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, *NODE_MODULES],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout)
    assert set(NODE_MODULES) <= set(loaded)
    outside = {
        n: f for n, f in loaded.items() if f and not Path(f).resolve().is_relative_to(tmp_path.resolve())
    }
    assert not outside, f"loaded from outside the node tooling: {outside}"


def test_the_host_side_faults_are_not_node_tooling() -> None:
    tooling = node_tooling()
    assert {"faults/nodeinit.py", "faults/node/wire.py", "faults/lazyfs/ops.py"} <= set(tooling)
    for host_side in ("faults/network.py", "faults/process.py", "faults/plugin.py", "faults/lazyfs/bench.py"):
        assert host_side in {f.relative_to(REPO).as_posix() for f in (REPO / "faults").rglob("*.py")}
        assert host_side not in tooling


def test_a_module_a_node_module_starts_importing_joins_the_tooling(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "entry.py").write_text("from pkg.sub import helper\nfrom . import near\n")
    (tmp_path / "pkg" / "near.py").write_text("import json\n")
    (tmp_path / "pkg" / "sub" / "helper.py").write_text("def f():\n    from pkg import deep\n")
    (tmp_path / "pkg" / "deep.py").write_text("")
    (tmp_path / "pkg" / "host_side.py").write_text("")
    assert list(node_tooling(tmp_path, ("pkg.entry",))) == [
        "pkg/__init__.py",
        "pkg/deep.py",
        "pkg/entry.py",
        "pkg/near.py",
        "pkg/sub/helper.py",
    ]


@pytest.fixture
def repo_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of ``faults/`` as the image builder's checkout; wheels already fetched."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "faults", root / "faults", ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "mfusepy.whl").write_text("a wheel")
    monkeypatch.setattr(images, "REPO", root)
    monkeypatch.setattr(ImageBuilder, "wheels", lambda self, packages: wheels)
    return root


def test_only_a_change_to_the_node_tooling_changes_the_node_image_tag(repo_copy: Path) -> None:
    builder = ImageBuilder(None, tags_only=True)
    recipe = ImageRecipe(name="brokerchaos/probe", debian_packages=("procps",))
    before = builder.node_image(recipe)
    with (repo_copy / "faults" / "network.py").open("a") as f:
        f.write("\n# a host-side change\n")
    assert builder.node_image(recipe) == before
    with (repo_copy / "faults" / "node" / "wire.py").open("a") as f:
        f.write("\n# a node-side change\n")
    assert builder.node_image(recipe) != before


def _docstrings(tree: ast.AST) -> set[int]:
    bodies = [n for n in ast.walk(tree) if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef)]
    return {
        id(b.body[0].value)
        for b in bodies
        if b.body and isinstance(b.body[0], ast.Expr) and isinstance(b.body[0].value, ast.Constant)
    }


def _commands(path: Path) -> set[str]:
    """The ``faults`` modules ``path``'s code runs with ``-m``: a ``"-m", "faults..."`` pair in a
    list or tuple, or a command line in a string (docstrings, and a module's own command line, aside)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.List | ast.Tuple):
            words = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            found |= {str(b) for a, b in pairwise(words) if a == "-m" and str(b).startswith("faults.")}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            found |= set(re.findall(r'-m"?,? "?(faults(?:\.\w+)+)', node.value))
    own = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__main__")
    return found - {own}


def test_every_module_the_tree_runs_in_a_node_is_a_node_module() -> None:
    sources = [p for d in ("harness", "faults", "plugins") for p in (REPO / d).rglob("*.py")]
    run = set().union(*(_commands(p) for p in sources))
    assert {"faults.nodeinit", "faults.nodectl", "faults.lazyfs", "faults.node.probe"} <= run
    assert run <= set(NODE_MODULES)
