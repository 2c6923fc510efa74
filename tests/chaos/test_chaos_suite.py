"""The project's own chaos suite, written as a user writes one: a few lines per test.

Short durations keep it to CI budgets; the scenarios are the shipped ones.
``--broker``, ``--chaos-seed``, ``--chaos-runs`` and ``--chaos-duration`` apply.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.chaos, pytest.mark.docker, pytest.mark.slow]


def test_crash_keeps_confirmed_messages(chaos_run) -> None:  # type: ignore[no-untyped-def]
    result = chaos_run("scenarios/crash.yaml", duration=10,
                       nemesis={"schedule": [{"at": 4, "fault": "kill", "hold": 2}], "settle": 2})
    result.assert_durable()
    kills = [op for op in result.history() if op["f"] == "kill" and op["type"] == "ok"]
    assert kills, "the kill was never applied"


def test_power_loss_with_sync_flush_keeps_confirmed_messages(chaos_run) -> None:  # type: ignore[no-untyped-def]
    result = chaos_run("scenarios/power-loss.yaml", duration=8,
                       nemesis={"schedule": [{"at": 4, "fault": "power-loss", "hold": 2}], "settle": 2})
    result.assert_durable()
    assert result.results["counts"]["confirmed"] > 0
