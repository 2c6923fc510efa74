"""tests/conftest.py's order for the two test workers: costly files first, each file whole and in
its own order, and nothing moved when the suite runs in one process."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tests.conftest import pytest_collection_modifyitems


class _Item:
    def __init__(self, nodeid: str, *marks: str) -> None:
        self.nodeid = nodeid
        self.marks = marks

    def get_closest_marker(self, name: str) -> str | None:
        return name if name in self.marks else None


def _suite() -> list[Any]:
    return [
        _Item("tests/a.py::test_one"),
        _Item("tests/b.py::test_job", "spark"),
        _Item("tests/c.py::test_run[1]", "docker", "chaos"),
        _Item("tests/a.py::test_two"),
        _Item("tests/c.py::test_run[2]", "docker", "chaos"),
        _Item("tests/d.py::test_cluster", "docker", "slow"),
        _Item("tests/e.py::Suite::test_wait", "slow"),
        _Item("tests/d.py::test_unit"),
    ]


def test_under_xdist_costly_files_come_first_each_whole_and_in_its_order() -> None:
    items = _suite()
    pytest_collection_modifyitems(SimpleNamespace(workerinput={}), items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == [
        "tests/c.py::test_run[1]",  # two Docker runs
        "tests/c.py::test_run[2]",
        "tests/d.py::test_cluster",  # one
        "tests/d.py::test_unit",
        "tests/b.py::test_job",  # a Spark job
        "tests/e.py::Suite::test_wait",  # slow
        "tests/a.py::test_one",
        "tests/a.py::test_two",
    ]


def test_in_one_process_nothing_moves() -> None:
    items = _suite()
    before = [i.nodeid for i in items]
    pytest_collection_modifyitems(SimpleNamespace(), items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == before
