"""A run's broker events and coverage cells, computed from a run directory (no Docker)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from harness.coverage import annotate, cells, coverage_lines, coverage_record, event_records
from harness.spec.coverage import RECOVERY_NS, BrokerEvent, Cell
from plugins.nats import Nats
from plugins.rabbitmq import RabbitMQ
from plugins.reference import ReferenceBroker

REF = ReferenceBroker()
T0 = datetime(2026, 1, 2, 10, 0, 0, tzinfo=UTC)
S = 1_000_000_000


def names(plugin: Any, text: str, path: str = "logs/x.log") -> list[tuple[str, dict[str, str]]]:
    return [(e.name, dict(e.detail)) for e in plugin.events("n1", {path: text})]


def test_reference_log_lines_become_events_with_their_time() -> None:
    text = "\n".join(
        [
            "2026-01-02 10:00:01,250 WARNING broker_impl.cluster.ha: queue 'chaos-1': master n1 died; "
            "promoting the mirror here (NOT in sync)",
            "2026-01-02 10:00:02,000 WARNING broker_impl.cluster.ha: queue 'chaos-1': master n1 died; "
            "promoting the mirror here (in sync)",
            "2026-01-02 10:00:03,000 INFO broker_impl.store: group commit: one fsync released 16 waiter(s), "
            "the largest batch so far",
            "2026-01-02 10:00:04,000 WARNING broker_impl.store: flush timeout: 3 wait(s) for the commit log's "
            "fsync gave up after 5000 ms (flushed to 100)",
            "2026-01-02 10:00:05,000 INFO broker_impl.cluster.mirror: queue 'chaos-1': GM view v7 (joined [], "
            "left ['n3']) while mirror(s) ['n2'] not in sync",
            "2026-01-02 10:00:06,000 WARNING broker_impl.store: store recovery: transactions in the scanned "
            "log: 4 prepared record(s) not applied, 2 commit record(s) applied",
            "2026-01-02 10:00:07,000 WARNING broker_impl.store: store recovery (abnormal shutdown): scanned "
            "from 0 to 10, 3 records re-dispatched, cuts: none",
            "2026-01-02 10:00:08,000 INFO broker_impl.queue: nothing notable",
        ]
    )
    events = REF.events("n2", {"logs/brokerchaos/n2.log": text})
    assert [e.name for e in events] == [
        "promoted-unsynced",
        "promoted-in-sync",
        "group-commit-batch",
        "flush-timeout",
        "gm-view-during-sync",
        "tx-recovery",
    ]
    assert events[0].wall_time == T0 + timedelta(seconds=1, milliseconds=250)
    assert events[0].detail == {"queue": "chaos-1", "old": "n1", "how": "died"}
    assert events[2].detail == {"waiters": "16"}
    assert events[5].detail == {"prepared": "4", "committed": "2"}


def test_reference_partition_handling_states_are_events() -> None:
    """Paused in a minority, serving after a start no peer answered, a copy dropped at the heal: the
    states behind a node that restarts inside its minority and serves (issue 39); a partial partition
    detected (its pause is not a minority's)."""
    text = "\n".join(
        [
            "2026-01-02 10:00:01,000 WARNING broker_impl.cluster.partitions: cluster: only 1 of 3 nodes "
            "visible at start; pausing (pause_minority): client connections closed",
            "2026-01-02 10:00:02,000 INFO broker_impl.cluster.catalog: cluster: serving clients (no peer answered)",
            "2026-01-02 10:00:03,000 INFO broker_impl.cluster.catalog: cluster: serving clients (records from n2 merged)",
            "2026-01-02 10:00:04,000 WARNING broker_impl.cluster.catalog: queue 'chaos-1' in vhost '/': master "
            "is now n2; dropping the copy here",
            "2026-01-02 10:00:05,000 ERROR broker_impl.cluster.partitions: cluster: partial partition detected: "
            "n3 seen down here, n2 still sees it; pausing until every member is visible",
            "2026-01-02 10:00:05,001 WARNING broker_impl.cluster.partitions: cluster: a partial partition, 2 of 3 "
            "nodes visible; pausing (pause_minority): client connections closed",
        ]
    )
    assert names(REF, text) == [
        ("paused-minority", {}),
        ("served-alone", {}),
        ("copy-dropped", {"queue": "chaos-1", "master": "n2"}),
        ("partial-partition", {"down": "n3", "proxy": "n2"}),
    ]


def test_rabbitmq_and_nats_log_lines() -> None:
    rabbit = "\n".join(
        [
            "2026-01-02 10:00:01.000001+00:00 [info] <0.1.0> Mirrored queue 'chaos-1' in vhost '/': "
            "Promoting mirror <rabbit@n2.1.2.3> to leader",
            "2026-01-02 10:00:02.000001+00:00 [warning] <0.2.0> Autoheal: we were selected to restart; "
            "winner is rabbit@n3",
            "2026-01-02 10:00:03.000001+00:00 [warning] <0.3.0> Mirrored queue 'chaos-1' in vhost '/': "
            "Stopping all nodes on master shutdown since no synchronised mirror (replica) is available",
        ]
    )
    got = RabbitMQ().events("n1", {"logs/rabbitmq/rabbit@n1.log": rabbit})
    assert [e.name for e in got] == ["promoted", "autoheal-restart", "stop-no-synced-mirror"]
    assert got[1].wall_time == T0 + timedelta(seconds=2, microseconds=1)
    nats = "\n".join(
        [
            "[1] 2026/01/02 10:00:01.500000 [INF] JetStream cluster new stream leader for 'APP > chaos-1'",
            "[1] 2026/01/02 10:00:02.000000 [INF] Catchup for stream 'APP > chaos-1' complete",
        ]
    )
    got = Nats().events("n1", {"broker.log": nats})
    assert [(e.name, e.detail["stream"]) for e in got] == [
        ("stream-leader-elected", "chaos-1"),
        ("catchup-complete", "chaos-1"),
    ]
    assert got[0].wall_time == T0 + timedelta(seconds=1, milliseconds=500)


def window(fid: str, kind: str, start: float, end: float, applied: bool = True) -> dict[str, Any]:
    return {
        "fault_id": fid,
        "kind": kind,
        "start_ns": int(start * S),
        "end_ns": int(end * S),
        "applied": applied,
    }


def test_events_fall_in_the_windows_they_happened_in_or_just_after() -> None:
    zero = int(T0.timestamp() * S)
    windows = [window("f1", "kill", 1, 3), window("f2", "partition", 20, 30)]
    events = [
        BrokerEvent("n2", "promoted-unsynced", T0 + timedelta(seconds=2)),
        BrokerEvent(
            "n2", "mirror-synced", T0 + timedelta(seconds=3) + timedelta(microseconds=RECOVERY_NS // 2000)
        ),
        BrokerEvent("n1", "peer-down", T0 + timedelta(seconds=15)),
        BrokerEvent("n1", "untimed", None),
    ]
    recs = event_records(events, zero, windows)
    assert [(r["name"], r["fault_ids"]) for r in recs] == [
        ("promoted-unsynced", ["f1"]),
        ("mirror-synced", ["f1"]),
        ("peer-down", []),
        ("untimed", []),
    ]
    assert recs[0]["time_ns"] == 2 * S


def test_cells_need_the_feature_in_use_while_the_fault_was_held() -> None:
    scenario = {"broker": {"nodes": 3}}
    settings = {"flush": "sync", "ha_mode": "all", "replication": None, "partition_handling": "ignore"}
    windows = [
        window("f1", "kill", 10, 12),
        window("f2", "member-remove", 20, 30),
        window("f3", "partition", 100, 110),
        window("f4", "power-loss", 200, 201, applied=False),  # never applied: covers nothing
    ]
    uses = {"transactions": [int(11 * S)], "publish": [int(11 * S)]}
    events = [{"name": "promoted-in-sync", "time_ns": 25 * S, "fault_ids": ["f2"]}]
    rec = coverage_record(REF, scenario, settings, uses, windows, events)
    got = cells({"coverage": rec})
    assert Cell("mirrored queue", "kill") in got
    assert Cell("transactions, mirrored", "kill") in got
    assert Cell("transactions, mirrored", "partition") not in got  # no transaction near f3
    assert Cell("membership change", "member-remove") in got
    assert Cell("membership change moving the queue master", "member-remove") in got
    assert Cell("membership change moving the queue master", "member-remove", "promoted-in-sync") in got
    assert Cell("membership change", "partition") not in got  # f2 and f3 did not overlap
    assert not any(c.fault == "power-loss" for c in got)
    assert not any(c.feature == "queue, single copy" for c in got)  # settings gate: mirrored
    assert rec["faults"] == ["kill", "member-remove", "partition"]


def test_slow_disk_under_power_loss_is_a_cell_only_when_they_overlap() -> None:
    scenario = {"broker": {"nodes": 1}}
    settings = {"flush": "sync", "ha_mode": None, "replication": None}
    overlapping = [window("f1", "slow-fsync", 2, 22), window("f2", "power-loss", 8, 11)]
    apart = [window("f1", "slow-fsync", 2, 5), window("f2", "power-loss", 40, 41)]
    assert Cell("slow disk", "power-loss") in cells(
        {"coverage": coverage_record(REF, scenario, settings, {}, overlapping, [])}
    )
    assert Cell("slow disk", "power-loss") not in cells(
        {"coverage": coverage_record(REF, scenario, settings, {}, apart, [])}
    )


def test_annotate_reads_a_stored_run_and_cells_reads_it_back(tmp_path: Path) -> None:
    run = tmp_path / "run"
    log = run / "nodes" / "n1" / "logs" / "brokerchaos"
    log.mkdir(parents=True)
    (run / "scenario.json").write_text(
        json.dumps(
            {
                "scenario": {"broker": {"plugin": "reference", "nodes": 1}, "workload": {}},
                "broker": {"settings": {"flush": "sync", "ha_mode": None, "replication": None}},
            }
        )
    )
    history = [
        {
            "index": 0,
            "time_ns": 0,
            "wall_time": T0.isoformat(),
            "process": "p1",
            "type": "invoke",
            "f": "publish",
        },
        {
            "index": 1,
            "time_ns": 5 * S,
            "wall_time": (T0 + timedelta(seconds=5)).isoformat(),
            "process": "p1",
            "type": "invoke",
            "f": "commit",
        },
    ]
    (run / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    (log / "n1.log").write_text(
        "2026-01-02 10:00:06,000 WARNING broker_impl.store: store recovery: transactions in the scanned "
        "log: 1 prepared record(s) not applied, 3 commit record(s) applied\n"
    )
    results: dict[str, Any] = {"faults": [window("f1", "power-loss", 4, 5.5)]}
    annotate(REF, run, results)
    assert [(e["name"], e["time_ns"], e["fault_ids"]) for e in results["events"]] == [
        ("tx-recovery", 6 * S, ["f1"])
    ]
    (run / "results.json").write_text(json.dumps(results))
    got = cells(run)
    assert Cell("transactions, single copy", "power-loss") in got
    assert Cell("transactions, single copy", "power-loss", "tx-recovery") in got
    assert Cell("group commit (flush: sync)", "power-loss") in got
    lines = coverage_lines(results, 10)
    assert any("tx-recovery x1" in line for line in lines)


def test_a_delivery_given_back_counts_only_when_the_workload_asks_for_that_behaviour(tmp_path: Path) -> None:
    from harness.coverage import workload_uses

    history = tmp_path / "history.jsonl"
    recs = [
        {
            "time_ns": 1,
            "process": "c1",
            "type": "invoke",
            "f": "abandon",
            "detail": json.dumps({"cause": "crash"}),
        },
        {
            "time_ns": 2,
            "process": "c1",
            "type": "invoke",
            "f": "abandon",
            "detail": json.dumps({"cause": "requeue"}),
        },
    ]
    history.write_text("".join(json.dumps(r) + "\n" for r in recs))
    # a broker kill cuts the consumer's connection: a crash abandon the workload did not ask for
    assert workload_uses(history, {"workload": {"consumer": {"requeue": 0.1}}}) == {"requeue": [2]}
    assert workload_uses(history, {"workload": {"consumer": {"crash_every": 5}}}) == {"crash": [1]}


def test_a_delivery_from_a_dead_letter_queue_is_dead_lettering_and_an_expired_one_ttl(tmp_path: Path) -> None:
    from harness.coverage import workload_uses

    history = tmp_path / "history.jsonl"

    def delivery(t: int, queue: str, reason: str | None) -> dict[str, Any]:
        detail = (
            None if reason is None else json.dumps({"dead_letter": {"reason": reason, "queue": "chaos-1"}})
        )
        return {"time_ns": t, "process": "c3", "type": "ok", "f": "consume", "queue": queue, "detail": detail}

    recs = [
        delivery(1, "chaos-1", None),  # from the queue itself: neither
        delivery(2, "chaos-1.dead", "expired"),
        delivery(3, "chaos-1.dead", "rejected"),
    ]
    history.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert workload_uses(history, {}) == {"dead-letter": [2, 3], "ttl": [2]}


def test_a_plugin_without_features_gets_one_line_not_one_per_fault() -> None:
    """A broker plugin that declares no ``features`` (or none that this configuration matches)
    is told so once, not "no declared feature in use" under every fault."""
    results = {
        "coverage": {
            "features": [],
            "windows": [
                {"fault_id": "f1", "kind": "kill", "features": [], "events": []},
                {"fault_id": "f2", "kind": "pause", "features": [], "events": ["journal-recovery"]},
            ],
            "events": {"journal-recovery": 1},
            "cells": [],
        }
    }
    lines = coverage_lines(results, 10)
    assert not any("no declared feature in use" in line for line in lines)
    assert sum("no feature the broker plugin declares applies" in line for line in lines) == 1
    assert any("f2 (pause); events journal-recovery" in line for line in lines)
    assert not any("f1 (kill)" in line for line in lines)
