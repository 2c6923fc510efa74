"""Settings every test shares.

CI runs on a busy 2-core machine: Hypothesis's timing checks (a per-example
deadline, "input generation is slow", "data too large") fail there on no defect of
the code under test. The profile switches them off for every property test; a test
that needs another setting passes only that one to ``@settings``, and the rest comes
from here. ``filter_too_much`` is off too: a strategy that filters a lot is slow on a
busy machine, not wrong.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.ports import free_port

SLOW_MACHINE_CHECKS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile("brokerchaos", deadline=None, suppress_health_check=SLOW_MACHINE_CHECKS)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "brokerchaos"))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A property test whose own ``@settings`` brings a timing check back fails here, by name.

    ``suppress_health_check=[...]`` replaces the profile's list instead of adding to it,
    so the slip is easy to make and would only show on a slow machine.
    """
    chosen = getattr(getattr(item, "obj", None), "_hypothesis_internal_use_settings", None)
    if chosen is None:
        return
    back = [h.name for h in SLOW_MACHINE_CHECKS if h not in chosen.suppress_health_check]
    if chosen.deadline is not None or back:
        on = ([f"deadline={chosen.deadline}"] if chosen.deadline is not None else []) + back
        pytest.fail(
            f"{item.nodeid}: its @settings turns {', '.join(on)} back on; keep deadline=None and extend "
            "the profile's list: suppress_health_check=[*settings().suppress_health_check, ...]",
            pytrace=False,
        )


# Markers by what a test file costs: a chaos run or a cluster, then a JVM, then seconds of work.
_COST_MARKS = ("docker", "spark", "slow")


def _file_cost(items: list[pytest.Item]) -> tuple[int, int]:
    """A sort key, smallest first: the costliest marker any test of the file carries, then more
    such tests first (under ``docker``, each is a cluster or a run of its own)."""
    for rank, mark in enumerate(_COST_MARKS):
        heavy = sum(1 for item in items if item.get_closest_marker(mark) is not None)
        if heavy:
            return rank, -heavy
    return len(_COST_MARKS), 0


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, hand out the costly files first.

    ``--dist loadfile`` gives a worker a whole file at a time, in collection order (with
    ``--no-loadscope-reorder``, as scripts/test.sh runs it; xdist's own order puts files with
    the fewest tests last, and those are the single chaos runs, so one worker would end the suite
    alone on minutes of Docker runs while the other waited). Costly files first, seconds-long
    unit files last: the two workers end together. A test's own order within its file is kept;
    without xdist nothing moves (pytest's own grouping of session-scoped parameters stays).
    """
    if not hasattr(config, "workerinput"):
        return
    by_file: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        by_file[item.nodeid.split("::", 1)[0]].append(item)
    files = sorted(by_file.values(), key=_file_cost)  # stable: ties keep collection order
    items[:] = [item for group in files for item in group]


@pytest.fixture(scope="session")
def connect_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    """A real Spark Connect server (``brokerchaos spark start``'s), on a free port, its state kept
    in a temporary directory (so no check that is not given its address finds it): that directory
    and the state. Stopped at the end.

    One per test process (each pytest-xdist worker), started by the first test that asks: the
    Spark tests that compare the two ways of checking, and the end-to-end runs checked by Spark
    (``tests/e2e/conftest.py``'s ``spark_checked``), which so pay no JVM start and warm-up each."""
    from spark_reports.service import connect as _spark_service

    home: Path = tmp_path_factory.mktemp("spark-connect")
    state = _spark_service.start(free_port(), home=home)
    try:
        yield home, state
    finally:
        _spark_service.stop(home=home)


@pytest.fixture(scope="session")
def connect_server(connect_state: tuple[Path, dict[str, Any]]) -> str:
    """The server's address, ``sc://127.0.0.1:PORT``."""
    return str(connect_state[1]["url"])
