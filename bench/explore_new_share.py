"""How many runs of a search reached a new coverage cell, recounted offline from the stored runs.

    python -m bench.explore_new_share SEQUENCE... [--cells FILE.py]

Each ``SEQUENCE`` is one search's corpus directory (its ``corpus.json``: the runs in the order
they ran) or a directory of stored runs (each holding ``results.json``, taken in name order: the
runs of ``brokerchaos run --runs N``, or one schedule run twice). The cells are
``harness.explore_cells.stored_run_cells``, or the ``stored_run_cells`` of ``--cells FILE.py``
(another definition of the cells, e.g. an earlier commit's ``harness/explore_cells.py`` written
out with ``git show``), so two definitions can be compared on the same runs. A run is new when it
reached a cell no earlier run of its sequence had reached, as ``explore`` keeps it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

CellsOf = Callable[[Path], set[str]]


def new_counts(cell_sets: Sequence[set[str]]) -> list[int]:
    """For each run in order, how many cells it reached that no earlier run had."""
    seen: set[str] = set()
    out = []
    for cells in cell_sets:
        out.append(len(cells - seen))
        seen |= cells
    return out


def run_dirs(sequence: Path) -> list[Path]:
    """The stored runs of one sequence, in the order they ran."""
    corpus = sequence / "corpus.json"
    if corpus.exists():
        runs = json.loads(corpus.read_text()).get("runs") or []
        return [Path(r["run_dir"]) for r in runs if r.get("run_dir")]
    return sorted(p.parent for p in sequence.glob("*/results.json"))


def cells_function(path: str | None) -> CellsOf:
    """``stored_run_cells`` of the given file, else of ``harness.explore_cells``."""
    if path is None:
        from harness.explore_cells import stored_run_cells

        return stored_run_cells
    spec = importlib.util.spec_from_file_location("cells_under_test", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn: CellsOf = module.stored_run_cells
    return fn


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sequences", nargs="+", type=Path)
    ap.add_argument("--cells", help="a file defining stored_run_cells(run_dir) (default: this tree's)")
    args = ap.parse_args(argv)
    cells_of = cells_function(args.cells)
    print("| sequence | runs | new | cells | new cells per run |")
    print("| --- | --- | --- | --- | --- |")
    for seq in args.sequences:
        sets = [cells_of(d) for d in run_dirs(seq) if (d / "results.json").exists()]
        counts = new_counts(sets)
        total = len(set().union(*sets)) if sets else 0
        new = sum(1 for c in counts if c)
        print(f"| {seq} | {len(sets)} | {new} | {total} | {', '.join(map(str, counts))} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
