"""Membership changes on the real RabbitMQ 3.10: a node leaves the running cluster (the others
forget it) and joins again empty; the change is seen from inside the cluster and recorded."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.chaos]


def test_a_node_leaves_and_joins_a_running_quorum_cluster(brokerchaos, tmp_path) -> None:
    import yaml

    scenario = {
        "name": "membership-short",
        "seed": 1,
        "broker": {"plugin": "rabbitmq", "nodes": 3, "settings": {"queue_type": "quorum"}},
        "workload": {"producers": 1, "consumers": 1, "rate": 50, "duration": 25, "drain_timeout": 120},
        "nemesis": {
            "schedule": [{"at": 5, "fault": "member-remove", "params": {"node": "n3"}, "hold": 10}],
            "settle": 10,
        },
        "checkers": ["python"],
    }
    path = tmp_path / "membership.yaml"
    path.write_text(yaml.safe_dump(scenario))
    r = brokerchaos("run", str(path))
    assert r.code == 0, r.explain()  # quorum queues keep every confirmed message through a membership change
    ops = [json.loads(line) for line in (r.run_dir / "history.jsonl").read_text().splitlines()]
    nemesis = [op for op in ops if op["process"] == "nemesis" and op["type"] == "ok"]
    removed = next(json.loads(op["value"]) for op in nemesis if op["f"] == "member-remove")
    # Seen from inside: the other nodes no longer count n3 as a member while it is out ...
    assert removed["done"]["members_after"] == ["n1", "n2"], removed
    healed = [json.loads(op["value"]) for op in nemesis if op["f"] == "heal"]
    added = [h for h in healed if "f1" in h.get("fault_ids", [])]
    # ... and count it again once it joined.
    assert (
        added
        and "n3" in json.dumps(added[0])
        and '"members_after": ["n1", "n2", "n3"]' in json.dumps(added[0])
    )
    r.assert_every_producer_confirmed()
