"""The stream checks on literal histories: one per anomaly, a clean one, and both engines agreeing."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from harness.spec.history import entry_offset
from spark_reports.engines.stream import ANOMALIES, check_rows, check_stream_python, check_stream_spark
from tests.spark_reports.rows import Q, Rows


class H(Rows):
    """A history being written by hand: each helper appends the rows a driver would."""

    def publish(self, mid: str, seq: int | None, outcome: str = "ok") -> H:
        self._row("p1", "invoke", "publish", mid)
        self._row("p1", outcome, "publish", mid, {"stream_seq": seq} if outcome == "ok" else None)
        return self

    def deliver(self, mid: str, seq: int, cseq: int, delivered: int = 1, ack: bool = True) -> H:
        self._row("c1", "invoke", "consume")
        self._row(
            "c1", "ok", "consume", mid, {"stream_seq": seq, "consumer_seq": cseq, "delivered": delivered}
        )
        if ack:
            self._row("c1", "invoke", "ack", mid)
            self._row("c1", "ok", "ack", mid)
        return self

    def drain(self, replicas: dict[str, Any] | None = None, ok: bool = True, sparse: bool = False) -> H:
        self._row("d1", "invoke", "drain")
        value: dict[str, Any] = {"consumed": 0, "nodes": {}, "replicas": replicas or {}}
        if sparse:
            value["offsets"] = "sparse"  # as the Redis driver's drain says
        self._row("d1", "ok" if ok else "info", "drain", value)
        return self

    def read(self, mid: str, seq: int, reader: str = "r1") -> H:
        self._row(reader, "invoke", "read", mid)
        self._row(reader, "ok", "read", mid, {"stream_seq": seq})
        return self

    def holdings(self, node: str, entries: list[tuple[int, str]]) -> H:
        self._row("holdings", "invoke", "holdings")
        self._row("holdings", "ok", "holdings", {"entries": [list(e) for e in entries]})
        return self

    def confirm(self, mid: str, publishing_id: int) -> H:
        """A RabbitMQ stream publish: its confirm names the publishing id, not the entry's offset."""
        self._row("p1", "invoke", "publish", mid)
        self._row("p1", "ok", "publish", mid, {"publishing_id": publishing_id})
        return self

    def drained(self, mid: str, offset: int) -> H:
        """An entry the RabbitMQ stream drain read: its offset, no consumer sequence or count."""
        self._row("d1", "invoke", "consume")
        self._row("d1", "ok", "consume", mid, {"stream_seq": offset})
        self._row("d1", "invoke", "ack", mid)
        self._row("d1", "ok", "ack", mid, {"stream": "the drain's read"})
        return self

    def clean(self, n: int = 3) -> H:
        for i in range(1, n + 1):
            self.publish(f"p1:{i}", i)
        for i in range(1, n + 1):
            self.deliver(f"p1:{i}", i, i)
        view = {"messages": n, "first_seq": 1, "last_seq": n}
        return self.drain({"n1": view, "n2": dict(view), "n3": None})


def test_clean_stream_is_valid() -> None:
    res = check_rows(H().clean().rows)
    assert (res["valid"], res["verdict"]) == (True, "durable")
    assert res["counts"]["streams"] == 1 and res["counts"]["confirmed"] == 3


def test_one_sequence_confirmed_to_two_messages() -> None:
    h = H().publish("p1:1", 1).publish("p2:1", 1).deliver("p2:1", 1, 1).drain()
    res = check_rows(h.rows)
    assert res["valid"] is False and res["verdict"] == "INTEGRITY"
    assert res["counts"]["seq_conflicts"] == 1
    assert res["anomalies"]["seq_conflicts"] == [{"queue": Q, "seq": 1, "ids": ["p1:1", "p2:1"]}]
    assert res["counts"]["seq_mismatches"] == 0  # p2:1 was delivered at a sequence it was confirmed with


def test_delivery_at_another_sequence_than_confirmed() -> None:
    h = H().publish("p1:1", 1).publish("p1:2", 2).deliver("p1:1", 1, 1).deliver("p1:2", 3, 2).drain()
    res = check_rows(h.rows)
    assert res["counts"]["seq_mismatches"] == 1
    assert res["anomalies"]["seq_mismatches"][0]["confirmed_seq"] == [2]
    assert res["counts"]["gaps"] == 1  # and nothing was delivered at 2


