from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from spark_reports import HistoryError, check_python, clopper_pearson_upper, grade_runs
from spark_reports.synth import HistoryBuilder


def _brute_upper(lost: int, n: int, confidence: float = 0.95) -> float:
    """Solve P(X <= lost | n, p) = 1 - confidence by bisection on the exact binomial sum."""

    def cdf(p: float) -> float:
        return sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(lost + 1))

    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) > 1 - confidence else (lo, mid)
    return hi


@pytest.mark.parametrize(("lost", "n"), [(1, 10), (3, 20), (5, 100), (50, 1000), (0, 7), (9, 10)])
def test_upper_bound_matches_exact_binomial(lost: int, n: int) -> None:
    assert clopper_pearson_upper(lost, n) == pytest.approx(_brute_upper(lost, n), rel=1e-9)


def test_zero_losses_give_a_bound_not_zero() -> None:
    upper = clopper_pearson_upper(0, 2_000_000)
    assert upper == pytest.approx(1 - 0.05 ** (1 / 2_000_000))
    assert 1.49e-6 < upper < 1.50e-6  # the rule of three: about 3/n
    # Large n with a few losses still converges (continued fraction with b in the millions).
    assert clopper_pearson_upper(3, 2_000_000) == pytest.approx(3.8756e-6, rel=1e-3)


def test_edges() -> None:
    assert clopper_pearson_upper(0, 0) is None
    assert clopper_pearson_upper(4, 4) == 1.0
    with pytest.raises(ValueError):
        clopper_pearson_upper(5, 4)


def _run(root: Path, name: str, *, lose: bool, kind: str) -> Path:
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
    (d / "scenario.json").write_text(json.dumps({"name": "t", "seed": len(name)}))
    return d


def test_grade_runs_pools_runs_per_fault_kind(tmp_path: Path) -> None:
    dirs = [_run(tmp_path, "a", lose=False, kind="kill"), _run(tmp_path, "b", lose=True, kind="kill"),
            _run(tmp_path, "c", lose=False, kind="partition")]
    g = grade_runs(dirs, engine="python")
    assert (g["confirmed"], g["lost"], g["verdict"]) == (30, 1, "LOST")
    assert g["upper95"] == pytest.approx(_brute_upper(1, 30))
    assert [r["verdict"] for r in g["runs"]] == ["durable", "LOST", "durable"]
    kinds = {k["fault_kind"]: k for k in g["per_kind"]}
    assert set(kinds) == {"kill", "partition"}
    assert (kinds["kill"]["runs"], kinds["kill"]["confirmed"], kinds["kill"]["lost"]) == (2, 20, 1)
    assert kinds["partition"]["upper95"] == pytest.approx(1 - 0.05 ** (1 / 10))
    assert g["statement"].startswith("1 lost in 30 confirmed over 3 runs")


def test_grade_of_clean_runs_reads_as_a_bound(tmp_path: Path) -> None:
    g = grade_runs([_run(tmp_path, "a", lose=False, kind="kill")], engine="python")
    assert g["verdict"] == "durable"
    assert "0 lost in 10 confirmed over 1 run: loss rate < 0.259 (95% upper bound)" in g["statement"]


def test_grade_from_stored_results(tmp_path: Path) -> None:
    d = _run(tmp_path, "a", lose=True, kind="pause")
    with pytest.raises(HistoryError, match="no results.json"):
        grade_runs([d], engine="stored")
    (d / "results.json").write_text(json.dumps(check_python(d, {})))
    assert grade_runs([d], engine="stored")["lost"] == 1
