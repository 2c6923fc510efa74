"""Grading: exact intervals over runs, a bootstrap over runs, and no bound from one run."""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_crosscheck import plans

from spark_reports import (
    HistoryError,
    check_python,
    clopper_pearson_interval,
    clopper_pearson_upper,
    describe_grade,
    grade_runs,
)
from spark_reports.engines.grade import bootstrap_ratio, grade_results
from spark_reports.synth import HistoryBuilder
from tests.factories import fixture_settings


def _cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def _solve(f: Any, target: float, increasing: bool) -> float:
    """Bisection for f(p) = target on [0, 1], straight from the binomial sums."""
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (f(mid) < target) == increasing else (lo, mid)
    return (lo + hi) / 2


def _brute_upper(k: int, n: int, tail: float) -> float:
    """P(X <= k | n, p) = tail."""
    return _solve(lambda p: _cdf(k, n, p), tail, increasing=False)


def _brute_lower(k: int, n: int, tail: float) -> float:
    """P(X >= k | n, p) = tail."""
    return _solve(lambda p: 1 - _cdf(k - 1, n, p), tail, increasing=True)


@pytest.mark.parametrize(("k", "n"), [(1, 10), (3, 20), (5, 100), (50, 1000), (0, 7), (9, 10)])
def test_one_sided_upper_bound_matches_the_binomial_sum(k: int, n: int) -> None:
    assert clopper_pearson_upper(k, n) == pytest.approx(_brute_upper(k, n, 0.05), rel=1e-9)


@pytest.mark.parametrize(("k", "n"), [(1, 10), (3, 20), (5, 10), (7, 40), (1, 2), (19, 20)])
def test_two_sided_interval_matches_the_binomial_sums(k: int, n: int) -> None:
    interval = clopper_pearson_interval(k, n)
    assert interval is not None
    assert interval[0] == pytest.approx(_brute_lower(k, n, 0.025), rel=1e-9)
    assert interval[1] == pytest.approx(_brute_upper(k, n, 0.025), rel=1e-9)


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        # Published Clopper-Pearson 95% intervals (e.g. 1 of 10: 0.0025 to 0.4450).
        (1, 10, 0.00252857854446, 0.445016117028),
        (5, 10, 0.187086028447, 0.812913971553),
        (3, 20, 0.0320709371855, 0.378926826545),
        (7, 40, 0.0733827293521, 0.327790133362),
        (10, 10, 0.691502892181, 1.0),
    ],
)
def test_two_sided_interval_known_values(k: int, n: int, low: float, high: float) -> None:
    assert clopper_pearson_interval(k, n) == pytest.approx((low, high), rel=1e-9)


def test_one_sided_known_values_and_edges() -> None:
    assert clopper_pearson_upper(0, 10) == pytest.approx(0.258865550893, rel=1e-9)
    assert clopper_pearson_upper(0, 3) == pytest.approx(0.631596850136, rel=1e-9)
    assert clopper_pearson_upper(0, 0) is None and clopper_pearson_interval(0, 0) is None
    assert clopper_pearson_upper(4, 4) == 1.0
    assert clopper_pearson_interval(0, 10) == pytest.approx((0.0, 1 - 0.025**0.1))
    with pytest.raises(ValueError):
        clopper_pearson_upper(5, 4)
    with pytest.raises(ValueError):
        clopper_pearson_interval(-1, 4)


CLUSTERED = [(4203, 20_000)] + [(0, 20_000)] * 9 + [(12, 18_000), (0, 19_000)]


def test_bootstrap_is_determined_by_its_seed() -> None:
    runs = [(i * i, 1000 + 7 * i) for i in range(20)]  # many distinct ratios: the seed shows in the endpoints
    a = bootstrap_ratio(runs, resamples=2000, seed=7)
    assert a == bootstrap_ratio(runs, resamples=2000, seed=7)
    assert a != bootstrap_ratio(runs, resamples=2000, seed=8)


def test_bootstrap_endpoints_are_resampled_ratios_around_the_pooled_one() -> None:
    low, high = bootstrap_ratio(CLUSTERED, resamples=2000, seed=1) or (None, None)
    assert low is not None and high is not None
    pooled = sum(x for x, _ in CLUSTERED) / sum(c for _, c in CLUSTERED)
    assert low < pooled < high
    # One cluster holds nearly every loss: a resample without that run loses at most 12 messages.
    assert low <= 12 / (11 * 18_000)
    # A binomial interval treating 239,000 messages as independent would be about pooled +- 3%;
    # resampling runs keeps the cluster whole and spans a factor of several.
    assert high > 2 * pooled


def test_bootstrap_of_identical_runs_is_their_ratio() -> None:
    assert bootstrap_ratio([(3, 1000)] * 5, resamples=500, seed=0) == pytest.approx((0.003, 0.003))