def test_one_sequence_delivered_as_two_messages() -> None:
    h = H().publish("p1:1", 1).deliver("p1:1", 1, 1).deliver("p9:9", 1, 2).drain()
    assert check_rows(h.rows)["counts"]["delivered_conflicts"] == 1


def test_gap_counts_only_after_a_finished_drain_and_above_the_first_sequence() -> None:
    def gappy(ok: bool, first: int) -> dict[str, Any]:
        h = H()
        for i in (1, 2, 3, 4):
            h.publish(f"p1:{i}", i)
        h.deliver("p1:1", 1, 1).deliver("p1:4", 4, 2)
        view = {"messages": 4, "first_seq": first, "last_seq": 4}
        return check_rows(h.drain({"n1": view}, ok=ok).rows)

    res = gappy(True, 1)
    assert res["counts"]["gaps"] == 2 and [g["seq"] for g in res["anomalies"]["gaps"]] == [2, 3]
    unfinished = gappy(False, 1)
    assert unfinished["counts"]["gaps"] == 0 and unfinished["valid"] == "unknown"
    assert gappy(True, 4)["counts"]["gaps"] == 0  # the stream removed what is below its first sequence


MS = 1_700_000_000_000


def sparse(ms: int, seq: int = 0) -> int:
    """A Redis entry id's offset (``harness.spec.entry_offset``)."""
    return entry_offset(f"{MS + ms}-{seq}")


def sparse_gaps() -> H:
    """A Redis-style stream: p1:1..4 confirmed at ids far apart, p1:1 and p1:4 delivered; p1:5's
    publish unknown but a reader read it and a node holds it; p1:6 held beyond the highest delivery."""
    h = H()
    for i, at in enumerate((sparse(0), sparse(0, 1), sparse(7), sparse(90)), start=1):
        h.publish(f"p1:{i}", at)
    h.publish("p1:5", None, outcome="info").publish("p1:6", None, outcome="info")
    h.deliver("p1:1", sparse(0), 1).deliver("p1:4", sparse(90), 2)
    h.read("p1:5", sparse(40))
    h.holdings("n1", [(sparse(0), "p1:1"), (sparse(40), "p1:5"), (sparse(90), "p1:4"), (sparse(95), "p1:6")])
    return h.drain({}, sparse=True)


def test_sparse_gaps_are_the_known_offsets_nothing_delivered() -> None:
    """Entry ids (Redis): a gap is an offset a confirm, a read or a node's copy shows, never one of
    the integers between (there are 90 million here)."""
    res = check_rows(sparse_gaps().rows)
    assert [g["seq"] for g in res["anomalies"]["gaps"]] == [sparse(0, 1), sparse(7), sparse(40)]
    assert res["counts"]["streams"] == 1 and res["verdict"] == "INTEGRITY"


def test_reordered_first_deliveries() -> None:
    h = H().publish("p1:1", 1).publish("p1:2", 2).deliver("p1:2", 2, 1).deliver("p1:1", 1, 2).drain()
    res = check_rows(h.rows)
    assert res["counts"]["reordered"] == 1
    # a redelivery out of order is not a reordering
    h2 = H().publish("p1:1", 1).publish("p1:2", 2).deliver("p1:1", 1, 1, ack=False).deliver("p1:2", 2, 2)
    assert check_rows(h2.deliver("p1:1", 1, 3, delivered=2).drain().rows)["counts"]["reordered"] == 0


def test_replicas_that_disagree_after_the_drain() -> None:
    h = H()
    for i in (1, 2):
        h.publish(f"p1:{i}", i).deliver(f"p1:{i}", i, i)
    res = check_rows(
        h.drain(
            {
                "n1": {"messages": 2, "first_seq": 1, "last_seq": 2},
                "n2": {"messages": 1, "first_seq": 1, "last_seq": 1},
                "n3": None,
            }
        ).rows
    )
    assert res["counts"]["diverged_streams"] == 1 and res["valid"] is False
    assert res["anomalies"]["diverged_streams"][0]["replicas"]["n2"]["last_seq"] == 1


