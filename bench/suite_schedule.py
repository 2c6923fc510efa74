"""How long the suite takes on two pytest-xdist workers with ``--dist loadfile``, in one order of
files or another, from measured test durations: a replay of xdist's own scheduler
(``xdist.scheduler.loadscope``), not a run.

The scheduler gives each worker one file, then another whenever a worker has two tests or fewer
waiting; a file never splits. So the order in which files are handed out decides how the
workers end: with xdist's default (files with the most tests first) the single-test files, which
here are whole chaos runs, come last, and one worker can end the suite alone on minutes of them.

    bash scripts/test.sh --durations=0 > /tmp/suite.log       # any run that timed every test
    python3 -m pytest --collect-only -q -p no:cacheprovider > /tmp/collected.txt
    python3 bench/suite_schedule.py /tmp/suite.log /tmp/collected.txt --order /tmp/order.txt

The collected ids are pytest's own order (what xdist's default reorders by file size);
``--order`` is a file of test ids in the order tests/conftest.py gives them under xdist
(``pytest --collect-only -q`` with a worker's ``workerinput`` set, e.g. ``-p`` a plugin that sets
it in ``pytest_configure``); without it only xdist's default order is replayed. Tests absent from the log (pytest leaves out phases under 5 ms) count
as 0 s.
"""

from __future__ import annotations

import argparse
import heapq
import re
from collections import OrderedDict
from pathlib import Path


def durations(log: Path) -> dict[str, float]:
    """test id -> seconds (setup, call and teardown), from ``--durations=0``'s lines."""
    out: dict[str, float] = {}
    for line in log.read_text().splitlines():
        m = re.match(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(\S.*::.*)$", line)
        if m:
            out[m.group(3)] = out.get(m.group(3), 0.0) + float(m.group(1))
    return out


def files_in_order(test_ids: list[str]) -> OrderedDict[str, list[str]]:
    units: OrderedDict[str, list[str]] = OrderedDict()
    for tid in test_ids:
        units.setdefault(tid.rsplit("::", 1)[0], []).append(tid)
    return units


def xdist_default(test_ids: list[str]) -> list[str]:
    """xdist's ``--loadscope-reorder`` (its default): files with more tests first, ties in order."""
    units = files_in_order(test_ids)
    ordered = sorted(units.values(), key=lambda tests: -len(tests))
    return [t for tests in ordered for t in tests]


def replay(test_ids: list[str], took: dict[str, float], workers: int = 2) -> tuple[float, list[float]]:
    """(wall seconds, busy seconds per worker) of ``loadfile`` over ``test_ids`` in this order."""
    queue = list(files_in_order(test_ids).values())
    pending: list[list[str]] = [[] for _ in range(workers)]
    busy = [0.0] * workers

    def assign(w: int) -> None:
        if queue:
            pending[w].extend(queue.pop(0))

    for w in range(workers):
        assign(w)
    for w in range(workers):
        if len(pending[w]) <= 2:
            assign(w)
    events: list[tuple[float, int]] = []
    for w in range(workers):
        if pending[w]:
            heapq.heappush(events, (took.get(pending[w][0], 0.0), w))
    end = 0.0
    while events:
        now, w = heapq.heappop(events)
        done = pending[w].pop(0)
        busy[w] += took.get(done, 0.0)
        end = max(end, now)
        if len(pending[w]) <= 2:
            assign(w)
        if pending[w]:
            heapq.heappush(events, (now + took.get(pending[w][0], 0.0), w))
    return end, busy


def _ids(listing: Path) -> list[str]:
    return [line.strip() for line in listing.read_text().splitlines() if "::" in line]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path, help="pytest output with --durations=0")
    ap.add_argument("collected", type=Path, help="pytest --collect-only -q output")
    ap.add_argument("--order", type=Path, help="test ids, one a line, in tests/conftest.py's order")
    args = ap.parse_args()
    took = durations(args.log)
    ids = _ids(args.collected)
    rows = [("xdist default (most tests first)", xdist_default(ids))]
    if args.order:
        rows.append(("costly files first (tests/conftest.py)", _ids(args.order)))
    print(f"{len(took)} tests, {sum(took.values()):.0f} s of work in all")
    for name, order in rows:
        wall, busy = replay(order, took)
        print(f"{name}: wall {wall:.0f} s, workers busy {' / '.join(f'{b:.0f}' for b in busy)} s")


if __name__ == "__main__":
    main()
