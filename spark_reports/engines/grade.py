"""Grading across seeded runs: what several runs can say, and what one run cannot.

A run is the unit of independence, not a message. Losses arrive in clusters (one
failover once dropped 4,203 messages at once), so treating every confirmed message
as an independent Bernoulli trial would give bounds that are far too tight. Two
statements survive that:

- the share of runs that lose anything: each run is one trial, so an exact
  (Clopper-Pearson) binomial interval over runs is valid. One-sided (an upper
  bound) when no run lost anything, two-sided otherwise;
- the per-message loss rate (summed lost over summed confirmed), whose interval
  comes from a seeded bootstrap over runs: whole runs are resampled with
  replacement, so a cluster stays together in every resample.

A run whose loss outcome is not known (the final drain did not finish while
messages were still unconsumed, or every checker failed) is neither durable nor
lossy: it is counted among the verdicts and left out of both denominators. No
bound comes from fewer than ``MIN_RUNS`` runs whose outcome is known.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from harness.spec.results import (
    ANOMALY_CLASSES,
    SCHEMA_VERSION,
    VERDICT_ORDER,
    Grade,
    KindGrade,
    RecoveryGrade,
    RunGrade,
    Verdict,
    compose_verdicts,
    exposure_classes,
    valid_of,
)
from harness.spec.rundir import RESULTS_JSON, SCENARIO_JSON
from spark_reports.engines.anomalies import occurring
from spark_reports.engines.common import HistoryError

CONFIDENCE = 0.95
MIN_RUNS = 2
"""Fewer graded runs than this give counts and no bound."""
VERDICT_RANK: dict[str, int] = {v: i for i, v in enumerate(VERDICT_ORDER)}
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
FEW_RUNS = 10
"""Below this many graded runs percentile bootstrap intervals tend to be too narrow; the text says so."""
LISTING_ORDER: tuple[str, ...] = ("durable", "LOST", "INTEGRITY", "unknown")
"""How verdict counts are listed (not their rank, which is ``harness.spec.results.VERDICT_ORDER``);
a verdict not named here follows them."""


# -- exact binomial intervals ---------------------------------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction for the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            return h
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def beta_quantile(q: float, a: float, b: float) -> float:
    """The x with I_x(a, b) = q, by bisection (I is monotone in x, so bisection cannot miss)."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if betainc(a, b, mid) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * max(hi, 1e-300):
            break
    return hi


def _check(k: int, n: int) -> None:
    if k < 0 or k > n:
        raise ValueError(f"{k} successes outside 0..{n}")


def clopper_pearson_upper(k: int, n: int, confidence: float = CONFIDENCE) -> float | None:
    """One-sided exact upper bound on a binomial probability given k of n.

    Solves P(X <= k | n, p) = 1 - confidence, i.e. p = BetaInv(confidence; k+1, n-k).
    None when there is nothing to bound (n == 0).
    """
    if n <= 0:
        return None
    _check(k, n)
    if k == n:
        return 1.0
    if k == 0:
        return 1.0 - (1.0 - confidence) ** (1.0 / n)
    return beta_quantile(confidence, k + 1.0, float(n - k))