def test_bootstrap_refuses_one_run_and_empty_denominators() -> None:
    assert bootstrap_ratio([(4203, 20_000)]) is None
    assert bootstrap_ratio([(0, 0), (0, 0)]) is None


def _res(
    lost: int,
    confirmed: int,
    *,
    verdict: str | None = None,
    completed: bool = True,
    exposure: Sequence[tuple[str, int, int]] = (),
) -> dict[str, Any]:
    v = verdict or ("LOST" if lost else "durable")
    return {
        "verdict": v,
        "valid": {"durable": True, "unknown": "unknown"}.get(v, False),
        "reason": "",
        "counts": {"confirmed": confirmed, "lost": lost, "unexpected": 1 if v == "INTEGRITY" else 0},
        "drain": {"completed": completed},
        "attribution": {"exposure": [{"fault_kind": k, "confirmed": c, "lost": x} for k, c, x in exposure]},
    }


def test_a_single_run_gives_counts_and_no_bound() -> None:
    g = grade_results([("r", _res(0, 20_000), 1)])
    assert (g["graded_runs"], g["confirmed"], g["lost"]) == (1, 20_000, 0)
    assert g["runs_lost_interval"] == "none"
    assert (g["runs_lost_low"], g["runs_lost_high"], g["loss_low"], g["loss_high"]) == (
        None,
        None,
        None,
        None,
    )
    text = "\n".join(describe_grade(g))
    assert "0 of 20,000 confirmed messages lost in the one run" in text
    assert "a bound needs several seeded runs" in text
    assert "bound over" not in text and "interval" not in text


def test_a_single_lossy_run_gives_no_bound_either() -> None:
    g = grade_results([("r", _res(4203, 20_000), 1)])
    assert g["verdict"] == "LOST" and g["loss_rate"] == pytest.approx(4203 / 20_000)
    assert g["loss_low"] is None and g["runs_lost_high"] is None


def test_unknown_runs_are_neither_durable_nor_in_any_denominator() -> None:
    g = grade_results(
        [
            ("a", _res(0, 1000), 1),
            ("b", _res(0, 900), 2),
            ("c", _res(5, 800, verdict="unknown", completed=False), 3),
            ("d", {"verdict": "unknown", "valid": "unknown", "error": "checker failed"}, 4),
        ]
    )
    assert g["verdict"] == "unknown"
    assert g["verdicts"] == {"durable": 2, "unknown": 2}
    assert (g["graded_runs"], g["excluded_runs"], g["confirmed"], g["lost"]) == (2, 2, 1900, 0)
    assert [r["graded"] for r in g["runs"]] == [True, True, False, False]
    assert g["runs_lost_interval"] == "one-sided"
    assert g["runs_lost_high"] == pytest.approx(1 - 0.05**0.5)
    text = "\n".join(describe_grade(g))
    assert "0 of 2 runs lost a message" in text and "one-sided" in text
    assert "2 runs left out of every rate" in text and "neither durable nor lossy" in text
    assert "no interval above zero" in text  # no [0, 0] interval that would read as proof


def test_an_integrity_run_whose_drain_finished_counts_its_losses() -> None:
    g = grade_results(
        [
            ("a", _res(0, 1000, verdict="INTEGRITY"), 1),
            ("b", _res(0, 1000), 2),
            ("c", _res(3, 1000, verdict="INTEGRITY", completed=False), 3),
        ]
    )
    assert [r["graded"] for r in g["runs"]] == [True, True, False]
    assert g["verdict"] == "INTEGRITY" and g["verdicts"]["INTEGRITY"] == 2


def test_a_kinds_loss_is_the_runs_lost_and_stuck_not_its_unreachable() -> None:
    """A graded run (its drain completed) whose missing messages sit on a node that did not come
    back counts them unreachable, not lost: so does its fault kind. Stuck ones are a loss, as the
    run's count has them; an exposure row made before the classes were apart counts ``lost``."""

    def res(lost: int, unreachable: int, stuck: int, row: dict[str, int]) -> dict[str, Any]:
        r = _res(lost, 1000, verdict="UNAVAILABLE" if unreachable else None)
        r["counts"] |= {"unreachable": unreachable, "stuck": stuck}
        r["attribution"]["exposure"] = [{"fault_kind": "kill", "confirmed": 100, **row}]
        return r

    g = grade_results(
        [
            ("a", res(0, 7, 0, {"lost": 0, "unreachable": 7, "stuck": 0}), 1),
            ("b", res(0, 0, 3, {"lost": 0, "unreachable": 0, "stuck": 3}), 2),
            ("c", res(2, 0, 0, {"lost": 2}), 3),
        ]
    )
    assert [(r["graded"], r["lost"]) for r in g["runs"]] == [(True, 0), (True, 3), (True, 2)]
    [kill] = g["per_kind"]
    assert (kill["runs"], kill["runs_lost"], kill["confirmed"], kill["lost"]) == (3, 2, 300, 5)


