"""Each class of the reconciliation on a literal history, checked by the Python engine.

The same literal histories are then run through Spark (test_spark_matches_python_on_literals)
so each class is pinned for both engines.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.spec.results import describe_stranded
from spark_reports import HistoryError, ScenarioError, check_python
from spark_reports.synth import HistoryBuilder


def _lost() -> HistoryBuilder:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.publish("p1:2", node="n2")
    b.consume("p1:1")
    b.drain()
    return b


def _lost_undrained() -> HistoryBuilder:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.drain(complete=False)
    return b


def _unexpected() -> HistoryBuilder:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.consume("p1:1")
    b.consume("p7:3")
    b.drain()
    return b


def _duplicated() -> HistoryBuilder:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.consume("p1:1", node="n1")
    b.consume("p1:1", node="n2", consumer="c2", redelivered=True)
    b.drain()
    return b


def _recovered() -> HistoryBuilder:
    b = HistoryBuilder()
    b.publish("p1:1", "info")
    b.publish("p1:2", "fail")
    b.publish("p1:3", None)  # the run died before the confirm: indeterminate
    b.consume("p1:1")
    b.consume("p1:2")
    b.drain()
    return b


def _reordered() -> HistoryBuilder:
    b = HistoryBuilder()
    for i in range(1, 5):
        b.publish(f"p1:{i}")
    b.publish("p2:1")
    b.consume("p1:2")
    b.consume("p2:1")
    b.consume("p1:1")  # after p1:2 on the same consumer and queue: a violation
    b.consume("p1:4", consumer="c2")
    b.consume("p1:3", consumer="c2")  # after p1:4: a second violation
    b.consume("p1:1", redelivered=True)  # redeliveries are not order violations
    b.drain()
    return b


def _info_ops() -> HistoryBuilder:
    b = HistoryBuilder()
    b.publish("p1:1", "info")
    b.publish("p1:1", "ok")  # retried with the same id, confirmed the second time
    b.publish("p1:2", "info")
    b.publish("p1:3", None)
    b.consume("p1:1")
    b.drain()
    return b


def _consumed_in_fault() -> HistoryBuilder:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.fault("f1", "partition", node="n2", partitions=[["n1"], ["n2", "n3"]])
    b.publish("p1:2", "info")
    b.consume("p1:1", node="n1")
    b.heal("f1")
    b.drain()
    return b


def _attributed(complete: bool = True) -> HistoryBuilder:
    b = HistoryBuilder()
    # Confirmed by n3 before any fault, never consumed: lost, exposed to both kinds (p1:3, also lost
    # on n3, to one: their rows for power-loss on n3 are one row of two).
    b.publish("p1:0", node="n3")
    b.publish("p1:1", node="n1")  # confirmed before any fault, consumed: exposed, not lost
    b.fault("f1", "kill", node="n2")
    b.publish("p1:2", node="n2")  # confirmed by n2 during the kill, never consumed
    b.heal("f1")
    b.fault("f2", "power-loss", node="n3")  # never healed: open to the end
    b.publish("p1:3", node="n3")
    b.consume("p1:1")
    b.drain(complete=complete)
    return b


def _attributed_undrained() -> HistoryBuilder:
    """``_attributed`` with a final drain that did not complete: its missing messages are
    unreachable, not lost, and attributed so."""
    return _attributed(complete=False)


SEED, SIZE = 7, 96
BODIES = {"seed": SEED, "workload": {"message_size": SIZE}}


def _consumption_is_an_ack() -> HistoryBuilder:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.publish("p1:2", "info")
    b.publish("p1:3", "info")
    b.consume("p1:1", ack=None)  # delivered, never acked: not consumed, so lost
    b.consume("p1:2", ack=None)  # unconfirmed and only delivered: not recovered
    b.consume("p1:3")  # unconfirmed and acked ok: recovered
    b.consume("p9:1", ack=None)  # never attempted, only delivered: not unexpected
    b.drain()
    return b


def _ack_unknown() -> HistoryBuilder:
    b = HistoryBuilder()
    for i in range(1, 5):
        b.publish(f"p1:{i}")
    b.consume("p1:1", ack="info")  # the ack's fate is unknown and nothing came back: ack_unknown
    b.consume("p1:2", ack="info")
    b.consume("p1:2", consumer="c2", redelivered=True, ack=None)  # it came back, unacked: lost
    b.deliver("p1:3")
    b.op("c1", "invoke", "ack", "p1:3", queue="q")  # written ...
    b.deliver("p1:3", consumer="c2", redelivered=True)  # ... redelivered elsewhere before the failure shows
    b.op("c1", "info", "ack", "p1:3", queue="q", error="connection lost")
    b.consume("p1:4", ack="fail")  # definitely not acked: lost
    b.drain()
    return b


def _lost_causes() -> HistoryBuilder:
    b = HistoryBuilder()
    for i in range(1, 6):
        b.publish(f"p1:{i}")
    b.deliver("p1:2")
    b.abandon("p1:2", "crash", "info")
    b.consume("p1:3", ack=None)
    b.deliver("p1:4")
    b.abandon("p1:4", "requeue")
    b.consume("p1:4", consumer="c2", redelivered=True)  # abandoned, redelivered, acked: consumed
    b.deliver("p1:5")
    b.abandon("p1:5", "close")
    b.deliver("p1:5", consumer="c2", redelivered=True)
    b.abandon("p1:5", "recover", consumer="c2")  # the last abandon names the cause
    b.drain()
    return b


def _unflagged() -> HistoryBuilder:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.publish("p1:2")
    b.deliver("p1:1")
    b.abandon("p1:1", "requeue")
    b.consume("p1:1", consumer="c2", node="n2")  # came back without the redelivered flag
    b.deliver("p1:2")
    b.abandon("p1:2", "recover")
    b.consume("p1:2", redelivered=True)  # flagged: fine
    b.drain()
    return b


def _resurrected() -> HistoryBuilder:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.publish("p1:2")
    b.consume("p1:1", node="n1")
    b.consume("p1:1", consumer="c2", node="n2", redelivered=True)  # after its ack completed ok
    b.deliver("p1:2")
    b.op("c1", "invoke", "ack", "p1:2", queue="q")
    b.deliver("p1:2", consumer="c2", redelivered=True)  # before the ack's ok: a duplicate, not a resurrection
    b.op("c1", "ok", "ack", "p1:2", queue="q")
    b.ack("p1:2", consumer="c2")
    b.drain()
    return b


def _corrupted() -> HistoryBuilder:
    b = HistoryBuilder(seed=SEED, message_size=SIZE)
    for i in range(1, 4):
        b.publish(f"p1:{i}")
    b.consume("p1:1")
    bad = bytearray(b.body("p1:2"))
    bad[40] ^= 0x20
    b.consume("p1:2", body=bytes(bad), ack="info")
    b.consume("p1:2", consumer="c2", redelivered=True)  # a good copy later does not undo the bad one
    b.consume("p1:3", body=b.body("p1:3")[:30])  # truncated
    b.consume("p8:1", body=b"p8:1|forged")  # never attempted: unexpected, not a corrupted body
    b.drain()
    return b


def _split_brain() -> HistoryBuilder:
    b = HistoryBuilder()
    for i in range(1, 4):
        b.publish(f"p1:{i}")
    b.consume("p1:1")
    b.drain_invoke()
    t_n1_empty = b.t + 1
    b.consume("p1:2", consumer="d1", node="n1")  # through n1 before n1 was empty: fine
    b.consume("p1:3", consumer="d1", node="n2", redelivered=True)  # through n2 after n1 said empty
    b.drain_done(
        consumed=2,
        nodes={
            "n1": {"consumed": 1, "ready": 0, "unacked": 0, "empty_at_ns": t_n1_empty, "error": None},
            "n2": {"consumed": 1, "ready": 0, "unacked": 0, "empty_at_ns": b.t + 10, "error": None},
            "n3": {"consumed": 0, "ready": 0, "unacked": None, "empty_at_ns": None, "error": "unreachable"},
        },
    )
    return b


S = 1_000_000_000


def _stranded() -> HistoryBuilder:
    """A network of brokers (disjoint nodes): p1:2 was forwarded to n2 and sat there while the
    consumers read the queue through n1; the drain found it on n2 after n1 had said empty. p1:4,
    confirmed just before the workload's end, is the tail the drain reads: no finding."""
    b = HistoryBuilder(disjoint=True)
    b.t = 1 * S
    b.publish("p1:1")
    b.consume("p1:1")
    b.t = 2 * S
    b.publish("p1:2", node="n2")
    b.t = 20 * S
    b.publish("p1:3")
    b.consume("p1:3")
    b.publish("p1:4")
    b.t = 30 * S
    b.drain_invoke()
    b.consume("p1:4", consumer="d1", node="n1")
    t_n1_empty = b.t + 1
    b.consume("p1:2", consumer="d1", node="n2")  # through n2 after n1 said empty: no copy, stranded
    b.drain_done(
        consumed=2,
        nodes={
            "n1": {"consumed": 1, "ready": 0, "unacked": 0, "empty_at_ns": t_n1_empty, "error": None},
            "n2": {"consumed": 1, "ready": 0, "unacked": 0, "empty_at_ns": b.t + 10, "error": None},
        },
    )
    return b


