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
    return [
        sparse_gaps(),
        H().clean(),
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
    combined = H()
    for i, h in enumerate(cases):
        for r in h.rows:
            combined.rows.append({**r, "index": len(combined.rows), "queue": f"q{i}" if r["queue"] else None})
    run = combined.write(tmp_path)
    py, sp = check_stream_python(run), check_stream_spark(run)
    assert {k: v for k, v in py.items() if k != "engine"} == {k: v for k, v in sp.items() if k != "engine"}
    assert py["valid"] is False and sum(py["counts"][k] > 0 for k in ANOMALIES) == len(ANOMALIES)
