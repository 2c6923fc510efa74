"""Stuck deliveries (issue 31): a node that still reports unacked deliveries after the harness closed
every client connection it opened on the queue holds them for no consumer. The confirmed messages a
drain held up only by such nodes could not obtain are ``stuck``: verdict LOST, counted apart from
lost; anything the harness could not establish stays unknown. Both engines agree (the Spark half is
in test_crosscheck's differential test and below)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.spec.results import STUCK_CAUSE
from spark_reports import check_python
from spark_reports.engines.grade import grade_results
from spark_reports.synth import HistoryBuilder

NODES = ("n1", "n2")


def history(
    *,
    looks: dict[str, list[dict[str, Any]]],
    outcome: str = "info",
    published: int = 5,
    consumed: int = 2,
) -> HistoryBuilder:
    """``published`` confirmed, the first ``consumed`` consumed; a drain whose looks per node are given."""
    h = HistoryBuilder()
    for i in range(1, published + 1):
        h.publish(f"p1:{i}", "ok")
    for i in range(1, consumed + 1):
        h.consume(f"p1:{i}")
    h.drain_invoke()
    for node, seen in looks.items():
        for look in seen:
            h.depth(node, **look)
    views = {n: {"consumed": 0, "ready": 0, "unacked": 0, "empty_at_ns": None, "error": None} for n in NODES}
    h.drain_done(outcome=outcome, nodes=views)
    return h


def check(tmp_path: Path, h: HistoryBuilder) -> dict[str, Any]:
    return dict(check_python(h.write(tmp_path), {}))


HELD = {"ready": 0, "unacked": 3, "clients": 0}
EMPTY = {"ready": 0, "unacked": 0, "clients": 0}


def test_held_for_no_consumer_is_stuck_and_lost(tmp_path: Path) -> None:
    r = check(tmp_path, history(looks={"n1": [dict(HELD), dict(HELD)], "n2": [EMPTY]}))
    assert (r["verdict"], r["valid"]) == ("LOST", False)
    assert (r["counts"]["stuck"], r["counts"]["lost"]) == (3, 0)
    assert r["lost"] == [] and r["lost_by_cause"] == []
    assert sorted(d["id"] for d in r["stuck_detail"]) == ["p1:3", "p1:4", "p1:5"]
    assert {d["cause"] for d in r["stuck_detail"]} == {STUCK_CAUSE}
    [q] = r["stuck"]
    assert (q["node"], q["queue"], q["drainer"], q["unacked"], q["looks"]) == ("n1", "q", "d1", 3, 2)
    assert q["since_ns"] < q["last_ns"]
    assert r["reason"].startswith(f"3 confirmed messages {STUCK_CAUSE}: n1 reported 3 unacked on q from ")
    a = r["attribution"]
    assert a["rows"] == [{"fault_kind": "none", "node": "n1", "status": "stuck", "count": 3}]
    assert a["exposure"] == [{"fault_kind": "none", "confirmed": 5, "lost": 0, "unreachable": 0, "stuck": 3}]
    assert {m["status"] for m in a["messages"]} == {"stuck"}


def test_since_is_the_first_of_the_last_consecutive_looks(tmp_path: Path) -> None:
    busy = {"ready": 0, "unacked": 3, "clients": 1}
    h = history(looks={"n1": [dict(HELD), busy, dict(HELD), dict(HELD)], "n2": [EMPTY]})
    r = check(tmp_path, h)
    [q] = r["stuck"]
    looks = [x for x in h.rows if x["f"] == "depth" and x["type"] == "ok" and x["node"] == "n1"]
    assert (q["looks"], q["since_ns"], q["last_ns"]) == (2, looks[2]["time_ns"], looks[3]["time_ns"])


@pytest.mark.parametrize(
    ("why", "looks"),
    [
        # a consumer connection of the harness was still open: it may hold them
        ("a client open", {"n1": [{"ready": 0, "unacked": 3, "clients": 1}], "n2": [EMPTY]}),
        # the driver did not say how many clients it had open
        ("clients unknown", {"n1": [{"ready": 0, "unacked": 3, "clients": None}], "n2": [EMPTY]}),
        # the drain held some itself
        ("held by the drain", {"n1": [{**HELD, "own_unacked": 3}], "n2": [EMPTY]}),
        # ready messages: the drain just did not get them (time ran out), nothing is held for no one
        ("ready", {"n1": [{"ready": 3, "unacked": 0, "clients": 0}], "n2": [EMPTY]}),
        # the other node was never looked at (unreachable): the harness could not establish it
        ("a node never seen", {"n1": [dict(HELD)]}),
        # the last look at the other node failed
        ("a look failed", {"n1": [dict(HELD)], "n2": [EMPTY, {**EMPTY, "outcome": "info"}]}),
    ],
)
def test_what_the_harness_could_not_establish_stays_unknown(
    tmp_path: Path, why: str, looks: dict[str, list[dict[str, Any]]]
) -> None:
    r = check(tmp_path, history(looks=looks))
    counts = r["counts"]
    assert (r["verdict"], counts["stuck"], counts["lost"], counts["unreachable"]) == ("unknown", 0, 0, 3), why
    assert r["stuck_detail"] == []


def test_a_finished_drain_is_not_stuck(tmp_path: Path) -> None:
    r = check(tmp_path, history(looks={"n1": [EMPTY], "n2": [EMPTY]}, outcome="ok"))
    assert (r["verdict"], r["counts"]["lost"], r["counts"]["stuck"]) == ("LOST", 3, 0)
    assert r["stuck"] == []


def test_nothing_confirmed_missing_is_durable_though_held(tmp_path: Path) -> None:
    """Unconfirmed (or already consumed) messages held for no one lose nothing that was promised."""
    r = check(tmp_path, history(looks={"n1": [dict(HELD)], "n2": [EMPTY]}, consumed=5))
    assert (r["verdict"], r["counts"]["stuck"]) == ("durable", 0)
    assert [q["node"] for q in r["stuck"]] == ["n1"]  # the holding node is still reported


def test_a_grade_counts_stuck_runs_as_lossy(tmp_path: Path) -> None:
    r = check(tmp_path, history(looks={"n1": [dict(HELD)], "n2": [EMPTY]}))
    grade = grade_results([("a", r, 1)])
    [run] = grade["runs"]
    assert (run["graded"], run["lost"], grade["verdict"]) == (True, 3, "LOST")


@pytest.mark.spark
def test_spark_agrees(tmp_path: Path, spark_engine: Any) -> None:
    for name, looks in (
        ("stuck", {"n1": [dict(HELD), dict(HELD)], "n2": [EMPTY]}),
        ("open", {"n1": [{"ready": 0, "unacked": 3, "clients": 1}], "n2": [EMPTY]}),
    ):
        d = tmp_path / name
        d.mkdir()
        history(looks=looks).write(d, jsonl=False)
        expected = dict(check_python(d, {}))
        got = dict(spark_engine(d, {}))
        assert (got.pop("engine"), expected.pop("engine")) == ("spark", "python")
        assert got == expected, name


def test_the_report_and_the_terminal_show_the_stuck_class(tmp_path: Path) -> None:
    from harness.verdicts import summary_table
    from spark_reports import render_report

    h = HistoryBuilder()
    for i in range(1, 4):
        h.publish(f"p1:{i}", "ok")
    h.drain_invoke()
    h.op("d1", "invoke", "depth", None, node="n1", queue="q")
    held = {
        "ready": 0,
        "unacked": 3,
        "own_unacked": 0,
        "clients": 0,
        "holders": [{"queue": "q", "consumers": 0}],
    }
    h.op("d1", "ok", "depth", held, node="n1", queue="q")
    h.drain_done(outcome="info", nodes={"n1": {"consumed": 0, "ready": 0, "unacked": 3}})
    r = check(tmp_path, h)
    assert r["stuck"][0]["holders"] == [{"queue": "q", "consumers": 0}]
    page = render_report(tmp_path, r).read_text()  # type: ignore[arg-type]
    assert "Stuck deliveries (3 confirmed messages)" in page
    assert "<td>queue q, consumers 0</td>" in page
    assert "Stuck messages" in page
    table = summary_table(r)
    assert "  stuck                   3" in table and "held unacked by no consumer" in table