def _budgets() -> HistoryBuilder:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.publish("p1:2")
    b.consume("p1:1")
    b.consume("p1:1", redelivered=True)  # resurrected (and duplicated)
    b.deliver("p1:2")
    b.deliver("p1:2", consumer="c2", redelivered=True)
    b.ack("p1:2")
    b.ack("p1:2", consumer="c2")  # consumed twice: duplicated
    b.publish("p1:9")
    b.consume("p1:9", ack="info")
    b.consume("p1:9", consumer="c2", redelivered=True)  # its first ack may not have arrived: not a duplicate
    b.drain()
    return b


LITERALS = {
    "lost": _lost,
    "lost_undrained": _lost_undrained,
    "unexpected": _unexpected,
    "duplicated": _duplicated,
    "recovered": _recovered,
    "reordered": _reordered,
    "info_ops": _info_ops,
    "consumed_in_fault": _consumed_in_fault,
    "attributed": _attributed,
    "attributed_undrained": _attributed_undrained,
    "consumption_is_an_ack": _consumption_is_an_ack,
    "ack_unknown": _ack_unknown,
    "lost_causes": _lost_causes,
    "unflagged": _unflagged,
    "resurrected": _resurrected,
    "corrupted": _corrupted,
    "split_brain": _split_brain,
    "stranded": _stranded,
    "budgets": _budgets,
}
SCENARIOS: dict[str, dict] = {
    "corrupted": BODIES,
    "budgets": {"budgets": {"duplicated": 1, "resurrected": 0}},
}


