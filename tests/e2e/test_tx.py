"""AMQP transactions on the 3-node reference cluster end to end: a short reference-tx run, the master
killed mid-commit, ends durable with every transaction whole (checker ``atomicity``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.docker, pytest.mark.chaos]


def test_transactions_stay_whole_through_a_master_kill(brokerchaos, tmp_path: Path) -> None:
    data = yaml.safe_load(open("scenarios/reference-tx.yaml"))
    data["workload"].update(duration=12, drain_timeout=60)
    data["nemesis"] = {
        "schedule": [{"at": 4, "fault": "kill", "params": {"node": "n1"}, "hold": 3}],
        "settle": 4,
    }
    data["checkers"] = [
        "python",
        "atomicity",
    ]  # the point is the broker and the atomicity checks, not the engine
    short = tmp_path / "reference-tx.yaml"
    short.write_text(yaml.safe_dump(data))
    r = brokerchaos("run", str(short))
    assert r.code == 0, r.explain()
    res = r.results
    assert res["verdict"] == "durable" and res["valid"] is True
    atomicity = res["checkers"]["atomicity"]
    assert atomicity["valid"] is True, atomicity
    counts = atomicity["counts"]
    assert counts["publish_transactions"] > 50 and counts["ack_transactions"] > 50
    assert counts["committed"] > 0 and counts["rolled_back"] > 0
