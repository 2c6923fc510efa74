"""Which runs of a search reached the restart-in-minority defect, read from its stored runs.

    python -m bench.explore_reached CORPUS...
    python -m bench.explore_reached STORE_DIR...      # the seeded random nemesis's runs, for comparison

A run reached it (``bench/results/explore_restart_in_minority.md``) when it ended LOST and lost
messages were confirmed by a node that logged ``served-alone`` (it started with no peer answering
and served) and, after that, ``copy-dropped`` (the heal dropped its copy), confirmed after it
began serving alone. Each run of each corpus is listed with its verdict, the nodes that served
alone, the lost messages by the node that confirmed them, and whether it reached the defect;
then the first run that did. A directory with no ``corpus.json`` is read as a run store (the
comparison runs of ``brokerchaos run``): every run directory under it, in the order of its name
(a run's start time). No Docker: ``results.json`` of each run (its ``events`` and
``attribution``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _first(events: list[Mapping[str, Any]], name: str, node: str, after: int) -> int | None:
    times = [
        int(e["time_ns"])
        for e in events
        if e.get("name") == name and e.get("node") == node and e.get("time_ns") is not None
    ]
    later = [t for t in times if t >= after]
    return min(later) if later else None


def reached(results: Mapping[str, Any]) -> str | None:
    """The node by which the run reached the defect (LOST, confirmed by it after it served alone and
    before it dropped its copy), else None."""
    if results.get("verdict") != "LOST":
        return None
    events = list(results.get("events") or [])
    lost = (results.get("attribution") or {}).get("messages") or []
    for node in sorted({str(e.get("node")) for e in events if e.get("name") == "served-alone"}):
        alone = _first(events, "served-alone", node, 0)
        dropped = None if alone is None else _first(events, "copy-dropped", node, alone)
        if dropped is None or alone is None:
            continue
        if any(m.get("confirm_node") == node and alone <= (m.get("confirm_ns") or -1) for m in lost):
            return node
    return None


def describe(results: Mapping[str, Any]) -> str:
    """One line: verdict, nodes that served alone, the lost messages listed by the node that confirmed them."""
    events = results.get("events") or []
    alone = sorted({str(e.get("node")) for e in events if e.get("name") == "served-alone"})
    by_node: dict[str, int] = {}
    for m in (results.get("attribution") or {}).get("messages") or []:
        by_node[str(m.get("confirm_node"))] = by_node.get(str(m.get("confirm_node")), 0) + 1
    lost = ", ".join(f"{n} {c}" for n, c in sorted(by_node.items())) or "-"
    return (
        f"{results.get('verdict')}; served alone: {', '.join(alone) or '-'}; lost by confirming node: {lost}"
    )


def store_runs(store: Path) -> list[Path]:
    """The run directories under a run store, oldest first (a run directory is named by its start)."""
    runs = {p.parent.resolve() for p in store.rglob("results.json")}  # `latest` links to one of them
    return sorted(runs, key=lambda d: (d.name, str(d)))


def _print_store(store: Path) -> None:
    runs = store_runs(store)
    hits = 0
    print(f"{store}: {len(runs)} run(s)")
    for d in runs:
        results = json.loads((d / "results.json").read_text())
        seed = (
            json.loads((d / "scenario.json").read_text()).get("seed")
            if (d / "scenario.json").exists()
            else None
        )
        node = reached(results)
        hits += bool(node)
        mark = f"  REACHED by {node}" if node else ""
        print(f"  {d.name} (seed {seed}): {describe(results)}{mark}")
    print(f"  runs that reached the defect: {hits} of {len(runs)}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus", type=Path, nargs="+")
    args = ap.parse_args(argv)
    for corpus in args.corpus:
        if not (corpus / "corpus.json").exists():
            _print_store(corpus)
            continue
        data = json.loads((corpus / "corpus.json").read_text())
        first = None
        print(f"{corpus}: {len(data['runs'])} run(s), {data.get('elapsed_s', 0) / 60:.1f} min")
        for r in data["runs"]:
            path = Path(r["run_dir"] or "") / "results.json"
            if not r.get("run_dir") or not path.exists():
                print(f"  run {r['iteration']}: {(r.get('error') or 'no results').splitlines()[0]}")
                continue
            results = json.loads(path.read_text())
            node = reached(results)
            first = first or (r["iteration"] if node else None)
            mark = f"  REACHED by {node}" if node else ""
            print(f"  run {r['iteration']} ({r['seconds']:.0f} s; {r['how']}): {describe(results)}{mark}")
        print(f"  first run that reached the defect: {first or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