def run(tmp_path: Path, name: str, **kw) -> dict:
    LITERALS[name]().write(tmp_path / name, **kw)
    return dict(check_python(tmp_path / name, SCENARIOS.get(name, {})))


def test_lost(tmp_path: Path) -> None:
    r = run(tmp_path, "lost")
    assert (r["valid"], r["verdict"]) == (False, "LOST")
    assert r["lost"] == ["p1:2"] and not r["lost_truncated"]
    assert r["counts"]["lost"] == 1 and r["counts"]["confirmed"] == 2
    assert r["attribution"]["rows"] == [{"fault_kind": "none", "node": "n2", "status": "lost", "count": 1}]
    assert r["attribution"]["exposure"] == [
        {"fault_kind": "none", "confirmed": 2, "lost": 1, "unreachable": 0, "stuck": 0}
    ]
    assert [m["status"] for m in r["attribution"]["messages"]] == ["lost"]


def test_lost_without_completed_drain_is_unknown(tmp_path: Path) -> None:
    r = run(tmp_path, "lost_undrained")
    assert (r["valid"], r["verdict"]) == ("unknown", "unknown")
    assert r["counts"]["lost"] == 0 and r["counts"]["unreachable"] == 1 and r["drain"]["completed"] is False
    assert "did not complete" in r["reason"]


def test_no_drain_at_all_is_unknown(tmp_path: Path) -> None:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.write(tmp_path)
    r = check_python(tmp_path, {})
    assert r["verdict"] == "unknown" and "no drain" in r["reason"]