def clopper_pearson_interval(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Two-sided exact interval: each tail holds at most (1 - confidence) / 2."""
    if n <= 0:
        return None
    _check(k, n)
    tail = (1.0 - confidence) / 2
    low = 0.0 if k == 0 else (tail ** (1.0 / n) if k == n else beta_quantile(tail, float(k), n - k + 1.0))
    high = (
        1.0
        if k == n
        else (1.0 - tail ** (1.0 / n) if k == 0 else beta_quantile(1 - tail, k + 1.0, float(n - k)))
    )
    return low, high


# -- bootstrap over runs --------------------------------------------------------------------


def bootstrap_ratio(
    pairs: Sequence[tuple[int, int]],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int | str = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> tuple[float, float] | None:
    """Percentile interval of sum(lost) / sum(confirmed) when whole runs are resampled.

    pairs: one (lost, confirmed) per run. A resample whose runs confirmed nothing has no
    ratio and is skipped. None when fewer than MIN_RUNS runs or nothing was confirmed.
    Percentiles by nearest rank, so the interval is two order statistics of the resamples.
    """
    n = len(pairs)
    if n < MIN_RUNS or sum(c for _, c in pairs) == 0:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        drawn = rng.choices(pairs, k=n)
        confirmed = sum(c for _, c in drawn)
        if confirmed:
            ratios.append(sum(lo for lo, _ in drawn) / confirmed)
    if not ratios:
        return None
    ratios.sort()
    tail = (1.0 - confidence) / 2
    m = len(ratios)
    return ratios[max(0, math.ceil(tail * m) - 1)], ratios[max(0, math.ceil((1 - tail) * m) - 1)]


# -- grading --------------------------------------------------------------------------------


def _run_grade(run_dir: str, res: Mapping[str, Any], seed: int | None) -> RunGrade:
    counts = res.get("counts") or {}
    verdict: Verdict = res["verdict"] if isinstance(res.get("verdict"), str) else "unknown"
    checkers = {n: p.get("verdict") for n, p in (res.get("checkers") or {}).items()}
    stuck = int(counts.get("stuck") or 0)  # held unacked by no consumer: lost to the application
    lost = int(counts.get("lost") or 0) + stuck
    drain = res.get("drain") or {}
    # The loss outcome is known when nothing confirmed is missing, or when it is missing
    # after a completed drain. A checker that failed left no counts; a run the queue checker
    # called unknown stays unknown here too, whatever its counts say. Another checker's
    # verdict (a stream's replicas, a delay) decides the run's verdict, not its loss outcome.
    loss_verdict = checkers.get(res.get("body_checker") or "", verdict)
    unreachable = int(counts.get("unreachable") or 0)
    known = (
        loss_verdict != "unknown"
        and bool(counts)
        and ((lost == 0 and unreachable == 0) or stuck > 0 or bool(drain.get("completed")))
    )
    return RunGrade(
        run_dir=run_dir,
        seed=seed,
        verdict=verdict,
        valid=res.get("valid", "unknown"),
        checkers=checkers,
        graded=known,
        confirmed=int(counts.get("confirmed") or 0),
        lost=lost,
        unexpected=int(counts.get("unexpected") or 0),
        reason=str(res.get("reason") or res.get("error") or ""),
        anomalies=occurring(res.get("anomalies")),
    )


QUEUE_CHECKERS = ("spark", "python")
"""The checkers ``engine="spark"`` and ``"python"`` re-run; a run's other checkers keep their stored verdicts."""


def with_stored_checkers(res: Mapping[str, Any], stored: Mapping[str, Any], engine: str) -> dict[str, Any]:
    """A re-checked run's results, its verdict composed again with the stored verdicts of the
    checkers the grade did not re-run (stream, delay, atomicity, ...): a grade must not call a
    run durable that one of its checkers failed."""
    others = {n: p for n, p in (stored.get("checkers") or {}).items() if n not in QUEUE_CHECKERS}
    out = dict(res)
    if not others:
        return out
    out["checkers"] = {engine: {"verdict": res.get("verdict"), "reason": res.get("reason")}} | {
        n: {"verdict": p.get("verdict"), "reason": p.get("reason") or p.get("error")}
        for n, p in others.items()
    }
    out["body_checker"] = engine
    out["verdict"] = compose_verdicts(p["verdict"] for p in out["checkers"].values())
    out["valid"] = valid_of(out["verdict"])
    return out


def _exposure(res: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """Per fault kind, (lost, confirmed) of the messages exposed to it: lost and stuck, as the run's
    own loss counts them, never the unreachable."""
    rows = (res.get("attribution") or {}).get("exposure") or []
    counts = res.get("counts") or {}
    out = {}
    for r in rows:
        by = exposure_classes(r, counts)
        out[r["fault_kind"]] = (by["lost"] + by["stuck"], int(r["confirmed"]))
    return out


def _runs_lost_interval(
    runs_lost: int, graded: int
) -> tuple[float | None, float | None, Literal["one-sided", "two-sided", "none"]]:
    """The exact binomial interval of the share of runs that lost anything (none below MIN_RUNS)."""
    if graded < MIN_RUNS:
        return None, None, "none"
    if runs_lost == 0:
        return 0.0, clopper_pearson_upper(0, graded), "one-sided"
    low, high = clopper_pearson_interval(runs_lost, graded)  # type: ignore[misc]
    return low, high, "two-sided"


def _per_kind(
    runs: list[RunGrade], exposures: list[dict[str, tuple[int, int]]], resamples: int, seed: int
) -> list[KindGrade]:
    """Per fault kind, over the graded runs: the confirmed messages exposed to it and those lost."""
    kinds: dict[str, list[tuple[int, int]]] = {}
    for r, ex in zip(runs, exposures, strict=True):
        if r["graded"]:
            for kind, pair in ex.items():
                kinds.setdefault(kind, []).append(pair)
    per_kind = []
    for kind, kpairs in sorted(kinds.items()):
        klost, kconf = sum(p[0] for p in kpairs), sum(p[1] for p in kpairs)
        kint = bootstrap_ratio(kpairs, resamples=resamples, seed=f"{seed}:{kind}") if klost else None
        per_kind.append(
            KindGrade(
                fault_kind=kind,
                runs=len(kpairs),
                runs_lost=sum(1 for p in kpairs if p[0]),
                confirmed=kconf,
                lost=klost,
                loss_rate=(klost / kconf) if kconf else None,
                low=kint[0] if kint else None,
                high=kint[1] if kint else None,
            )
        )
    return per_kind


def grade_results(
    results: Sequence[tuple[str, Mapping[str, Any], int | None]],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> Grade:
    """Grade per-run results together (no I/O; grade_runs feeds it).

    Each item is (run directory, its results, the run's seed or None).
    """
    runs: list[RunGrade] = []
    exposures: list[dict[str, tuple[int, int]]] = []
    for run_dir, res, run_seed in results:
        runs.append(_run_grade(run_dir, res, run_seed))
        exposures.append(_exposure(res))
    seen = sorted(
        {r["verdict"] for r in runs},
        key=lambda v: (LISTING_ORDER.index(v) if v in LISTING_ORDER else len(LISTING_ORDER), v),
    )
    verdicts: dict[str, int] = {v: sum(1 for r in runs if r["verdict"] == v) for v in seen}
    worst = compose_verdicts(seen)
    graded = [r for r in runs if r["graded"]]
    runs_lost = sum(1 for r in graded if r["lost"] > 0)
    confirmed = sum(r["confirmed"] for r in graded)
    lost = sum(r["lost"] for r in graded)
    share_low, share_high, share_sided = _runs_lost_interval(runs_lost, len(graded))
    pairs = [(r["lost"], r["confirmed"]) for r in graded]
    # With no loss in any run every resample is 0/n: a [0, 0] "interval" would read as proof of zero.
    interval = bootstrap_ratio(pairs, resamples=resamples, seed=seed) if lost else None
    per_kind = _per_kind(runs, exposures, resamples, seed)
    grade = Grade(
        schema=SCHEMA_VERSION,
        runs=runs,
        verdict=worst,
        verdicts=verdicts,
        confidence=CONFIDENCE,
        graded_runs=len(graded),
        excluded_runs=len(runs) - len(graded),
        runs_lost=runs_lost,
        runs_lost_interval=share_sided,
        runs_lost_low=share_low,
        runs_lost_high=share_high,
        confirmed=confirmed,
        lost=lost,
        loss_rate=(lost / confirmed) if confirmed else None,
        loss_low=interval[0] if interval else None,
        loss_high=interval[1] if interval else None,
        bootstrap_resamples=resamples,
        bootstrap_seed=seed,
        per_kind=per_kind,
        anomalies={
            k: [sum(1 for r in runs if r["anomalies"].get(k)), sum(r["anomalies"].get(k, 0) for r in runs)]
            for k in ANOMALY_CLASSES
            if any(r["anomalies"].get(k) for r in runs)
        },
        recovery=grade_recovery(
            [res.get("liveness") or {} for _d, res, _s in results],
            resamples=resamples,
            seed=seed,
        ),
        statement="",
    )
    grade["statement"] = " ".join(describe_grade(grade)[1:2])
    return grade


# -- recovery -------------------------------------------------------------------------------


def _nearest_rank(sorted_values: Sequence[float], p: int) -> float:
    n = len(sorted_values)
    return sorted_values[max(1, (p * n + 99) // 100) - 1]


RECOVERY_STATS = (("median", 50), ("p90", 90), ("max", 100))


def grade_recovery(
    per_run: Sequence[Mapping[str, Any]],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int | str = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> list[RecoveryGrade]:
    """Per fault kind: the recovery times (seconds) of every healed step and queue of every run
    (each run's ``liveness``: its ``recovery`` rows), their median, p90 and max with bootstrap
    intervals over runs, and the share of runs where a queue did not come back after a step of
    that kind (a step not recovered, or a queue of ``liveness.unavailable`` that follows one)."""
    kinds: dict[str, list[tuple[list[float], int, bool]]] = {}
    for live in per_run:
        # per kind: recovery times, samples not recovered, and whether a queue did not come back
        mine: dict[str, tuple[list[float], int, bool]] = {}
        for u in live.get("unavailable") or []:
            if u.get("fault_kind") is not None:
                times, never, _ = mine.get(u["fault_kind"], ([], 0, False))
                mine[u["fault_kind"]] = (times, never, True)
        for r in live.get("recovery") or []:
            if not r.get("healed") or (r.get("recovered") and r.get("recovery_ns") is None):
                continue  # never healed, or nothing was asked of the queue after the heal
            times, never, gone = mine.get(r["kind"], ([], 0, False))
            if r.get("recovered") and r.get("recovery_ns") is not None:
                times.append(r["recovery_ns"] / 1e9)
            else:
                never += 1
            mine[r["kind"]] = (times, never, gone or not r.get("recovered"))
        for kind, v in mine.items():
            kinds.setdefault(kind, []).append(v)
    out = []
    for kind, runs in sorted(kinds.items()):
        pooled = sorted(t for times, _, _ in runs for t in times)
        stats = {name: _nearest_rank(pooled, p) if pooled else None for name, p in RECOVERY_STATS}
        bounds: dict[str, tuple[float, float] | None] = dict.fromkeys(stats)
        if len(runs) >= MIN_RUNS and pooled:
            rng = random.Random(f"{seed}:recovery:{kind}")
            drawn_stats: dict[str, list[float]] = {name: [] for name, _ in RECOVERY_STATS}
            for _ in range(resamples):
                drawn = sorted(t for times, _, _ in rng.choices(runs, k=len(runs)) for t in times)
                if drawn:
                    for name, p in RECOVERY_STATS:
                        drawn_stats[name].append(_nearest_rank(drawn, p))
            tail = (1 - confidence) / 2 * 100
            for name, vals in drawn_stats.items():
                vals.sort()
                if vals:
                    bounds[name] = (
                        _nearest_rank(vals, max(1, round(tail))),
                        _nearest_rank(vals, round(100 - tail)),
                    )
        never = sum(1 for _, _, gone in runs if gone)
        share = clopper_pearson_interval(never, len(runs), confidence) if len(runs) >= MIN_RUNS else None
        out.append(
            RecoveryGrade(
                fault_kind=kind,
                runs=len(runs),
                samples=len(pooled) + sum(n for _, n, _ in runs),
                recovered=len(pooled),
                median_s=stats["median"],
                p90_s=stats["p90"],
                max_s=stats["max"],
                median_low=(bounds["median"] or (None, None))[0],
                median_high=(bounds["median"] or (None, None))[1],
                p90_low=(bounds["p90"] or (None, None))[0],
                p90_high=(bounds["p90"] or (None, None))[1],
                max_low=(bounds["max"] or (None, None))[0],
                max_high=(bounds["max"] or (None, None))[1],
                runs_never=never,
                never_low=share[0] if share else None,
                never_high=share[1] if share else None,
            )
        )
    return out


def describe_recovery(rows: Sequence[Mapping[str, Any]], confidence: float = CONFIDENCE) -> list[str]:
    """The lines ``grade`` prints for recovery, one per fault kind."""
    if not rows:
        return []
    pct = f"{confidence:.0%}"
    lines = [f"recovery after each heal, per fault kind (seconds; {pct} bootstrap intervals over runs):"]
    for k in rows:

        def stat(name: str, k: Mapping[str, Any] = k) -> str:
            v, lo, hi = k[f"{name}_s"], k[f"{name}_low"], k[f"{name}_high"]
            if v is None:
                return f"{name} -"
            return f"{name} {v:.2f}" + (f" [{lo:.2f}, {hi:.2f}]" if lo is not None else "")

        never = f"{k['runs_never']} of {_runs(k['runs'])} had a queue that did not come back"
        if k["never_low"] is not None:
            never += f" (share {_pct(k['never_low'])} to {_pct(k['never_high'])}, exact {pct})"
        lines.append(
            f"  {k['fault_kind']}: {k['recovered']} of {k['samples']} step-queues recovered; "
            f"{stat('median')}, {stat('p90')}, {stat('max')}; {never}"
        )
    return lines


# -- words ----------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{x:.1%}" if x >= 0.01 or x == 0 else f"{x * 100:.2g}%"


def _rate(x: float | None) -> str:
    return "-" if x is None else ("0" if x == 0 else f"{x:.3g}")


def _runs(n: int) -> str:
    return f"{n} run{'' if n == 1 else 's'}"


def checker_verdicts(grade: Grade) -> dict[str, str]:
    """Per checker, how many runs got each verdict from it ("2 durable, 1 INTEGRITY")."""
    tally: dict[str, dict[str, int]] = {}
    for r in grade["runs"]:
        for name, v in (r.get("checkers") or {}).items():
            t = tally.setdefault(name, {})
            t[str(v)] = t.get(str(v), 0) + 1
    return {
        n: ", ".join(f"{k} {v}" for v, k in sorted(t.items(), key=lambda kv: VERDICT_RANK.get(kv[0], 99)))
        for n, t in tally.items()
    }


def _describe_messages(grade: Grade, n: int, pct: str) -> list[str]:
    """The per-message loss rate over the runs with a known outcome, and per fault kind."""
    lines: list[str] = []
    lines.append(
        f"messages: {grade['lost']:,} lost of {grade['confirmed']:,} confirmed over the {_runs(n)} "
        f"with a known outcome (pooled rate {_rate(grade['loss_rate'])} per confirmed message)"
    )
    boot = f"resampling whole runs, B={grade['bootstrap_resamples']:,}, seed {grade['bootstrap_seed']}"
    if grade["loss_low"] is not None:
        few = (
            f"; with fewer than {FEW_RUNS} runs it likely understates the uncertainty" if n < FEW_RUNS else ""
        )
        lines.append(
            f"per-message loss rate between {_rate(grade['loss_low'])} and {_rate(grade['loss_high'])} "
            f"({pct} bootstrap percentile interval, {boot}{few})"
        )
    elif grade["lost"] == 0:
        lines.append(
            "per-message loss rate: no run lost a message, so resampling runs gives no interval above "
            "zero; the bound on the share of runs is the statement to use"
        )
    if grade["per_kind"]:
        lines.append(
            "per fault kind (confirmed messages whose confirm-to-drain interval overlapped a window of "
            "that kind; one message can count under several kinds; 'none' met no fault):"
        )
        for k in grade["per_kind"]:
            where = f"{k['runs_lost']} of {_runs(k['runs'])} lost"
            rate = f"{k['lost']:,} of {k['confirmed']:,} exposed lost (rate {_rate(k['loss_rate'])})"
            ival = (
                f", {pct} bootstrap {_rate(k['low'])} to {_rate(k['high'])}"
                if k["low"] is not None
                else (", no interval" if k["runs"] >= MIN_RUNS else ", one run: no interval")
            )
            lines.append(f"  {k['fault_kind']:<14} {where}; {rate}{ival}")
    return lines


def describe_grade(grade: Grade) -> list[str]:
    """The grade in sentences, one per line: every number says what it is a number of."""
    pct = f"{grade['confidence']:.0%}"
    n = grade["graded_runs"]
    lines = [f"grade over {_runs(len(grade['runs']))}: {grade['verdict']}"]
    if n == 0:
        lines.append("no run has a known outcome, so nothing can be said about loss")
    elif n < MIN_RUNS:
        lines.append(
            f"{grade['lost']:,} of {grade['confirmed']:,} confirmed messages lost in the one run with a "
            "known outcome; no bound: a run is one trial (losses come in clusters, so its messages are "
            "not independent), and a bound needs several seeded runs (brokerchaos run SCENARIO --runs 10)"
        )
    elif grade["runs_lost_interval"] == "one-sided":
        lines.append(
            f"0 of {n} runs lost a message: the share of runs that lose messages is below "
            f"{_pct(grade['runs_lost_high'] or 0.0)} ({pct} one-sided exact binomial upper bound over runs; "
            "not a proof of zero)"
        )
    else:
        lines.append(
            f"{grade['runs_lost']} of {n} runs lost messages: the share of runs that lose messages is between "
            f"{_pct(grade['runs_lost_low'] or 0.0)} and {_pct(grade['runs_lost_high'] or 0.0)} "
            f"({pct} two-sided exact binomial interval over runs)"
        )
    counts = ", ".join(f"{v} {k}" for k, v in grade["verdicts"].items() if v)
    lines.append(f"verdicts: {counts or 'none'}")
    if any(len(r.get("checkers") or {}) > 1 for r in grade["runs"]):
        lines.append(
            "checkers (each one's verdicts over the runs; a run's verdict is the worst of its checkers'): "
            + "; ".join(f"{n} {v}" for n, v in checker_verdicts(grade).items())
        )
    if grade["excluded_runs"]:
        lines.append(
            f"{_runs(grade['excluded_runs'])} left out of every rate: whether {'it' if grade['excluded_runs'] == 1 else 'they'} "
            "lost messages is not known (final drain unfinished or checker failed); counted as neither "
            "durable nor lossy"
        )
    if n >= MIN_RUNS:
        lines += _describe_messages(grade, n, pct)
    found = grade.get("anomalies") or {}
    if found:
        lines.append(
            "anomaly classes (runs with any; messages, offsets or reads over all runs): "
            + "; ".join(f"{k.replace('_', ' ')} in {_runs(r)} ({n:,})" for k, (r, n) in found.items())
        )
    lines += describe_recovery(grade.get("recovery") or [], grade["confidence"])
    return lines


# -- from run directories -------------------------------------------------------------------


def grade_runs(
    run_dirs: list[Path],
    *,
    spark_master: str | None = None,
    engine: str = "spark",
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> Grade:
    """Check every run and grade them together.

    engine: "spark" (one Spark job over all the runs' histories), "python" (each run in
    turn), or "stored" to reuse each run's results.json.
    """
    scenarios = []
    for d in run_dirs:
        scenario_file = Path(d) / SCENARIO_JSON
        scenarios.append(json.loads(scenario_file.read_text()) if scenario_file.is_file() else {})
    results: Sequence[Mapping[str, Any]]
    if engine == "spark":
        from spark_reports.engines.spark.check import aggregate_runs

        results = aggregate_runs([Path(d) for d in run_dirs], scenarios, spark_master=spark_master)
    elif engine == "python":
        from spark_reports.engines.python import check_python

        results = [check_python(Path(d), s) for d, s in zip(run_dirs, scenarios, strict=True)]
    elif engine == "stored":
        stored: list[Mapping[str, Any]] = []
        for d in run_dirs:
            f = Path(d) / RESULTS_JSON
            if not f.is_file():
                raise HistoryError(
                    f"no results.json in {d}: check the run first or grade with engine='spark'"
                )
            stored.append(json.loads(f.read_text()))
        results = stored
    else:
        raise ValueError(f"unknown engine {engine!r}: use 'spark', 'python' or 'stored'")
    if engine in QUEUE_CHECKERS:
        results = [
            with_stored_checkers(res, json.loads(f.read_text()) if f.is_file() else {}, engine)
            for res, f in zip(results, (Path(d) / RESULTS_JSON for d in run_dirs), strict=True)
        ]
    seeds = [s.get("seed") if isinstance(s, dict) else None for s in scenarios]
    return grade_results(
        [
            (str(d), res, x if isinstance(x, int) else None)
            for d, res, x in zip(run_dirs, results, seeds, strict=True)
        ],
        resamples=resamples,
        seed=seed,
    )