def rabbitmq_backlog(n: int = 3, kept: int = 3) -> H:
    """A RabbitMQ 4.3 stream run with no consumer (``consumers: 0``), as its client records it:
    confirms with a publishing id only, a reader's reads with offsets from 0, the drain's reads of
    the ``kept`` entries every node still had, each node's view and holdings."""
    h = H()
    for i in range(1, n + 1):
        h.confirm(f"p1:{i}", i)
    for i in range(1, n + 1):
        h.read(f"p1:{i}", i - 1)
    for i in range(1, kept + 1):
        h.drained(f"p1:{i}", i - 1)
    view = {"messages": kept, "first_seq": 0 if kept else None, "last_seq": kept - 1 if kept else None}
    for node in ("n1", "n2", "n3"):
        h.holdings(node, [(i - 1, f"p1:{i}") for i in range(1, kept + 1)])
    return h.drain({"n1": view, "n2": dict(view), "n3": dict(view)}, sparse=True)


NO_OFFSET = "seq conflicts, seq mismatches (no publish confirm carried a stream offset)"
NO_ORDER = "reordered (no delivery carried its consumer sequence and delivery count)"


def test_a_stream_whose_confirms_carry_no_offset_says_what_it_did_not_judge() -> None:
    """RabbitMQ's publish confirm carries no offset and its deliveries no consumer sequence: the
    stream is counted (the drain read it) and the line says which checks had nothing to judge."""
    res = check_rows(rabbitmq_backlog().rows)
    assert (res["verdict"], res["counts"]["streams"]) == ("durable", 1)
    assert (res["counts"]["confirmed"], res["counts"]["delivered"], res["counts"]["ordered"]) == (0, 3, 0)
    assert res["reason"] == f"no stream anomaly over 1 stream(s); not judged: {NO_OFFSET}; {NO_ORDER}"
    assert res["notes"] == [f"stream not judged: {NO_OFFSET}; {NO_ORDER}"]


def test_a_stream_the_drain_found_empty_is_still_a_stream() -> None:
    """Every confirmed entry gone (a power cut of every node): nothing delivered, but the reads,
    the drain's views and the holdings show the stream; only the replica agreement was judged."""
    res = check_rows(rabbitmq_backlog(kept=0).rows)
    assert (res["verdict"], res["counts"]["streams"], res["counts"]["delivered"]) == ("durable", 1, 0)
    assert res["reason"] == (
        f"no stream anomaly over 1 stream(s); not judged: {NO_OFFSET}; "
        "delivered conflicts, gaps, reordered (nothing was delivered with a stream offset)"
    )


def offset_zero_gap() -> H:
    """RabbitMQ's offsets start at 0: the reader read p1:1 at 0, the nodes' copies begin there, and
    the drain delivered only what came after it."""
    h = rabbitmq_backlog()
    drop = {r["index"] for r in h.rows if r["process"] == "d1" and r["value"] == "p1:1"}
    h.rows = [r for r in h.rows if r["index"] not in drop]
    return h


def test_a_sparse_stream_from_offset_0_has_its_first_offset_judged() -> None:
    res = check_rows(offset_zero_gap().rows)
    assert res["anomalies"]["gaps"] == [{"queue": Q, "seq": 0}]


def one_history(cases: list[H]) -> H:
    """The cases as one history, each on a stream of its own (``q0``, ``q1``..), in order."""
    combined = H()
    for i, h in enumerate(cases):
        for r in h.rows:
            combined.rows.append({**r, "index": len(combined.rows), "queue": f"q{i}" if r["queue"] else None})
    return combined


def test_a_check_judged_on_some_streams_says_on_how_many() -> None:
    """Two streams, one drained with a single replica's view: its replicas were not compared."""
    view = {"messages": 1, "first_seq": 1, "last_seq": 1}
    one = H().publish("p1:1", 1).deliver("p1:1", 1, 1)
    other = H().publish("p2:1", 1).deliver("p2:1", 1, 1)
    res = check_rows(one_history([one.drain({"n1": view, "n2": dict(view)}), other.drain({"n1": view})]).rows)
    assert res["counts"]["streams"] == 2
    assert res["reason"] == (
        "no stream anomaly over 2 stream(s); not judged: "
        "diverged streams on 1 of 2 streams (the drain had fewer than two replicas' views)"
    )


def test_a_stream_with_every_check_judged_says_nothing_more() -> None:
    res = check_rows(H().clean().rows)
    assert (res["reason"], res["notes"]) == ("no stream anomaly over 1 stream(s)", [])


def test_no_stream_at_all() -> None:
    h = H().confirm("p1:1", 1)
    h._row("d1", "invoke", "drain")
    h._row("d1", "ok", "drain", {"consumed": 1, "nodes": {}})  # a queue's drain: no stream's views
    res = check_rows(h.rows)
    assert res["counts"]["streams"] == 0 and "no stream in the history" in res["notes"][-1]