def test_unexpected(tmp_path: Path) -> None:
    r = run(tmp_path, "unexpected")
    assert (r["valid"], r["verdict"]) == (False, "INTEGRITY")
    assert r["unexpected"] == ["p7:3"]
    assert r["unexpected_detail"][0]["outcome"] == "none"
    assert r["counts"]["consumed_unique"] == 2


def test_redeliveries_a_consumer_asked_for_are_not_duplicates(tmp_path: Path) -> None:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.deliver("p1:1")
    b.abandon("p1:1", "requeue")
    b.consume("p1:1", redelivered=True)
    b.drain()
    b.write(tmp_path)
    r = check_python(tmp_path, {"budgets": {"duplicated": 0}})
    assert (r["valid"], r["verdict"], r["counts"]["duplicated"]) == (True, "durable", 0)


def test_duplicated_is_reported_not_failed(tmp_path: Path) -> None:
    r = run(tmp_path, "duplicated")
    assert (r["valid"], r["verdict"]) == (True, "durable")
    assert r["counts"]["duplicated"] == 1 and r["counts"]["consumed_total"] == 2
    [d] = r["duplicated"]
    assert [(x["node"], x["redelivered"]) for x in d["deliveries"]] == [("n1", False), ("n2", True)]


def test_recovered(tmp_path: Path) -> None:
    r = run(tmp_path, "recovered")
    assert (r["valid"], r["verdict"]) == (True, "durable")
    c = r["counts"]
    assert (c["confirmed"], c["failed"], c["unknown"], c["recovered"], c["lost"]) == (0, 1, 2, 2, 0)
    assert [d["id"] for d in r["recovered"]] == ["p1:1", "p1:2"]
    assert [d["outcome"] for d in r["recovered"]] == ["info", "fail"]


def test_reordered(tmp_path: Path) -> None:
    r = run(tmp_path, "reordered")
    assert r["valid"] is True
    assert r["counts"]["order_violations"] == 2
    assert [(v["consumer"], v["id"], v["after_seq"]) for v in r["order_violations"]] == [
        ("c1", "p1:1", 2),
        ("c2", "p1:3", 4),
    ]


def test_info_ops_and_retries(tmp_path: Path) -> None:
    r = run(tmp_path, "info_ops")
    c = r["counts"]
    assert (c["attempted"], c["publish_attempts"], c["confirmed"], c["unknown"], c["lost"]) == (3, 4, 1, 2, 0)
    assert r["verdict"] == "durable"
    # The confirm latency is measured from the retry that got the ok, one tick (1 ms) earlier.
    assert r["latency"]["confirm_ms"] == {"n": 1, "p50": 1.0, "p95": 1.0, "p99": 1.0, "max": 1.0}
    # Unconfirmed attempts count against availability.
    assert r["availability"] == [
        {"window": "outside", "kind": None, "attempts": 4, "confirmed": 1, "share": 0.25}
    ]


def test_message_consumed_only_during_a_fault_is_not_lost(tmp_path: Path) -> None:
    r = run(tmp_path, "consumed_in_fault")
    assert (r["valid"], r["verdict"]) == (True, "durable")
    [w] = r["faults"]
    assert (w["fault_id"], w["kind"], w["node"], w["healed"], w["applied"]) == (
        "f1",
        "partition",
        "n2",
        True,
        True,
    )
    assert w["params"] == {"partitions": [["n1"], ["n2", "n3"]]}
    [d] = [x for x in LITERALS["consumed_in_fault"]().rows if x["f"] == "consume" and x["type"] == "ok"]
    assert w["start_ns"] <= d["time_ns"] <= w["end_ns"]
    assert r["availability"][0] == {
        "window": "f1",
        "kind": "partition",
        "attempts": 1,
        "confirmed": 0,
        "share": 0.0,
    }


def _attributed_rows(status: str) -> list[dict]:
    """The attribution rows of ``_attributed``, its missing messages in class ``status``."""
    return [
        {"fault_kind": kind, "node": node, "status": status, "count": n}
        for kind, node, n in (
            ("kill", "n2", 1),
            ("kill", "n3", 1),
            ("power-loss", "n2", 1),
            ("power-loss", "n3", 2),
        )
    ]