def test_a_verdict_the_grader_does_not_know_is_a_failure_and_still_counted() -> None:
    g = grade_results(
        [
            ("a", _res(0, 1000, verdict="RESURRECTED"), 1),
            ("b", _res(0, 1000, verdict="unknown"), 2),
            ("c", _res(0, 1000), 3),
        ]
    )
    assert g["verdict"] == "RESURRECTED"
    assert list(g["verdicts"].items()) == [("durable", 1), ("unknown", 1), ("RESURRECTED", 1)]


def test_several_runs_give_a_two_sided_share_and_a_bootstrap_rate() -> None:
    runs = [("r0", _res(4203, 20_000, exposure=[("kill", 5000, 4203), ("none", 15_000, 0)]), 0)]
    runs += [
        (f"r{i}", _res(0, 20_000, exposure=[("kill", 5000, 0), ("none", 15_000, 0)]), i) for i in range(1, 10)
    ]
    g = grade_results(runs, resamples=2000, seed=3)
    assert (g["runs_lost"], g["graded_runs"], g["runs_lost_interval"]) == (1, 10, "two-sided")
    assert (g["runs_lost_low"], g["runs_lost_high"]) == pytest.approx((0.00252857854446, 0.445016117028))
    assert (g["loss_low"], g["loss_high"]) == bootstrap_ratio(
        [(r[1]["counts"]["lost"], 20_000) for r in runs], resamples=2000, seed=3
    )
    assert (g["bootstrap_resamples"], g["bootstrap_seed"]) == (2000, 3)
    kinds = {k["fault_kind"]: k for k in g["per_kind"]}
    assert (kinds["kill"]["runs"], kinds["kill"]["runs_lost"], kinds["kill"]["lost"]) == (10, 1, 4203)
    assert kinds["kill"]["low"] is not None and kinds["none"]["low"] is None
    text = "\n".join(describe_grade(g))
    assert "1 of 10 runs lost messages" in text and "two-sided exact binomial interval over runs" in text
    assert "B=2,000, seed 3" in text and "resampling whole runs" in text
    assert g == grade_results(runs, resamples=2000, seed=3)


def _run(root: Path, name: str, *, lose: bool, kind: str, seed: int) -> Path:
    b = HistoryBuilder()
    b.fault("f1", kind, node="n2")
    for i in range(1, 11):
        b.publish(f"p1:{i}", node="n2")
    b.heal("f1")
    for i in range(1, 11):
        if not (lose and i == 3):
            b.consume(f"p1:{i}")
    b.drain()
    d = root / name
    b.write(d, jsonl=False)
    (d / "scenario.json").write_text(json.dumps({"scenario": {"name": "t"}, "seed": seed}))
    return d


def test_grade_runs_reads_run_directories_and_their_seeds(tmp_path: Path) -> None:
    dirs = [
        _run(tmp_path, "a", lose=False, kind="kill", seed=5),
        _run(tmp_path, "b", lose=True, kind="kill", seed=6),
        _run(tmp_path, "c", lose=False, kind="partition", seed=7),
    ]
    g = grade_runs(dirs, engine="python")
    assert (g["confirmed"], g["lost"], g["verdict"], g["runs_lost"]) == (30, 1, "LOST", 1)
    assert [(r["verdict"], r["seed"]) for r in g["runs"]] == [("durable", 5), ("LOST", 6), ("durable", 7)]
    assert (g["runs_lost_low"], g["runs_lost_high"]) == pytest.approx(clopper_pearson_interval(1, 3))
    kinds = {k["fault_kind"]: k for k in g["per_kind"]}
    assert (kinds["kill"]["runs"], kinds["kill"]["confirmed"], kinds["kill"]["lost"]) == (2, 20, 1)
    assert (kinds["partition"]["runs"], kinds["partition"]["lost"]) == (1, 0)


def test_grade_from_stored_results(tmp_path: Path) -> None:
    d = _run(tmp_path, "a", lose=True, kind="pause", seed=1)
    with pytest.raises(HistoryError, match="no results.json"):
        grade_runs([d], engine="stored")
    (d / "results.json").write_text(json.dumps(check_python(d, {})))
    assert grade_runs([d], engine="stored")["lost"] == 1


