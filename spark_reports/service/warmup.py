"""A check of a tiny history with every kind of finding, run while a run's workload goes on.

The first check in a JVM pays for class loading, the JIT and Spark's code generation of
every stage the job has; a check of a few dozen records that takes every branch of the
job (a fault window, a lost message after a completed drain, an ack of unknown outcome, a duplicate, a resurrection,
a corrupted body, an abandon and an unflagged redelivery, a delivery out of order, a
split-brain copy, a message consumed from a dead-letter queue, a stream's reads, a seek and a copy's
holdings, which turn on the stream anomaly parts) pays for them before the real history is there.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_reports.progress import progress, quiet
from spark_reports.service.jvm_priority import WARM_UP_NICE, jvm_pid, set_nice
from spark_reports.service.session import is_remote, spark_session, where
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


WARM_BIG_ROWS = 10_000_000
"""The size a big warm-up check is planned for."""
TAG = "brokerchaos-warm-up"
"""The job tag of every warm-up job (the warm-up thread's own, in an in-process session): a real
check cancels them instead of waiting for the warm-up check under way (``WarmUp.before_check``)."""

Check = Callable[..., object]
"""The engine's check: ``check(run_dir, scenario, target, driver_memory, planned_rows=n)``; the
service runs it and knows nothing else of it."""


class WarmUp:
    """The warm-up of this process's JVM, and all its state: the one object that starts it in the
    background, lowers the JVM's priority meanwhile, and gives the JVM back to a real check.

    The engine hands in its check (the warm-up runs it on ``warm_up_history``), so the service
    needs nothing of the engine, and the engine asks only ``before_check``."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.wanted = threading.Event()
        """Set when a real check waits for the background warm-up: it stops after the check under way."""
        self.warmed: tuple[Any, int] = (None, 0)
        """The session warmed, and how many warm-up checks it has run: a later run's start in the
        same process (the chaos suite's, ``--runs N``) runs only what is left of CHECKS."""
        self.session: Any = None
        """The in-process session the background warm-up checks run in, while they run (else None)."""
        self.lowered: int | None = None
        """The pid of the JVM whose threads run at WARM_UP_NICE for the warm-up (``jvm_priority``)."""
        self.cancelled = 0
        """How many times a real check cancelled a warm-up check under way."""

    def start(
        self, check: Check, master: str | None = None, driver_memory: str | None = None
    ) -> threading.Thread:
        """Start the JVM while something else (a run's workload) goes on, and check a tiny history with
        every kind of finding on it a few times, so the real check finds the classes loaded, the JIT
        warm and the job's code generated. A check started meanwhile waits for the warm-up check
        under way, and no other starts.

        A failure here is not reported: the check starts the session again and says why.
        """
        self.wanted.clear()
        self.thread = threading.Thread(
            target=self._run, args=(check, master, driver_memory), name="spark-session", daemon=True
        )
        self.thread.start()
        return self.thread

    def _run(self, check: Check, master: str | None, driver_memory: str | None) -> None:
        try:
            session = spark_session(master, driver_memory)
            done = self.warmed[1] if self.warmed[0] is session else 0
            # A Spark Connect server is warm already (``brokerchaos spark start`` warms it) and the
            # checks would take its CPU from the brokers under test when it is on this machine.
            if done < CHECKS and not is_remote(where(master)):
                session.sparkContext.addJobTag(TAG)  # this thread's jobs only
                self.session = session
                self._lower_jvm(session)
                with quiet():
                    done += warm_up(
                        lambda d, s, big: check(
                            d, s, master, driver_memory, planned_rows=WARM_BIG_ROWS if big else None
                        ),
                        times=CHECKS - done,
                        wanted=self.wanted.is_set,
                    )
                self.warmed = (session, done)
        except Exception:  # noqa: BLE001 - the check reports it, with the real context
            pass
        finally:
            self.session = None

    def warm_server(self, check: Check, url: str) -> float:
        """The warm-up checks run through a Spark Connect server, so that its JIT and code generation
        are paid when it starts, not by the first real check; seconds taken."""
        t0 = time.monotonic()
        with quiet():
            warm_up(
                lambda d, s, big: check(d, s, url, None, planned_rows=WARM_BIG_ROWS if big else None),
                times=CHECKS,
            )
        return round(time.monotonic() - t0, 1)

    def before_check(self) -> None:
        """A real check is about to start: the warm-up stops (its jobs cancelled) and the JVM is back
        at the harness's own priority."""
        warming = self.thread
        if warming is not None and warming is not threading.current_thread():
            self.wanted.set()
            self._stop(warming)
        self._restore_jvm()

    def _lower_jvm(self, session: Any) -> None:
        pid = jvm_pid(session)
        if pid is not None and set_nice(pid, WARM_UP_NICE):
            self.lowered = pid

    def _restore_jvm(self) -> None:
        """The JVM back at the harness's own nice for the real check; where the kernel refuses (no
        CAP_SYS_NICE), it checks at the warm-up's nice and says so."""
        pid, self.lowered = self.lowered, None
        if pid is not None and not set_nice(pid, os.getpriority(os.PRIO_PROCESS, 0)):
            progress("spark", "the JVM stays at the warm-up's low CPU priority", nice=WARM_UP_NICE)

    def _stop(self, warming: threading.Thread) -> None:
        """Wait for the background start to end, cancelling its warm-up jobs meanwhile.

        The JVM's start is waited for (the check needs it), but not a warm-up check under way: on a
        busy machine one took minutes, and the real check, which compiles what it needs itself,
        waited for all of it. Its jobs carry ``TAG``; each one started is cancelled (a warm-up check
        is several jobs in a row, so this goes on until the thread ends: it stops after the check
        under way, ``wanted``)."""
        cancelled = False
        while warming.is_alive():
            session = self.session
            if session is not None:
                tracker = session.sparkContext.statusTracker()
                if tracker.getActiveJobsIds():
                    session.sparkContext.cancelJobsWithTag(TAG)
                    cancelled = True
            warming.join(0.05)
        if cancelled:
            self.cancelled += 1
            progress("spark", "cancelled the warm-up check under way")


WARM_UP = WarmUp()
"""This process's warm-up: one JVM a process (``service.session``), so one warm-up."""