def test_attribution(tmp_path: Path) -> None:
    r = run(tmp_path, "attributed")
    assert r["lost"] == ["p1:0", "p1:2", "p1:3"]
    a = r["attribution"]
    assert a["rows"] == _attributed_rows("lost")
    assert [(m["id"], m["confirm_node"], m["fault_ids"], m["fault_kinds"]) for m in a["messages"]] == [
        ("p1:0", "n3", ["f1", "f2"], ["kill", "power-loss"]),
        ("p1:2", "n2", ["f1", "f2"], ["kill", "power-loss"]),
        ("p1:3", "n3", ["f2"], ["power-loss"]),
    ]
    f2 = r["faults"][1]
    assert f2["healed"] is False and f2["end_ns"] == r["end_ns"]
    assert {e["fault_kind"]: (e["confirmed"], e["lost"], e["unreachable"]) for e in a["exposure"]} == {
        "kill": (3, 2, 0),
        "power-loss": (4, 3, 0),
    }


def test_attribution_counts_unreachable_apart_from_lost(tmp_path: Path) -> None:
    """The drain did not complete: the run counts 0 lost and 3 unreachable, and so do its
    attribution rows, its exposure per fault kind and its attributed messages (they said 3 lost)."""
    r = run(tmp_path, "attributed_undrained")
    assert (r["counts"]["lost"], r["counts"]["unreachable"], r["verdict"]) == (0, 3, "unknown")
    a = r["attribution"]
    assert a["rows"] == _attributed_rows("unreachable")
    assert {
        e["fault_kind"]: (e["confirmed"], e["lost"], e["unreachable"], e["stuck"]) for e in a["exposure"]
    } == {
        "kill": (3, 0, 2, 0),
        "power-loss": (4, 0, 3, 0),
    }
    assert [(m["id"], m["status"]) for m in a["messages"]] == [
        ("p1:0", "unreachable"),
        ("p1:2", "unreachable"),
        ("p1:3", "unreachable"),
    ]


def test_a_delivery_is_not_a_consumption(tmp_path: Path) -> None:
    r = run(tmp_path, "consumption_is_an_ack")
    assert (r["valid"], r["verdict"]) == (False, "LOST")
    assert r["lost"] == ["p1:1"] and r["lost_detail"][0]["cause"] == "delivered, never acked"
    assert [d["id"] for d in r["recovered"]] == ["p1:3"]
    assert r["unexpected"] == []
    c = r["counts"]
    assert (c["delivered_unique"], c["delivered_total"], c["consumed_unique"], c["consumed_total"]) == (
        4,
        4,
        1,
        1,
    )
    assert r["history_schema"] == 2


def test_ack_of_unknown_outcome(tmp_path: Path) -> None:
    r = run(tmp_path, "ack_unknown")
    assert [d["id"] for d in r["ack_unknown"]] == ["p1:1"] and r["counts"]["ack_unknown"] == 1
    # p1:2 came back after its ack failed, p1:3 was redelivered after its ack was written (the info
    # completion came later), p1:4's ack definitely failed: all three lost, not unknown.
    assert r["lost"] == ["p1:2", "p1:3", "p1:4"]
    assert {d["cause"] for d in r["lost_detail"]} == {"delivered, never acked"}


def test_ack_unknown_alone_is_durable_and_said(tmp_path: Path) -> None:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.publish("p1:2")
    b.consume("p1:1")
    b.consume("p1:2", ack="info")
    b.drain()
    b.write(tmp_path)
    r = check_python(tmp_path, {})
    assert (r["valid"], r["verdict"], r["counts"]["lost"], r["counts"]["ack_unknown"]) == (
        True,
        "durable",
        0,
        1,
    )
    assert r["reason"] == "1 of 2 confirmed messages consumed; the other 1 were acked with an unknown outcome"


def test_each_lost_message_has_its_cause(tmp_path: Path) -> None:
    r = run(tmp_path, "lost_causes")
    assert [(d["id"], d["cause"], d["abandon_cause"]) for d in r["lost_detail"]] == [
        ("p1:1", "never delivered", None),
        ("p1:2", "abandoned delivery never redelivered", "crash"),
        ("p1:3", "delivered, never acked", None),
        ("p1:5", "abandoned delivery never redelivered", "recover"),
    ]
    assert r["lost_by_cause"] == [
        {"cause": "abandoned delivery never redelivered", "abandon_cause": "crash", "count": 1},
        {"cause": "abandoned delivery never redelivered", "abandon_cause": "recover", "count": 1},
        {"cause": "delivered, never acked", "abandon_cause": None, "count": 1},
        {"cause": "never delivered", "abandon_cause": None, "count": 1},
    ]
    assert r["counts"]["abandoned"] == 4 and r["counts"]["unflagged_redeliveries"] == 0


