"""The delay checks (early / late) on literal histories, and both engines agreeing on generated ones."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.spec.history import FIELDS, arrow_schema
from spark_reports.engines.delay import check_delay_python, check_delay_spark, check_rows, nearest_rank

MS = 1_000_000


class H:
    """A history written by hand, with explicit times (ns on the harness's clock)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def _row(
        self, t: int, process: str, type_: str, f: str, value: str | None = None, detail: Any = None
    ) -> None:
        self.rows.append(
            {
                "index": len(self.rows),
                "time_ns": t,
                "process": process,
                "node": "n1",
                "type": type_,
                "f": f,
                "queue": "chaos-1",
                "value": value,
                "detail": None if detail is None else json.dumps(detail),
            }
        )

    def publish(self, mid: str, at_ms: int, delay_ms: int | None, outcome: str = "ok") -> H:
        self._row(
            at_ms * MS, "p1", "invoke", "publish", mid, None if delay_ms is None else {"delay_ms": delay_ms}
        )
        self._row(at_ms * MS + MS, "p1", outcome, "publish", mid)
        return self

    def deliver(self, mid: str, at_ms: int, at_ns: int = 0) -> H:
        self._row(at_ms * MS + at_ns, "c1", "invoke", "consume")
        self._row(at_ms * MS + at_ns, "c1", "ok", "consume", mid)
        return self

    def write(self, run_dir: Path) -> Path:
        full = [{k: r.get(k) for k in FIELDS} | {"wall_time": "", "schema": 2} for r in self.rows]
        pq.write_table(pa.Table.from_pylist(full, schema=arrow_schema()), run_dir / "history.parquet")
        return run_dir


def test_on_time_and_late_deliveries_are_valid_and_summarised() -> None:
    h = H().publish("p1:1", 0, 1000).publish("p1:2", 10, 500).publish("p1:3", 20, None)
    res = check_rows(
        h.deliver("p1:3", 21).deliver("p1:2", 510).deliver("p1:1", 1000).rows, late_after_ms=5000
    )
    assert (res["valid"], res["verdict"]) == (True, "durable")
    c = res["counts"]
    assert (c["delayed_publishes"], c["delayed_confirmed"], c["delayed_delivered"]) == (2, 2, 2)
    assert (c["early"], c["late"], c["lateness_p50_ms"], c["lateness_max_ms"]) == (0, 0, 0, 0)


def test_a_delivery_one_nanosecond_before_due_is_early() -> None:
    h = H().publish("p1:1", 100, 1000).deliver("p1:1", 1099, at_ns=MS - 1)
    res = check_rows(h.rows)
    assert res["valid"] is False and res["verdict"] == "INTEGRITY"
    assert res["counts"]["early"] == 1 and res["counts"]["early_ids"] == 1
    e = res["anomalies"]["early"][0]
    assert (e["id"], e["due_ns"], e["delivered_ns"], e["early_ms"]) == ("p1:1", 1100 * MS, 1100 * MS - 1, 0)


def test_an_early_redelivery_counts_and_the_first_delivery_sets_the_lateness() -> None:
    h = H().publish("p1:1", 0, 1000).deliver("p1:1", 7000).deliver("p1:1", 500)
    res = check_rows(h.rows, late_after_ms=5000)
    assert res["counts"]["early"] == 1
    assert res["counts"]["late"] == 1 and res["anomalies"]["late"][0]["late_ms"] == 6000
    assert res["counts"]["lateness_max_ms"] == 6000


def test_no_delayed_publishes_is_unknown() -> None:
    res = check_rows(H().publish("p1:1", 0, None).deliver("p1:1", 1).rows)
    assert res["valid"] == "unknown" and res["counts"]["delayed_publishes"] == 0


def test_late_threshold_comes_from_the_scenario(tmp_path: Path) -> None:
    run = H().publish("p1:1", 0, 100).deliver("p1:1", 400).write(tmp_path)
    assert check_delay_python(run, {"workload": {"delay": {"late_ms": 200}}})["counts"]["late"] == 1
    assert check_delay_python(run, {"workload": {"delay": {"late_ms": 300}}})["counts"]["late"] == 0


@given(st.lists(st.integers(-50, 10_000), min_size=1, max_size=200), st.sampled_from([50, 90, 99]))
def test_nearest_rank_is_the_smallest_value_with_p_percent_at_or_below(values: list[int], p: int) -> None:
    xs = sorted(values)
    v = nearest_rank(xs, p)
    assert v is not None
    assert sum(x <= v for x in xs) * 100 >= p * len(xs)
    assert sum(x < v for x in xs) * 100 < p * len(xs)


