"""The warm-up check a run starts in the background: it must take every branch of the Spark job
(so the real check finds all of it compiled) and agree with the Python engine like any history."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from spark_reports import check_python
from spark_reports.engines.verdict import COUNT_KEYS
from spark_reports.service.warmup import SCENARIO, warm_up_history


def test_the_warm_up_history_has_every_kind_of_finding() -> None:
    with tempfile.TemporaryDirectory() as d:
        r = check_python(warm_up_history(Path(d)), SCENARIO)
    assert r["verdict"] == "LOST" and r["drain"]["completed"]
    # stuck is the drain's split of what the engines find missing, decided outside the Spark job
    # (``_common``): a history has lost (a finished drain) or stuck (an unfinished one), not both.
    assert [k for k in COUNT_KEYS if k != "stuck" and not r["counts"][k]] == []  # type: ignore[literal-required]
    assert r["faults"] and r["faults"][0]["healed"]
    # the stream anomaly parts are only asked of a history with a stream's operations
    assert r["anomalies"]["counts"]["poll_skip"] and r["anomalies"]["counts"]["holdings"]


@pytest.mark.spark
def test_spark_agrees_with_python_on_the_warm_up_history(spark_engine) -> None:
    with tempfile.TemporaryDirectory() as d:
        run = warm_up_history(Path(d))
        expected = dict(check_python(run, SCENARIO))
        got = dict(spark_engine(run, SCENARIO))
    assert (got.pop("engine"), expected.pop("engine")) == ("spark", "python")
    assert got == expected


@pytest.mark.spark
def test_a_check_planned_as_for_a_big_history_agrees_with_python(spark_engine) -> None:
    """The warm-up's big checks take the hash-aggregate pass, adaptive execution and whole-stage
    code on the tiny history: the same findings."""
    from spark_reports.engines.spark import check as _spark
    from spark_reports.service.warmup import WARM_BIG_ROWS

    with tempfile.TemporaryDirectory() as d:
        run = warm_up_history(Path(d))
        expected = dict(check_python(run, SCENARIO))
        got = dict(_spark._check(run, SCENARIO, None, None, planned_rows=WARM_BIG_ROWS))
    got.pop("engine"), expected.pop("engine")
    assert got == expected


@pytest.mark.spark
def test_a_check_waits_for_the_background_warm_up_and_gets_the_same_result(spark_engine) -> None:
    from spark_reports.engines.spark.check import start_session_in_background

    with tempfile.TemporaryDirectory() as d:
        run = warm_up_history(Path(d) / "run")
        expected = dict(check_python(run, SCENARIO))
        thread = start_session_in_background()
        got = dict(spark_engine(run, SCENARIO))
        assert not thread.is_alive()  # the check joined it before starting its own job
    got.pop("engine"), expected.pop("engine")
    assert got == expected


def test_the_warm_up_repeats_its_check_until_a_real_one_is_wanted() -> None:
    from spark_reports.service.warmup import warm_up

    seen: list[tuple[Path, bool]] = []
    assert warm_up(lambda run, _s, big: seen.append((run, big)), times=4, wanted=lambda: len(seen) >= 2) == 2
    assert len({run for run, _big in seen}) == 1  # the one history, written once
    seen.clear()
    assert warm_up(lambda run, _s, big: seen.append((run, big)), times=3) == 3
    assert [big for _run, big in seen] == [
        False,
        True,
        False,
    ]  # every second one planned as for a big history


@pytest.mark.spark
def test_a_later_runs_start_in_the_same_process_does_not_warm_up_again(spark_engine, monkeypatch) -> None:
    from spark_reports.engines.spark import check as _spark
    from spark_reports.service import warmup

    ran: list[int] = []
    real = warmup.warm_up

    def counted(check, *, times, wanted):
        n = real(check, times=times, wanted=wanted)
        ran.append(n)
        return n

    monkeypatch.setattr(warmup, "warm_up", counted)
    monkeypatch.setattr(warmup, "CHECKS", 2)
    monkeypatch.setattr(warmup.WARM_UP, "warmed", (None, 0))
    _spark.start_session_in_background().join()
    _spark.start_session_in_background().join()
    assert ran == [2]
    assert warmup.WARM_UP.warmed[1] == 2


@pytest.mark.spark
def test_the_kept_tables_columns_are_the_same_planned_and_optimised(spark_engine) -> None:
    """Spark warns of a kept (locally checkpointed) table whose planned columns differ from its
    optimised ones, on every check: the per-id tables of both passes must not draw it."""
    from spark_reports.engines.spark import check as _spark
    from spark_reports.engines.spark import ids as _spark_ids
    from spark_reports.engines.spark.scope import Scope

    with tempfile.TemporaryDirectory() as d:
        run = warm_up_history(Path(d))
        spark = _spark.spark_session()
        history = _spark._prepare(spark, run, SCENARIO, 0)
        scope = Scope(spark, {0: history.ctx})
        job = _spark._Job(spark, history.h, scope, history.ctx.ops, history.names)
        kept: list = []

        def keep(df: Any) -> Any:
            kept.append(df)
            return df

        _spark_ids.classify(job.events(), scope, history.names, keep, passes="both")
        _spark_ids.classify(job.events(), scope, history.names, keep, passes="ordered")
        # The hash-aggregate pass's, its tangled ids, the ordered pass's for those, the ordered pass's for all.
        assert len(kept) == 4
        for df in kept:
            qe = df._jdf.queryExecution()
            planned, optimised = qe.analyzed().output(), qe.optimizedPlan().output()
            assert [planned.apply(i).dataType().json() for i in range(planned.size())] == [
                optimised.apply(i).dataType().json() for i in range(optimised.size())
            ]


@pytest.mark.spark
def test_a_real_check_cancels_the_warm_up_check_under_way_and_gets_the_same_result(monkeypatch) -> None:
    """A real check does not wait for a warm-up check to finish: it cancels the warm-up's jobs (their
    tag), waits for the thread to end and checks with the same result."""
    from spark_reports import check_spark
    from spark_reports.engines.spark import check as _spark
    from spark_reports.service.warmup import WARM_UP

    monkeypatch.setattr(WARM_UP, "warmed", (None, 0))  # an earlier test's warm-up counts for nothing
    before = WARM_UP.cancelled
    with tempfile.TemporaryDirectory() as d:
        run = warm_up_history(Path(d) / "run")
        expected = dict(check_python(run, SCENARIO))
        thread = _spark.start_session_in_background("local[*]")
        while not (
            WARM_UP.session is not None and WARM_UP.session.sparkContext.statusTracker().getActiveJobsIds()
        ):
            assert thread.is_alive(), "the warm-up ended before any of its jobs was seen"
            thread.join(0.01)
        got = dict(check_spark(run, SCENARIO, spark_master="local[*]"))
        assert not thread.is_alive()
    assert WARM_UP.cancelled == before + 1
    got.pop("engine"), expected.pop("engine")
    assert got == expected


@pytest.mark.spark
def test_the_jvm_warms_up_at_a_low_cpu_priority_and_checks_at_the_harnesss_own(monkeypatch) -> None:
    """The warm-up runs beside the brokers under test: every JVM thread at WARM_UP_NICE while it
    does; the real check puts them back at the harness's own nice (where the kernel lets it)."""
    from spark_reports import check_spark
    from spark_reports.engines.spark import check as _spark
    from spark_reports.service.jvm_priority import WARM_UP_NICE, jvm_pid, thread_nices
    from spark_reports.service.warmup import WARM_UP

    monkeypatch.setattr(WARM_UP, "warmed", (None, 0))
    with tempfile.TemporaryDirectory() as d:
        run = warm_up_history(Path(d) / "run")
        thread = _spark.start_session_in_background("local[*]")
        while WARM_UP.lowered is None:
            assert thread.is_alive(), "the warm-up ended without lowering the JVM's priority"
            thread.join(0.01)
        pid = jvm_pid(_spark.spark_session("local[*]"))
        assert pid == WARM_UP.lowered
        assert set(thread_nices(pid).values()) == {WARM_UP_NICE}
        check_spark(run, SCENARIO, spark_master="local[*]")
    assert WARM_UP.lowered is None
    if os.geteuid() == 0:  # raising a priority back needs CAP_SYS_NICE
        assert set(thread_nices(pid).values()) == {os.getpriority(os.PRIO_PROCESS, 0)}