def test_unflagged_redelivery_is_reported_not_failed(tmp_path: Path) -> None:
    r = run(tmp_path, "unflagged")
    assert (r["valid"], r["verdict"]) == (True, "durable")
    assert r["counts"]["unflagged_redeliveries"] == 1
    [u] = r["unflagged_redeliveries"]
    assert (u["id"], u["delivery"]["process"], u["delivery"]["node"], u["delivery"]["redelivered"]) == (
        "p1:1",
        "c2",
        "n2",
        False,
    )
    assert u["abandon_cause"] == "requeue" and u["abandon_index"] < u["delivery"]["index"]


def test_resurrected_is_apart_from_duplicated(tmp_path: Path) -> None:
    r = run(tmp_path, "resurrected")
    assert (r["valid"], r["verdict"]) == (True, "durable")
    assert (r["counts"]["resurrected"], r["counts"]["duplicated"]) == (1, 2)
    [x] = r["resurrected"]
    assert (x["id"], x["ack_process"], x["ack_node"], x["deliveries_after"]) == ("p1:1", "c1", "n1", 1)
    assert (x["delivery"]["process"], x["delivery"]["node"]) == ("c2", "n2")
    assert x["ack_index"] < x["delivery"]["index"]


def test_corrupted_bodies_are_integrity_failures(tmp_path: Path) -> None:
    from harness.spec import body_digest, message_body

    r = run(tmp_path, "corrupted")
    assert (r["valid"], r["verdict"]) == (False, "INTEGRITY")
    assert r["counts"]["corrupted"] == 2 and r["unexpected"] == ["p8:1"]
    assert r["notes"] == []
    two, three = r["corrupted"]
    sent = message_body("p1:2", SEED, SIZE)
    assert two["id"] == "p1:2" and two["deliveries"] == 1 and two["delivery"]["process"] == "c1"
    assert two["expected_digest"] == body_digest(sent) != two["digest"]
    assert two["expected"] == sent.decode() and len(two["expected"]) == SIZE
    assert two["received"] != two["expected"] and two["received_length"] == SIZE
    assert [i for i, (x, y) in enumerate(zip(two["expected"], two["received"], strict=True)) if x != y] == [
        40
    ]
    assert three["id"] == "p1:3" and three["received"] == message_body("p1:3", SEED, SIZE).decode()[:30]
    assert three["received_length"] == 30


def test_bodies_unverified_without_seed_is_said(tmp_path: Path) -> None:
    _corrupted().write(tmp_path)
    r = check_python(tmp_path, {})
    assert r["counts"]["corrupted"] == 0 and r["verdict"] == "INTEGRITY"  # the unexpected id still fails
    assert r["notes"] == ["bodies not verified: the scenario gives no seed and workload.message_size"]


def test_deliveries_without_digest_are_counted_in_notes(tmp_path: Path) -> None:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.consume("p1:1")
    b.drain()
    b.write(tmp_path)
    r = check_python(tmp_path, BODIES)
    assert r["notes"] == ["1 of 1 deliveries carry no body digest and were not verified"]


def test_split_brain_copy_found_after_another_node_said_empty(tmp_path: Path) -> None:
    r = run(tmp_path, "split_brain")
    assert (r["valid"], r["verdict"]) == (True, "durable")
    assert r["counts"]["split_brain"] == 1
    [x] = r["split_brain"]
    n1_empty = r["drain"]["ops"][0]["nodes"]["n1"]["empty_at_ns"]
    assert (x["id"], x["drainer"], x["queue"], x["node"]) == ("p1:3", "d1", "q", "n2")
    assert x["empty"] == [{"node": "n1", "empty_at_ns": n1_empty}] and x["ack_ns"] > n1_empty
    [op] = r["drain"]["ops"]
    assert (op["process"], op["queue"], op["outcome"], op["consumed"]) == ("d1", "q", "ok", 2)
    assert op["nodes"]["n3"]["error"] == "unreachable"