def random_history(rng: random.Random) -> H:
    h = H()
    t = 0
    ids = []
    for i in range(1, rng.randint(1, 30)):
        t += rng.randint(0, 50)
        mid = f"p{rng.randint(1, 2)}:{i}"
        delay = rng.choice([None, rng.randint(1, 3000)])
        h.publish(mid, t, delay, rng.choice(["ok", "ok", "info", "fail"]))
        ids.append((mid, t, delay))
        if rng.random() < 0.1:  # the same id published again
            h.publish(mid, t + 5, rng.randint(1, 3000))
    for mid, at, delay in rng.sample(ids, len(ids)):
        for _ in range(rng.choice([0, 1, 1, 2])):
            h.deliver(mid, at + (delay or 0) + rng.randint(-200, 8000), rng.randint(0, MS - 1))
    return h


@pytest.mark.spark
def test_spark_and_python_agree_on_generated_histories(tmp_path: Path, spark_engine: Any) -> None:
    from spark_reports import spark_session

    spark = spark_session()
    for seed in range(6):
        run = tmp_path / f"r{seed}"
        run.mkdir()
        random_history(random.Random(seed)).write(run)
        scenario = {"workload": {"delay": {"late_ms": 1000}}}
        py, sp = check_delay_python(run, scenario), check_delay_spark(run, scenario, spark=spark)
        assert py["engine"] == "python" and sp["engine"] == "spark"
        py.pop("engine"), sp.pop("engine")
        assert sp == py, f"seed {seed}"


def test_the_report_shows_the_delay_verdict_and_the_lateness_plot(tmp_path: Path) -> None:
    from spark_reports import check_python, render_report
    from spark_reports.synth import HistoryBuilder

    b = HistoryBuilder(step_ns=10 * MS)
    for i in range(1, 40):
        mid = f"p1:{i}"
        b.op("p1", "invoke", "publish", mid, queue="q", detail={"delay_ms": 100})
        b.op("p1", "ok", "publish", mid, queue="q")
        if i == 10:
            b.fault("f1", "kill", node="n2")
        if i == 20:
            b.heal("f1")
    for i in range(1, 40):
        b.consume(f"p1:{i}")
    b.drain()
    run = b.write(tmp_path / "run", jsonl=False)
    results = dict(check_python(run, {}))
    delay = check_delay_python(run, {})
    assert delay["valid"] is True and delay["counts"]["delayed_delivered"] == 39
    results["checkers"] = {
        "python": {"verdict": results["verdict"]},
        "delay": {k: delay.get(k) for k in ("valid", "verdict", "counts", "error", "engine")},
    }
    text = render_report(run, results).read_text()  # type: ignore[arg-type]
    assert "Delayed messages" in text and "lateness p99 (ms)" in text
    assert (run / "plots" / "delay-lateness.png").stat().st_size > 5000
    assert text.count("src='data:image/png;base64,") == 3


def _overtaken_delayed_message(tmp_path: Path, delayed: bool) -> Path:
    """p1:1 published with a 500 ms delay, p1:2 at once: p1:2 arrives first."""
    from spark_reports.synth import HistoryBuilder

    b = HistoryBuilder(step_ns=10 * MS)
    b.op("p1", "invoke", "publish", "p1:1", queue="q", detail={"delay_ms": 500} if delayed else None)
    b.op("p1", "ok", "publish", "p1:1", queue="q")
    b.op("p1", "invoke", "publish", "p1:2", queue="q")
    b.op("p1", "ok", "publish", "p1:2", queue="q")
    b.consume("p1:2")
    b.consume("p1:1")
    b.drain()
    return b.write(tmp_path / ("delayed" if delayed else "plain"), jsonl=False)


def _order_counts(engine: Any, run: Path, scenario: dict) -> tuple[int, list[str]]:
    r = dict(engine(run, scenario))
    return r["counts"]["order_violations"], [v["id"] for v in r["order_violations"]]


def test_a_delayed_message_overtaken_by_a_later_publish_is_no_order_violation(tmp_path: Path) -> None:
    from spark_reports import check_python

    with_delays = {"workload": {"delay": {"share": 0.5}}}
    assert _order_counts(check_python, _overtaken_delayed_message(tmp_path, True), with_delays) == (0, [])
    # without the delay the same arrival order is a violation
    assert _order_counts(check_python, _overtaken_delayed_message(tmp_path, False), with_delays) == (
        1,
        ["p1:1"],
    )


@pytest.mark.spark
def test_spark_leaves_delayed_messages_out_of_the_order_check_too(tmp_path: Path, spark_engine: Any) -> None:
    with_delays = {"workload": {"delay": {"share": 0.5}}}
    assert _order_counts(spark_engine, _overtaken_delayed_message(tmp_path, True), with_delays) == (0, [])
    assert _order_counts(spark_engine, _overtaken_delayed_message(tmp_path, False), with_delays) == (
        1,
        ["p1:1"],
    )
