"""The brokers people run today, each in a smoke-sized run from Debian sid (one extra root
filesystem for all of them): the run ends with a verdict, and records the version the running
broker reported, not the one the scenario asked for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.docker, pytest.mark.chaos]


def _short(tmp_path: Path, scenario: str, checkers: tuple[str, ...] = ("python",), **workload: Any) -> Path:
    data = yaml.safe_load(open(scenario))
    data["workload"].update(duration=8, **workload)
    data["checkers"] = list(checkers)  # the point is the broker version, not the engine
    out = tmp_path / Path(scenario).name
    out.write_text(yaml.safe_dump(data))
    return out


def _durable_on(
    brokerchaos, tmp_path: Path, scenario: str, running: str, checkers: tuple[str, ...] = ("python",)
) -> Any:
    r = brokerchaos("run", str(_short(tmp_path, scenario, checkers)))
    assert r.code == 0, r.explain()
    res: dict[str, Any] = r.results
    assert res["verdict"] == "durable" and res["counts"]["confirmed"] > 0
    assert res["broker"]["running"].startswith(running), res["broker"]
    assert f"broker                  {running}" in r.proc.stdout  # the terminal says it too
    return r


def test_nats_2_15(brokerchaos, tmp_path: Path) -> None:
    res = _durable_on(brokerchaos, tmp_path, "scenarios/nats-2.15-smoke.yaml", "nats-server 2.15.").results
    assert res["broker"]["version"] == "2.15" and res["broker"]["suite"] == "sid"


def test_valkey_9_1(brokerchaos, tmp_path: Path) -> None:
    r = _durable_on(brokerchaos, tmp_path, "scenarios/valkey-9.1-smoke.yaml", "valkey 9.1.")
    again = brokerchaos("analyze", str(r.run_dir), "--checker", "python")  # re-checked, it keeps the version
    assert again.code == 0 and "broker                  valkey 9.1." in again.proc.stdout, again.explain()


def test_rabbitmq_4_3_quorum_on_khepri(brokerchaos, tmp_path: Path) -> None:
    _durable_on(brokerchaos, tmp_path, "scenarios/rabbitmq-4.3-quorum-smoke.yaml", "rabbitmq 4.3.")


def test_rabbitmq_4_3_stream(brokerchaos, tmp_path: Path) -> None:
    """Streams over the stream protocol: the reader read what the producers had confirmed, the
    drain read every node's copy, the three alike, and each node's own replica (read on the node)
    holds every confirmed entry; the stream checker's line says what it could not judge."""
    r = _durable_on(
        brokerchaos,
        tmp_path,
        "scenarios/rabbitmq-4.3-stream-smoke.yaml",
        "rabbitmq 4.3.",
        ("python", "stream"),
    )
    ops = [json.loads(line) for line in (r.run_dir / "history.jsonl").read_text().splitlines()]
    confirmed = {o["value"] for o in ops if o["f"] == "publish" and o["type"] == "ok"}
    read = {o["value"] for o in ops if o["f"] == "read" and o["type"] == "ok"}
    assert confirmed and confirmed <= read
    drain = next(json.loads(o["value"]) for o in ops if o["f"] == "drain" and o["type"] == "ok")
    copies = {(v["messages"], v["first_seq"], v["last_seq"]) for v in drain["replicas"].values()}
    assert len(drain["replicas"]) == 3 and len(copies) == 1, drain["replicas"]
    held = {
        o["node"]: {e[1] for e in json.loads(o["value"])["entries"]}
        for o in ops
        if o["f"] == "holdings" and o["type"] == "ok"
    }
    assert set(held) == {"n1", "n2", "n3"} and all(
        confirmed <= ids for ids in held.values()
    )  # read on each node
    # The stream checker counts the stream and names what RabbitMQ's history gives it nothing to
    # judge: its publish confirms carry no offset, its deliveries no consumer sequence.
    stream = r.results["checkers"]["stream"]
    judged = (
        "not judged: seq conflicts, seq mismatches (no publish confirm carried a stream offset); "
        "reordered (no delivery carried its consumer sequence and delivery count)"
    )
    assert stream["reason"] == f"no stream anomaly over 1 stream(s); {judged}", stream
    assert stream["counts"]["confirmed"] == 0 and stream["counts"]["delivered"] >= len(confirmed), stream
    assert f"durable: no stream anomaly over 1 stream(s); {judged}" in r.proc.stdout  # the terminal's line


def test_rabbitmq_4_3_stream_consumers_take_over(brokerchaos, tmp_path: Path) -> None:
    """The two consumers are one single-active-consumer group: one consumes at a time, and when
    the node of the active one is killed the other is activated and resumes after the group's
    stored offset (its ``seek``), re-reading only as redeliveries; nothing confirmed is lost. The
    consumers start on n3 and n1 (the seed's spread), and both are killed in turn, so the active
    one's node goes whichever of the two the broker activated first."""
    data = yaml.safe_load(open("scenarios/rabbitmq-4.3-stream-smoke.yaml"))
    data["workload"].update(duration=24, consumers=2)
    data["nemesis"] = {
        "schedule": [
            {"at": 4, "fault": "kill", "params": {"node": "n3"}, "hold": 4},
            {"at": 14, "fault": "kill", "params": {"node": "n1"}, "hold": 4},
        ]
    }
    data["checkers"] = ["python", "stream"]
    scenario = tmp_path / "stream-takeover.yaml"
    scenario.write_text(yaml.safe_dump(data))
    r = brokerchaos("run", str(scenario))
    res: dict[str, Any] = r.results
    assert res["counts"]["lost"] == 0 and res["counts"]["confirmed"] > 0, r.explain()
    ops = [json.loads(line) for line in (r.run_dir / "history.jsonl").read_text().splitlines()]
    consumers = {"c1", "c2"}
    mine = [
        o for o in ops if o["process"] in consumers and o["type"] == "ok" and o["f"] in ("consume", "seek")
    ]
    seeks = [o for o in mine if o["f"] == "seek"]
    assert seeks, "no consumer was activated after an offset was stored"
    # Exclusive: the consuming process changes only where the new one was activated (a seek).
    last: str | None = None
    activated: set[str] = set()
    for o in mine:
        if o["f"] == "seek":
            activated.add(o["process"])
            continue
        if last is not None and o["process"] != last:
            assert o["process"] in activated, (last, o)
            activated.discard(o["process"])
        last = o["process"]
    # After a seek to n, the consumer's next entry is at n or later (offsets are sparse).
    for s in seeks:
        nxt = next(
            (
                o
                for o in mine
                if o["index"] > s["index"] and o["process"] == s["process"] and o["f"] == "consume"
            ),
            None,
        )
        if nxt is not None:
            assert json.loads(nxt["detail"])["stream_seq"] >= json.loads(s["detail"])["stream_seq"]
    # What a takeover reads again is a redelivery (the checkers' duplicates), never a fresh read.
    highest = -1
    for o in (o for o in mine if o["f"] == "consume"):
        offset = json.loads(o["detail"])["stream_seq"]
        assert o["redelivered"] == (offset <= highest), o
        highest = max(highest, offset)