def test_stranded_on_a_disjoint_node_is_a_liveness_finding_not_a_split_brain_copy(tmp_path: Path) -> None:
    r = run(tmp_path, "stranded")
    assert (r["valid"], r["verdict"]) == (True, "durable")
    assert r["counts"]["split_brain"] == 0 and r["split_brain"] == []
    [g] = r["liveness"]["stranded"]
    assert (g["queue"], g["node"], g["count"]) == ("q", "n2", 1)
    [ack] = [
        x
        for x in LITERALS["stranded"]().rows
        if x["f"] == "ack" and x["value"] == "p1:2" and x["type"] == "ok"
    ]
    assert g["confirmed_from_ns"] == g["confirmed_to_ns"] == 2 * S + 2_000_000
    assert g["read_to_ns"] == ack["time_ns"] and g["wait_max_ns"] == ack["time_ns"] - g["confirmed_from_ns"]
    assert describe_stranded(g).startswith("1 message sat up to 28.0 s on n2 (q, confirmed 2.0 s to 2.0 s")


def test_the_same_drain_on_nodes_that_copy_is_a_split_brain_copy(tmp_path: Path) -> None:
    b = _stranded()
    b.disjoint = False
    b.write(tmp_path)
    r = check_python(tmp_path, {})
    assert r["counts"]["split_brain"] == 1 and r["liveness"]["stranded"] == []


def test_drain_that_could_not_finish_makes_loss_unknown(tmp_path: Path) -> None:
    b = HistoryBuilder()
    b.publish("p1:1")
    b.drain(
        outcome="info",
        nodes={"n1": {"consumed": 0, "ready": 3, "unacked": 0, "empty_at_ns": None, "error": "timeout"}},
    )
    b.write(tmp_path)
    r = check_python(tmp_path, {})
    assert (r["valid"], r["verdict"], r["counts"]["lost"], r["counts"]["unreachable"]) == (
        "unknown",
        "unknown",
        0,
        1,
    )
    assert r["drain"]["ops"][0]["outcome"] == "info" and r["drain"]["completed"] is False


@pytest.mark.parametrize(
    ("budgets", "want"),
    [
        ({}, (True, "durable")),
        ({"duplicated": None, "resurrected": None}, (True, "durable")),
        ({"duplicated": 2, "resurrected": 1}, (True, "durable")),
        ({"duplicated": 1}, (False, "DUPLICATED")),
        ({"resurrected": 0}, (False, "RESURRECTED")),
        ({"duplicated": 0, "resurrected": 0}, (False, "RESURRECTED")),
    ],
)
def test_budgets(tmp_path: Path, budgets: dict, want: tuple) -> None:
    _budgets().write(tmp_path)
    r = check_python(tmp_path, {"budgets": budgets})
    assert (r["valid"], r["verdict"]) == want
    assert (r["counts"]["duplicated"], r["counts"]["resurrected"]) == (2, 1)


def test_loss_and_integrity_take_precedence_over_budgets(tmp_path: Path) -> None:
    b = _budgets()
    b.publish("p1:3")
    b.drain()
    b.write(tmp_path / "lost")
    assert check_python(tmp_path / "lost", {"budgets": {"resurrected": 0}})["verdict"] == "LOST"
    b.consume("p5:5")
    b.write(tmp_path / "both")
    r = check_python(tmp_path / "both", {"budgets": {"resurrected": 0}})
    assert r["verdict"] == "LOST" and "1 consumed but never attempted" in r["reason"]
    c = _budgets()
    c.consume("p5:5")
    c.write(tmp_path / "integrity")
    assert check_python(tmp_path / "integrity", {"budgets": {"resurrected": 0}})["verdict"] == "INTEGRITY"
    d = _budgets()
    d.publish("p1:3")
    d.drain(complete=False)
    d.write(tmp_path / "undrained")  # the last drain op is still open: loss unknown, budget certain
    assert check_python(tmp_path / "undrained", {"budgets": {"resurrected": 0}})["verdict"] == "RESURRECTED"


