"""How often ``explore`` proposes the schedule of a node restarted inside its minority, from a stored corpus.

    python -m bench.explore_proposals CORPUS [--n 400] [--scenario FILE] [--faults kill,degrade]

Replays ``Search.propose`` for ``n`` candidate numbers past the corpus's runs (each a fresh draw
seeded as a search draws it) and counts the candidates that hold the whole shape of
``scenarios/reference-restart-in-minority.yaml``: a kill of node X nested in an isolation of X,
and every other node's client links reset (``reset_peer``) for a while between the kill's planned
heal and the isolation's end (the clients pushed onto X once it is back). It also counts
those with the kill nested alone, and those with the whole shape whose kill heals ``--room``
seconds or more before the isolation's end and the workload's (the restarted node's start-up
wait, inside the isolation while producers run). Only the proposals are counted: nothing runs, so what the
tree's mutations can propose from one corpus is compared without Docker (run it with another
tree's ``harness`` on ``PYTHONPATH`` for that tree's mutations).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.explore import Corpus, Search, pool_of
from harness.explore_cells import targets
from harness.host import Host
from harness.scenario import load
from harness.shrink import Schedule


def _held(p_at: float, p_hold: float | None, duration: float) -> tuple[float, float]:
    return p_at, p_at + (p_hold if p_hold is not None else duration)


def _overlaps(x: tuple[float, float], y: tuple[float, float]) -> bool:
    return x[0] < y[1] and y[0] < x[1]


def restart_in_minority_shape(s: Schedule) -> tuple[bool, bool]:
    """(a kill nested in an isolation of its node, and that with the other nodes' client links reset
    between the kill's heal and the isolation's end)."""
    room = restart_in_minority_room(s)
    return room[0] is not None, room[1] is not None


def restart_in_minority_room(s: Schedule) -> tuple[float | None, float | None]:
    """The seconds from a nested kill's planned heal to its isolation's end or the workload's, which
    comes first (the time the restarted node has to act while producers run), the largest over
    (the kill nested alone, the whole shape); None where the schedule has no such shape."""
    cluster = [f"n{k}" for k in range(1, s.nodes + 1)]
    nested: float | None = None
    full: float | None = None
    for iso in s.steps:
        side = targets(iso.params, cluster) if iso.kind == "partition" else []
        if len(side) != 1 or len(cluster) < 2:
            continue
        a, b = _held(iso.at, iso.hold, s.duration)
        for k in s.steps:
            ka, kb = _held(k.at, k.hold, s.duration)
            if k.kind != "kill" or k.params.get("node") != side[0] or not (a < ka and kb < b):
                continue
            left = min(b, s.duration) - kb
            nested = left if nested is None else max(nested, left)
            reset = {
                p.params.get("node")
                for p in s.steps
                if p.kind == "degrade"
                and p.params.get("type") == "reset_peer"
                and p.params.get("links") == "clients"
                and _overlaps(_held(p.at, p.hold, s.duration), (kb, b))
            }
            if reset >= set(cluster) - set(side):
                full = left if full is None else max(full, left)
    return nested, full


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--scenario", type=Path, default=Path("scenarios/reference-isolate-master.yaml"))
    ap.add_argument("--faults", default="kill,degrade")
    ap.add_argument(
        "--room",
        default="6,10,14",
        help="seconds the restarted node needs after the kill's planned heal, inside the isolation and "
        "the workload, one count each (default 6,10,14: the reference broker's start-up wait, "
        "2 x tick x missed_ticks, then with 4 and 8 s of a loaded machine's lateness)",
    )
    args = ap.parse_args(argv)
    scenario = load(args.scenario)
    faults = Host.load([]).registry.faults
    corpus = Corpus.open(args.corpus, scenario.name, scenario.seed)
    if not corpus.runs:
        raise SystemExit(f"{args.corpus}: no runs in its corpus")
    pool = pool_of(scenario, faults, [k for k in args.faults.split(",") if k])
    start = Schedule.from_dict(corpus.runs[0]["schedule"])
    search = Search(corpus, start, faults, pool, lambda *a: None, budget_s=0)  # type: ignore[arg-type]
    rooms = [float(r) for r in args.room.split(",") if r]
    nested = full = 0
    roomy = dict.fromkeys(rooms, 0)
    first = corpus.iteration + 1
    for it in range(first, first + args.n):
        got = search.propose(it)
        if got is not None:
            n, f = restart_in_minority_room(got[0])
            nested, full = nested + (n is not None), full + (f is not None)
            for r in rooms:
                roomy[r] += f is not None and f >= r
    print(
        f"{args.corpus}: {args.n} proposals after {corpus.iteration} runs: a kill nested in its node's "
        f"isolation {nested} ({nested / args.n:.1%}); with the others' client links reset after its heal "
        f"{full} ({full / args.n:.1%}); of those, with this many seconds or more left after the kill's "
        "heal: " + ", ".join(f"{r:g} s {k} ({k / args.n:.1%})" for r, k in roomy.items())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
