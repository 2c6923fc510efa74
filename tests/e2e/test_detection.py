"""A slice of the detection bench (``python -m bench.detection``) small enough for CI: planted
bugs whose outcome does not depend on timing must each end in their expected verdict, and the
unmodified broker on a scenario with the same consumer behaviours must stay durable. A checker
that stops seeing lost, corrupted or abandoned messages fails here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.detection import SOURCE_ENV, apply_patch, load_catalogue

BUGS = {b.id: b for b in load_catalogue()}

# 10: every 2000th publish confirmed unwritten (LOST with no fault at all): run without the
#     scenario's kills, which restart the broker's count of publishes (on a busy machine a
#     15 s run made 2,318 publishes in all, split by a kill, and the bug never fired), and
#     long enough that 2000 publishes need less than a quarter of the scenario's rate;
# 11: bodies read back from the log corrupted (INTEGRITY, after a power loss);
# 06: a closed channel's unacked deliveries dropped (LOST through the abandon accounting).
CI_BUGS: dict[str, dict[str, Any]] = {
    "10": {"duration": 30, "nemesis": {"schedule": [], "settle": 3}},
    "11": {},
    "06": {},
}

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.mark.parametrize("bug_id", sorted(CI_BUGS), ids=[BUGS[b].label for b in sorted(CI_BUGS)])
def test_planted_bug_is_caught(
    bug_id: str, chaos_run: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bug = BUGS[bug_id]
    monkeypatch.setenv(SOURCE_ENV, str(apply_patch(bug, tmp_path)))
    result = chaos_run(str(bug.scenario), **CI_BUGS[bug_id])
    assert result.results.get("verdict") == bug.expect, (
        f"{bug.label} on {bug.scenario.name} (seed {result.seed}) ended {result.results.get('verdict')}, "
        f"expected {bug.expect}\n{result.loss_table()}"
    )
    assert result.results.get("valid") is False


def test_unmodified_broker_is_durable_under_consumer_churn(
    chaos_run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    chaos_run(str(BUGS["06"].scenario)).assert_durable()
