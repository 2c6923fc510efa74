"""No import circles among the project's modules, not even one closed by an import inside a function.

The graph is read from the source with ``ast`` (nothing is imported): a module imports
another when any of its ``import`` statements names it, at module level or inside a
function, class or ``try``. What counts as an edge:

* ``import a.b.c`` and ``from a.b import c``: the module named (``a.b.c`` when ``c`` is a
  module, ``a.b`` when it is a name in it); relative imports are resolved against the
  importing module's package.
* The packages on the way (``a.b``'s ``__init__``) whose code the import runs, except the
  importer's own enclosing packages: a module always runs those first, so a package whose
  ``__init__`` re-exports its children (pluggy's layout) is not a circle with each child. A
  module that imports ``harness.spec.history`` runs ``harness/spec/__init__.py``: when that
  ``__init__`` imports the module back, the two are a circle.
* Not imports under ``if TYPE_CHECKING:``. They never run, so they cannot leave a module
  half-initialised or make one's import order matter; they name a type for mypy, and mypy
  resolves circular annotations itself. (A lower module that only annotates with a higher
  one's class is still a design smell; docs/explanation/code-layout.md lists what is left.)

A circle found here fails with the imports that close it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "plugins", "faults", "spark_reports", "broker_impl")

#: Circles known today, each to be removed (then its entry deleted here):


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} (line {self.line})"


def modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Every module of ``packages`` under ``root``, by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the import nodes under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for stmt in node.body:
                skip.update(id(n) for n in ast.walk(stmt))
    return skip


def edges(name: str, path: Path, known: dict[str, Path]) -> list[Edge]:
    """The imports of one module that land on modules in ``known``."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    named: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            named += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for a in node.names:
                sub = f"{module}.{a.name}"
                named.append((sub if sub in known else module, node.lineno))
    own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    out: list[Edge] = []
    for target, line in named:
        parts = target.split(".")
        # the module itself, then each package on the way whose __init__ the import runs
        for i in range(len(parts), 0, -1):
            prefix = ".".join(parts[:i])
            if prefix in known and prefix != name and prefix not in own:
                out.append(Edge(name, prefix, line))
    return out


def graph(root: Path, packages: tuple[str, ...]) -> dict[str, list[Edge]]:
    known = modules(root, packages)
    return {name: edges(name, path, known) for name, path in known.items()}


def circles(g: dict[str, list[Edge]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(g):
        if start in index:
            continue
        work = [(start, iter(sorted({e.target for e in g[start]})))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted({e.target for e in g[w]}))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(frozenset(comp))
    return found


def describe(circle: frozenset[str], g: dict[str, list[Edge]]) -> str:
    inside = sorted({str(e) for m in circle for e in g[m] if e.target in circle})
    return f"{len(circle)} modules {sorted(circle)}:\n    " + "\n    ".join(inside)


GRAPH = graph(REPO, PACKAGES)
FOUND = circles(GRAPH)


def test_no_import_circle() -> None:
    assert not FOUND, "import circles (break each; see docs/explanation/code-layout.md):\n" + "\n".join(
        describe(c, GRAPH) for c in FOUND
    )


def test_the_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The checker itself: a circle closed inside a function, through a relative import, through a
    package's ``__init__``; no circle from a TYPE_CHECKING import or from a package re-exporting
    its own children."""
    files = {
        "p/__init__.py": "from p.a import A\n",
        "p/a.py": "A = 1\ndef f():\n    from .b import B\n",
        "p/b.py": "from p import a\nB = 2\n",
        "p/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.d import D\n",
        "p/d.py": "from p.c import *\nD = 3\n",
        "q/__init__.py": "from r.x import X\n",
        "r/__init__.py": "",
        "r/x.py": "import q.y\nX = 1\n",
        "q/y.py": "Y = 1\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    g = graph(tmp_path, ("p", "q", "r"))
    assert sorted(map(sorted, circles(g))) == [["p.a", "p.b"], ["q", "r.x"]]
    assert "p.a -> p.b (line 3)" in describe(frozenset({"p.a", "p.b"}), g)
