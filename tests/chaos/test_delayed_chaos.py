"""Delayed messages under a kill, on the shipped scenario shortened: nothing confirmed lost, nothing early."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.chaos, pytest.mark.docker, pytest.mark.slow]


def test_delayed_messages_survive_a_kill_and_never_arrive_early(chaos_run) -> None:
    result = chaos_run(
        "scenarios/reference-delayed.yaml",
        duration=10,
        checkers=["python", "delay"],
        nemesis={"schedule": [{"at": 3, "fault": "kill", "params": {"node": "n1"}, "hold": 3}], "settle": 2},
    )
    result.assert_durable()
    delay = result.results["checkers"]["delay"]
    assert delay["verdict"] == "durable", delay
    assert delay["counts"]["early"] == 0
    # every confirmed delayed message arrives (assert_durable); a publish whose confirm never came (nacked or
    # unknown when n1 died) may still have been scheduled and delivered, so delivered can exceed confirmed
    assert delay["counts"]["delayed_delivered"] >= delay["counts"]["delayed_confirmed"] > 0