def test_budgets_read_from_a_run_directory_scenario_json(tmp_path: Path) -> None:
    _budgets().write(tmp_path)
    stored = {
        "scenario": {"name": "x", "seed": 3, "budgets": {"duplicated": 0, "resurrected": None}},
        "seed": 3,
    }
    assert check_python(tmp_path, stored)["verdict"] == "DUPLICATED"


@pytest.mark.parametrize(
    ("scenario", "message"),
    [
        ({"budgets": {"duplicated": -1}}, "scenario budgets.duplicated must be a whole number >= 0 or null"),
        ({"budgets": {"lost": 3}}, "scenario budgets: unknown key(s) lost"),
        ({"budgets": [1]}, "scenario budgets must be a mapping"),
        ({"seed": "x"}, "scenario seed must be a whole number"),
        ({"workload": {"message_size": 1.5}}, "scenario workload.message_size must be"),
    ],
)
def test_malformed_scenario_values_are_one_clear_error(tmp_path: Path, scenario: dict, message: str) -> None:
    _budgets().write(tmp_path)
    with pytest.raises(ScenarioError, match=re.escape(message)):
        check_python(tmp_path, scenario)


def test_percentiles_are_nearest_rank(tmp_path: Path) -> None:
    b = HistoryBuilder()
    for i in range(1, 101):
        b.op("p1", "invoke", "publish", f"p1:{i}")
        b.op("p1", "ok", "publish", f"p1:{i}", at=b.t + i * 1000)  # latency i microseconds
    b.drain()
    b.write(tmp_path)
    lat = check_python(tmp_path, {})["latency"]["confirm_ms"]
    assert lat == {"n": 100, "p50": 0.05, "p95": 0.095, "p99": 0.099, "max": 0.1}


def test_python_reads_jsonl_when_parquet_is_missing(tmp_path: Path) -> None:
    r_jsonl = run(tmp_path, "attributed", parquet=False)
    r_parquet = check_python(_write(tmp_path / "pq", "attributed"), {})
    assert r_jsonl == r_parquet


def _write(d: Path, name: str) -> Path:
    LITERALS[name]().write(d)
    return d


def test_missing_history_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match="no history.parquet or history.jsonl in"):
        check_python(tmp_path, {})


# Literals checked again under another scenario: bodies unverified (no seed), another budget.
SPARK_VARIANTS = [
    ("corrupted", {}),
    ("budgets", {"budgets": {"duplicated": 1}}),
    ("budgets", {"budgets": {"duplicated": 2, "resurrected": 1}}),
]


@pytest.mark.spark
@pytest.mark.slow
def test_spark_matches_python_on_literals(tmp_path: Path, spark_engine) -> None:
    cases = [(name, SCENARIOS.get(name, {})) for name in LITERALS] + SPARK_VARIANTS
    for i, (name, scenario) in enumerate(cases):
        d = tmp_path / f"{i}-{name}"
        LITERALS[name]().write(d)
        expected = check_python(d, scenario)
        got = spark_engine(d, scenario)
        assert got["engine"] == "spark"
        got["engine"] = "python"
        assert got == expected, (name, scenario)
    verdicts = [
        check_python(tmp_path / f"{len(LITERALS) + k}-{n}", s)["verdict"]
        for k, (n, s) in enumerate(SPARK_VARIANTS)
    ]
    assert verdicts == ["INTEGRITY", "DUPLICATED", "durable"]


@pytest.mark.spark
def test_spark_needs_parquet(tmp_path: Path, spark_engine) -> None:
    _lost().write(tmp_path, parquet=False)
    with pytest.raises(HistoryError, match="no history.parquet in"):
        spark_engine(tmp_path, {})


@pytest.mark.spark
@pytest.mark.slow
def test_spark_master_option_runs_the_same_job(tmp_path: Path, spark_engine) -> None:
    from spark_reports import spark_session

    _attributed().write(tmp_path, jsonl=False)
    got = spark_engine(tmp_path, {}, spark_master="local[1]")
    assert spark_session("local[1]").sparkContext.master == "local[1]"
    got["engine"] = "python"
    assert got == check_python(tmp_path, {})