def _mixed_runs(root: Path, drawn: list[dict]) -> list[Path]:
    """Runs that differ in everything the job reads per run: schema, bodies, seeds, faults, drain spans."""
    from test_crosscheck import build, scenario
    from test_schema1 import _run_dir

    from spark_reports.service.warmup import SCENARIO as WARM_SCENARIO
    from spark_reports.service.warmup import warm_up_history

    dirs = [
        _run(root, "a", lose=False, kind="kill", seed=5),
        _run(root, "b", lose=True, kind="pause", seed=6),
    ]
    warm = warm_up_history(root / "warm")
    (warm / "scenario.json").write_text(json.dumps({"scenario": WARM_SCENARIO, "seed": 1}))
    old = root / "old"
    old.mkdir()
    dirs += [warm, _run_dir(old, "old-parquet")]
    for i, plan in enumerate(drawn):
        d = build(plan).write(root / f"plan{i}", jsonl=False)
        (d / "scenario.json").write_text(json.dumps({"scenario": scenario(plan), "seed": 11}))
        dirs.append(d)
    empty = HistoryBuilder()
    empty.drain()  # no client record at all: every count zero
    dirs.append(empty.write(root / "empty", jsonl=False))
    return dirs


@pytest.mark.spark
@pytest.mark.slow
@fixture_settings(2, deadline=None)
@given(drawn=st.lists(plans(), min_size=3, max_size=3))
def test_grading_runs_in_one_spark_job_equals_grading_each_alone(drawn: list[dict], spark_engine) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _grade_together_and_alone(_mixed_runs(Path(tmp), drawn), spark_engine)


def _graded_view(r: dict) -> dict:
    """What grading reads of a run's results."""
    return {
        "exposure": r["attribution"]["exposure"],
        **{k: r[k] for k in ("valid", "verdict", "reason", "counts", "drain")},
    }


def _grade_together_and_alone(dirs: list[Path], spark_engine: Any) -> None:
    from spark_reports.engines.spark.check import aggregate_runs

    scenarios = [
        json.loads((d / "scenario.json").read_text()) if (d / "scenario.json").is_file() else {} for d in dirs
    ]
    together = aggregate_runs(dirs, scenarios)
    alone = [dict(spark_engine(d, s)) for d, s in zip(dirs, scenarios, strict=True)]
    python = [dict(check_python(d, s)) for d, s in zip(dirs, scenarios, strict=True)]
    for one, a, p in zip(together, alone, python, strict=True):
        assert _graded_view(one) == _graded_view(a) == _graded_view(p)
        assert one["engine"] == a["engine"] == "spark"
    assert {r["verdict"] for r in together} >= {"durable", "LOST"}
    seeds = [s.get("seed") for s in scenarios]
    graded = grade_runs(dirs, engine="spark", resamples=500)
    assert graded == grade_results(
        [(str(d), r, x) for d, r, x in zip(dirs, alone, seeds, strict=True)], resamples=500
    )
    assert graded == grade_runs(dirs, engine="python", resamples=500)


def _rec(kind: str, s: float | None) -> dict:
    return {
        "healed": True,
        "kind": kind,
        "recovered": s is not None,
        "recovery_ns": None if s is None else int(s * 1e9),
    }


def test_recovery_is_graded_per_fault_kind_with_the_runs_that_never_recovered() -> None:
    from spark_reports.engines.grade import describe_recovery, grade_recovery

    runs = [
        {"recovery": [_rec("partition", 1.0), _rec("partition", 3.0), _rec("kill", 10.0)]},
        {"recovery": [_rec("partition", 2.0), _rec("partition", None)]},  # a queue that never came back
        {
            "recovery": [_rec("partition", 4.0), {"healed": False, "kind": "partition"}]
        },  # never healed: no sample
        # recovered at once, then down for good after the heal of a kill: that run counts as not back
        {"recovery": [_rec("kill", 0.5)], "unavailable": [{"queue": "q", "fault_kind": "kill"}]},
    ]
    [kill, part] = grade_recovery(runs, resamples=500, seed=1)
    assert (part["fault_kind"], part["runs"], part["samples"], part["recovered"]) == ("partition", 3, 5, 4)
    assert (part["median_s"], part["p90_s"], part["max_s"]) == (2.0, 4.0, 4.0)
    median_low, median_high = part["median_low"], part["median_high"]
    assert median_low is not None and median_high is not None and median_low <= 2.0 <= median_high
    assert part["max_high"] == 4.0 and part["max_low"] is not None and part["max_low"] <= 4.0
    assert part["runs_never"] == 1
    never_low, never_high = part["never_low"], part["never_high"]
    assert never_low is not None and never_high is not None and 0 < never_low < 1 / 3 < never_high < 1
    assert (kill["runs"], kill["samples"], kill["recovered"], kill["runs_never"]) == (2, 2, 2, 1)
    assert (kill["median_s"], kill["max_s"]) == (0.5, 10.0)
    text = describe_recovery([kill, part])
    assert text[2].startswith("  partition: 4 of 5 step-queues recovered; median 2.00 [")
    assert "1 of 3 runs had a queue that did not come back (share" in text[2]