def test_reads_a_run_directory(tmp_path: Path) -> None:
    res = check_stream_python(H().clean().write(tmp_path))
    assert res["valid"] is True and res["counts"]["history_ops"] == len(H().clean().rows)


def random_history(rng: random.Random) -> H:
    """A small stream history with sequences confirmed, delivered, lost, reused, reordered at random."""
    h = H()
    n = rng.randint(1, 8)
    seqs = [rng.randint(1, n + 2) for _ in range(n)]
    for i, s in enumerate(seqs, start=1):
        h.publish(f"p1:{i}", s, rng.choice(["ok", "ok", "info"]))
    order = rng.sample(range(1, n + 1), n)
    for c, i in enumerate(order, start=1):
        if rng.random() < 0.7:
            h.deliver(
                f"p1:{i}", rng.choice([seqs[i - 1], seqs[i - 1] + 1]), c, delivered=rng.choice([1, 1, 2])
            )
    views = {
        "n1": {"messages": n, "first_seq": 1, "last_seq": n},
        "n2": {"messages": rng.choice([n, n - 1]), "first_seq": 1, "last_seq": n},
    }
    return h.drain(views, ok=rng.random() < 0.7)


def _literal_cases() -> list[H]:
    gap = H()
    for i in (1, 2, 3, 4):
        gap.publish(f"p1:{i}", i)
    gap.deliver("p1:1", 1, 1).deliver("p1:4", 4, 2).drain(
        {"n1": {"messages": 4, "first_seq": 1, "last_seq": 4}}
    )
    view = {"messages": 1, "first_seq": 1, "last_seq": 1}
    return [
        sparse_gaps(),
        H().clean(),
        rabbitmq_backlog(),
        rabbitmq_backlog(kept=0),
        offset_zero_gap(),
        H().publish("p2:1", 1).deliver("p2:1", 1, 1).drain({"n1": view}),
        H().publish("p1:1", 1).publish("p2:1", 1).deliver("p2:1", 1, 1).drain(),
        H().publish("p1:1", 1).publish("p1:2", 2).deliver("p1:1", 1, 1).deliver("p1:2", 3, 2).drain(),
        H().publish("p1:1", 1).deliver("p1:1", 1, 1).deliver("p9:9", 1, 2).drain(),
        gap,
        H().publish("p1:1", 1).publish("p1:2", 2).deliver("p1:2", 2, 1).deliver("p1:1", 1, 2).drain(),
        H()
        .publish("p1:1", 1)
        .deliver("p1:1", 1, 1)
        .drain(
            {
                "n1": {"messages": 1, "first_seq": 1, "last_seq": 1},
                "n2": {"messages": 0, "first_seq": 0, "last_seq": 0},
            }
        ),
    ]


@pytest.mark.spark
def test_spark_and_python_agree(tmp_path: Path) -> None:
    """Every literal anomaly above and a few seeded random histories, each on a stream of its own in
    one history (one Spark job for all): the same answer from both engines."""
    cases = _literal_cases() + [random_history(random.Random(seed)) for seed in range(4)]
    run = one_history(cases).write(tmp_path)
    py, sp = check_stream_python(run), check_stream_spark(run)
    assert {k: v for k, v in py.items() if k != "engine"} == {k: v for k, v in sp.items() if k != "engine"}
    assert py["valid"] is False and sum(py["counts"][k] > 0 for k in ANOMALIES) == len(ANOMALIES)
    assert "not judged" in py["reason"]


@pytest.mark.spark
def test_spark_and_python_agree_on_streams_whose_confirms_carry_no_offset(tmp_path: Path) -> None:
    """RabbitMQ's shape alone (confirms without offsets, deliveries without consumer sequences), one
    stream read back by the drain and one the drain found empty: the same counts and lines."""
    run = one_history([rabbitmq_backlog(), rabbitmq_backlog(kept=0)]).write(tmp_path)
    py, sp = check_stream_python(run), check_stream_spark(run)
    assert {k: v for k, v in py.items() if k != "engine"} == {k: v for k, v in sp.items() if k != "engine"}
    assert py["counts"]["streams"] == 2 and py["reason"].startswith(
        "no stream anomaly over 2 stream(s); not judged"
    )
