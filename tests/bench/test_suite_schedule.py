"""bench/suite_schedule.py's replay of xdist's loadfile scheduler on a toy suite."""

from __future__ import annotations

from pathlib import Path

from bench.suite_schedule import durations, replay, xdist_default

# Three unit files of many quick tests, two files of one long run each.
IDS = [f"tests/u{f}.py::test_{i}" for f in range(3) for i in range(10)] + [
    "tests/run_a.py::test_run",
    "tests/run_b.py::test_run",
]
TOOK = {**{t: 1.0 for t in IDS}, "tests/run_a.py::test_run": 100.0, "tests/run_b.py::test_run": 100.0}


def test_the_default_order_leaves_the_long_single_files_to_the_end() -> None:
    order = xdist_default(IDS)
    assert order[-2:] == ["tests/run_a.py::test_run", "tests/run_b.py::test_run"]
    wall, busy = replay(order, TOOK)
    assert sum(busy) == sum(TOOK.values()) == 230.0
    assert wall > 115.0  # one worker still has a long run when the other ends


def test_long_files_first_end_the_workers_together() -> None:
    order = ["tests/run_a.py::test_run", "tests/run_b.py::test_run"] + IDS[:30]
    wall, busy = replay(order, TOOK)
    assert sum(busy) == 230.0 and wall == max(busy) == 120.0  # a file of ten tests is the grain
    assert wall < replay(xdist_default(IDS), TOOK)[0]


def test_durations_add_up_the_phases_of_each_test(tmp_path: Path) -> None:
    log = tmp_path / "suite.log"
    log.write_text(
        "=== slowest durations ===\n"
        "12.50s call     tests/e2e/test_runs.py::test_smoke\n"
        "0.50s setup    tests/e2e/test_runs.py::test_smoke\n"
        "3.00s call     tests/x.py::Suite::test_y[a-b]\n"
    )
    assert durations(log) == {
        "tests/e2e/test_runs.py::test_smoke": 13.0,
        "tests/x.py::Suite::test_y[a-b]": 3.0,
    }
