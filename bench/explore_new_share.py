"""How many runs of a search reached a new coverage cell, recounted offline from the stored runs.

    python -m bench.explore_new_share SEQUENCE... [--cells FILE.py] [--show]

Each ``SEQUENCE`` is one search's corpus directory (its ``corpus.json``: the runs in the order
they ran) or a directory of stored runs (each holding ``results.json``, taken in name order: the
runs of ``brokerchaos run --runs N``, or one schedule run twice). The cells are
``harness.explore_cells.stored_run_cells``, or the ``stored_run_cells`` of ``--cells FILE.py``
(another definition of the cells, e.g. an earlier commit's ``harness/explore_cells.py`` written
out with ``git show``), so two definitions can be compared on the same runs. A run is new when it
reached a cell no earlier run of its sequence had reached, as ``explore`` keeps it. ``--show``
lists, under each sequence, the (fault, event) pairs each new run reached first (a cell counts
once per workload feature; the pairs name each once), with the mutation that made the run when
the sequence is a search: what made a run new, to tell the cluster doing something else from
cells that move with timing alone.
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
    return [len(c) for c in new_cells(cell_sets)]


def new_cells(cell_sets: Sequence[set[str]]) -> list[set[str]]:
    """For each run in order, the cells it reached that no earlier run had."""
    seen: set[str] = set()
    out = []
    for cells in cell_sets:
        out.append(cells - seen)
        seen |= cells
    return out


def new_pairs(cells: set[str]) -> list[str]:
    """``fault | event`` of the cells, each once (a cell is ``feature | fault | event``)."""
    return sorted({c.split(" | ", 1)[1] if c.count(" | ") >= 2 else c for c in cells})


def hows(sequence: Path) -> list[str]:
    """The mutation that made each run of a search (``corpus.json``), else empty strings."""
    corpus = sequence / "corpus.json"
    if not corpus.exists():
        return [""] * len(run_dirs(sequence))
    runs = json.loads(corpus.read_text()).get("runs") or []
    return [str(r.get("how") or "") for r in runs if r.get("run_dir")]


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
    ap.add_argument(
        "--show", action="store_true", help="list each new run's first-reached (fault, event) pairs"
    )
    args = ap.parse_args(argv)
    cells_of = cells_function(args.cells)
    print("| sequence | runs | new | cells | new cells per run |")
    print("| --- | --- | --- | --- | --- |")
    shown = []
    for seq in args.sequences:
        dirs = run_dirs(seq)
        kept = [i for i, d in enumerate(dirs) if (d / "results.json").exists()]
        sets = [cells_of(dirs[i]) for i in kept]
        counts = new_counts(sets)
        total = len(set().union(*sets)) if sets else 0
        new = sum(1 for c in counts if c)
        print(f"| {seq} | {len(sets)} | {new} | {total} | {', '.join(map(str, counts))} |")
        how = hows(seq)
        for k, cells in zip(kept, new_cells(sets), strict=True):
            if cells:
                what = how[k] if k < len(how) else ""
                shown.append(f"- {seq} run {k + 1} ({what}): " + "; ".join(new_pairs(cells)))
    if args.show:
        print("\n".join(["", *shown]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
