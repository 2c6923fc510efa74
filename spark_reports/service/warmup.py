"""A check of a tiny history with every kind of finding, run while a run's workload goes on.

The first check in a JVM pays for class loading, the JIT and Spark's code generation of
every stage the job has; a check of a few dozen records that takes every branch of the
job (a fault window, a lost message after a completed drain, an ack of unknown outcome, a duplicate, a resurrection,
a corrupted body, an abandon and an unflagged redelivery, a delivery out of order, a
split-brain copy, a message consumed from a dead-letter queue, a stream's reads, a seek and a copy's
holdings, which turn on the stream anomaly parts) pays for them before the real history is there.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from spark_reports.synth import HistoryBuilder

SEED, SIZE = 1, 64
SCENARIO = {"seed": SEED, "workload": {"message_size": SIZE}}


def warm_up_history(run_dir: Path) -> Path:
    b = HistoryBuilder(seed=SEED, message_size=SIZE)
    b.fault("f1", "partition")
    for i in range(1, 5):
        b.publish(f"p1:{i}")
    b.publish("p1:5", "fail")
    b.publish("p1:6", "info")
    b.publish("p1:7")
    b.publish("p1:8")
    b.consume("p1:2")
    b.consume("p1:1")  # after p1:2 from the same producer: out of order
    b.consume("p1:1", consumer="c2", redelivered=True)  # acked twice: duplicated, resurrected
    b.deliver("p1:3", body=b"not what was sent")
    b.abandon("p1:3")
    b.consume("p1:3")  # after the abandon, not flagged redelivered
    b.consume("p1:6")
    b.consume("p1:7", ack="info")  # the ack's outcome unknown
    b.consume("p1:8", queue="q.dead")  # dead-lettered: consumed from the dead-letter queue
    b.heal("f1")
    b.drain_invoke(drainer="d1")
    b.consume("p9:1", consumer="d1", node="n2")  # never published: unexpected; acked on n2 after n1 was empty
    b.drain_done(drainer="d1", nodes={"n1": {"consumed": 0, "empty_at_ns": 1}, "n2": {"consumed": 1}})
    b.read("p1:1", 1)
    b.seek(1)
    b.read("p1:4", 4)  # jumps over 2 and 3, which the copy holds: a poll skip
    b.holdings("n1", [(k, f"p1:{k}") for k in range(1, 5)])
    return b.write(run_dir, jsonl=False)


CHECKS = 6
"""Warm-up checks at most: each of the first few leaves the next one faster (the JIT compiles more
of Spark's planner and of the job's code each time: the first six checks of this history in one
fresh JVM took 17.8, 7.2, 6.2, 6.0, 5.0 and 5.3 s here), and so does it for the real check.
Every second one is planned as for a big history (``big``): adaptive execution, whole-stage code
and the hash-aggregate pass, which a small history's check never takes (two such checks took the
first check of a 1M-record history from 11.3 s to 9.6 s)."""


def warm_up(
    check: Callable[[Path, dict, bool], object], *, times: int = 1, wanted: Callable[[], bool] = lambda: False
) -> int:
    """Run ``check(run_dir, scenario, big)`` on the warm-up history in a temporary directory,
    ``times`` times (``big`` every second time), or fewer once ``wanted()`` says a real check is
    waiting. Returns how many ran."""
    with tempfile.TemporaryDirectory(prefix="brokerchaos-spark-warmup-") as tmp:
        run = warm_up_history(Path(tmp))
        for i in range(times):
            if i and wanted():
                return i
            check(run, SCENARIO, i % 2 == 1)
        return times
