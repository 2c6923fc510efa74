"""Grading across seeded runs: a loss rate with an exact upper bound.

"0 lost" only ever means "fewer than this many per message, with 95% confidence":
the bound is the one-sided exact binomial (Clopper-Pearson) upper limit, which for
zero losses in n confirmed messages is 1 - 0.05**(1/n) (about 3/n).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._common import HistoryError
from .schema import SCHEMA_VERSION, Grade, KindGrade, Results, RunGrade

CONFIDENCE = 0.95


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


def clopper_pearson_upper(lost: int, n: int, confidence: float = CONFIDENCE) -> float | None:
    """One-sided exact upper bound on the loss probability given lost of n.

    Solves P(X <= lost | n, p) = 1 - confidence, i.e. p = BetaInv(confidence, lost+1, n-lost).
    None when there is nothing to bound (n == 0).
    """
    if n <= 0:
        return None
    if lost < 0 or lost > n:
        raise ValueError(f"lost={lost} outside 0..{n}")
    if lost == n:
        return 1.0
    if lost == 0:
        return 1.0 - (1.0 - confidence) ** (1.0 / n)
    a, b = lost + 1.0, float(n - lost)
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if betainc(a, b, mid) < confidence:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * max(hi, 1e-300):
            break
    return hi


def _statement(lost: int, confirmed: int, runs: int, upper: float | None) -> str:
    where = f"{confirmed:,} confirmed over {runs} run{'s' if runs != 1 else ''}"
    if upper is None:
        return f"{lost:,} lost in {where}: nothing confirmed, no bound"
    pct = int(CONFIDENCE * 100)
    if lost == 0:
        return f"0 lost in {where}: loss rate < {upper:.3g} ({pct}% upper bound), not a proof of zero"
    return f"{lost:,} lost in {where}: loss rate {lost / confirmed:.3g}, < {upper:.3g} ({pct}% upper bound)"


def grade_results(results: list[tuple[str, Results]]) -> Grade:
    """Pool per-run results into one grade (no I/O; grade_runs feeds it)."""
    runs: list[RunGrade] = []
    per_kind: dict[str, list[int]] = {}
    for run_dir, res in results:
        counts = res["counts"]
        runs.append(RunGrade(run_dir=run_dir, verdict=res["verdict"], valid=res["valid"],
                             confirmed=counts["confirmed"], lost=counts["lost"], unexpected=counts["unexpected"]))
        for row in res["attribution"]["exposure"]:
            k = per_kind.setdefault(row["fault_kind"], [0, 0, 0])
            k[0] += 1
            k[1] += row["confirmed"]
            k[2] += row["lost"]
    confirmed = sum(r["confirmed"] for r in runs)
    lost = sum(r["lost"] for r in runs)
    upper = clopper_pearson_upper(lost, confirmed)
    verdicts = {r["verdict"] for r in runs}
    verdict = next((v for v in ("LOST", "INTEGRITY", "unknown") if v in verdicts), "durable" if runs else "unknown")
    kinds = [KindGrade(fault_kind=k, runs=v[0], confirmed=v[1], lost=v[2],
                       loss_rate=(v[2] / v[1]) if v[1] else None, upper95=clopper_pearson_upper(v[2], v[1]))
             for k, v in sorted(per_kind.items())]
    return Grade(schema=SCHEMA_VERSION, runs=runs, confirmed=confirmed, lost=lost,
                 loss_rate=(lost / confirmed) if confirmed else None, upper95=upper,
                 statement=_statement(lost, confirmed, len(runs), upper), verdict=verdict,  # type: ignore[typeddict-item]
                 per_kind=kinds)


def grade_runs(run_dirs: list[Path], *, spark_master: str | None = None, engine: str = "spark") -> Grade:
    """Check every run (one Spark session for all of them) and pool the results.

    engine: "spark", "python", or "stored" to reuse each run's results.json.
    """
    check: Callable[[Path, dict], Any]
    if engine == "spark":
        from ._spark import check_spark

        def check(d: Path, s: dict) -> Any:
            return check_spark(d, s, spark_master=spark_master)
    elif engine == "python":
        from ._python import check_python as check
    elif engine == "stored":
        def check(d: Path, s: dict) -> Any:
            f = Path(d) / "results.json"
            if not f.is_file():
                raise HistoryError(f"no results.json in {d}: check the run first or grade with engine='spark'")
            return json.loads(f.read_text())
    else:
        raise ValueError(f"unknown engine {engine!r}: use 'spark', 'python' or 'stored'")
    results = []
    for d in run_dirs:
        scenario_file = Path(d) / "scenario.json"
        scenario = json.loads(scenario_file.read_text()) if scenario_file.is_file() else {}
        results.append((str(d), check(Path(d), scenario)))
    return grade_results(results)
