"""NATS JetStream 2.9.10 (Debian's nats-server) end to end: the smoke run is durable, and a short
coordinated power loss loses acknowledged messages, attributed to that fault."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.docker, pytest.mark.chaos]


def _short(tmp_path: Path, scenario: str, **workload: Any) -> Path:
    data = yaml.safe_load(open(scenario))
    data["workload"].update(workload)
    data["checkers"] = ["python", "stream"]  # the point is the broker and the stream checks, not the engine
    out = tmp_path / Path(scenario).name
    out.write_text(yaml.safe_dump(data))
    return out


def test_smoke_is_durable_in_stream_order(brokerchaos, tmp_path: Path) -> None:
    r = brokerchaos("run", str(_short(tmp_path, "scenarios/nats-smoke.yaml", duration=8)))
    assert r.code == 0, r.explain()
    res = r.results
    assert res["verdict"] == "durable" and res["valid"] is True
    assert res["counts"]["confirmed"] > 0  # how many depends on how busy the machine is, not on the broker
    stream = res["checkers"]["stream"]
    assert stream["valid"] is True and stream["counts"]["confirmed"] == res["counts"]["confirmed"]
    drain = [
        json.loads(line)
        for line in (r.run_dir / "history.jsonl").read_text().splitlines()
        if '"drain"' in line
    ]
    replicas = json.loads(next(op["value"] for op in drain if op["type"] == "ok"))["replicas"]
    assert sorted(replicas) == ["n1", "n2", "n3"]  # every server's own view of the stream, all alike
    assert {node: v.pop("server") for node, v in replicas.items()} == {n: n for n in replicas}  # its own name
    assert len({json.dumps(v, sort_keys=True) for v in replicas.values()}) == 1


def test_coordinated_power_loss_loses_acknowledged_messages(brokerchaos, tmp_path: Path) -> None:
    """A coordinated power cut of every node drops writes JetStream had acknowledged but not
    synced (its file store syncs every 2 minutes by default). What NATS 2.9.10 does next varies
    by run: the stream comes back short (the drain completes: LOST), the cluster answers that the
    stream no longer exists through every node (the drain completes with the stream gone: LOST,
    and the stream never came back), or some node never answers the drain (UNAVAILABLE, the
    undelivered confirmed messages unreachable behind it). In every case some confirmed messages
    are never delivered, and the cut's exposure puts them in its dropped writes."""
    data = yaml.safe_load(open("scenarios/nats-power-loss-coordinated.yaml"))
    data["workload"].update(duration=20)
    data["nemesis"]["schedule"] = [
        {"at": 8, "fault": "power-loss-coordinated", "params": {"nodes": "all"}, "hold": 3}
    ]
    data["nemesis"]["settle"] = 5
    data["checkers"] = ["python", "stream"]
    short = tmp_path / "plc.yaml"
    short.write_text(yaml.safe_dump(data))
    r = brokerchaos("run", str(short))
    assert r.code == 1, r.explain()
    res = r.results
    counts = res["counts"]
    assert counts["lost"] + counts["unreachable"] > 0, r.explain()  # confirmed, never delivered
    if res["drain"]["completed"]:
        assert (res["verdict"], counts["unreachable"]) == ("LOST", 0), r.explain()
        kinds = {k for m in res["attribution"]["messages"] for k in m["fault_kinds"]}
        assert kinds == {"power-loss-coordinated"}
    else:  # unreachable only behind a node that never answered the drain
        assert (res["verdict"], counts["lost"]) == ("UNAVAILABLE", 0), r.explain()
        said = [e for u in res["liveness"]["unavailable"] for e in u["nodes"].values() if e]
        assert said, r.explain()
    [cut] = [a for a in res["fault_evidence"]["actions"] if a["kind"] == "power-loss-coordinated"]
    exposure = cut["exposure"]
    assert exposure is not None and exposure["confirmed_before_cut"], r.explain()
    assert exposure["in_dropped_writes"] >= exposure["confirmed_before_cut"] >= (exposure["lost"] or 0)
