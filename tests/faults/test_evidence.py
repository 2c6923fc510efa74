"""Evidence that a fault bit, measured for real on node inits over lazyfs (no Docker), recorded by
the nemesis in the history and read back as the run's ``fault_evidence``: a fault that silently
does nothing must produce its "no effect" line, and a run none of whose faults bit must say so."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import plugins.reference
from faults.corrupt import CorruptFile
from faults.power import PowerLossCoordinated
from faults.process import Kill, Pause, PowerLoss
from harness.evidence import add_exposure, read_fault_evidence
from harness.history import Recorder, read_jsonl
from harness.host import Host
from harness.nemesis import Nemesis, Plan, PlannedFault
from harness.runner import check_run
from harness.spec import Fault, FaultContext
from harness.spec.fault import Evidence
from harness.spec.results import EXIT_DURABLE, EXIT_FAILED, EXIT_NO_FAULT_BIT
from harness.spec.results import FaultEvidence as FaultEvidenceRecord
from harness.store import RunDir
from harness.verdicts import exit_code, series_exit, summary_table, verdict_line
from plugins.reference import ReferenceBroker
from tests.faults.local_nodes import LocalCluster, local_inits
from tests.faults.test_nodeinit import child, wait_for
from tests.harness.allure_user import allure_result
from tests.harness.test_check_run import CheckerPlugin, host_with, verdict

# Writes and fsyncs everything once at boot, then writes nothing: a power cut finds nothing unsynced.
SYNCED = child(b"boot\ntick synced\n", "while True:\n    time.sleep(1)")

KINDS: dict[str, type[Fault]] = {
    f.name: f for f in (PowerLoss, Kill, Pause, PowerLossCoordinated, CorruptFile)
}


def run_nemesis(
    tmp: Path, cluster: LocalCluster, steps: list[PlannedFault], during: Any = None
) -> FaultEvidenceRecord:
    """The nemesis over real node inits, as a run drives it; ``during(fault_id)`` runs while held."""
    cluster.wait_ready(list(cluster.nodes))  # every broker has written past its boot
    history = tmp / "history.jsonl"
    recorder = Recorder(history)
    applied: list[str] = []

    def on_fault(op: Mapping[str, Any]) -> None:
        if op["f"] != "heal" and op["type"] == "ok" and during is not None:
            during(steps[len(applied)].fault_id)
        applied.append(op["f"])

    nemesis = Nemesis(
        Plan(steps),
        KINDS,
        FaultContext(cluster),
        recorder,
        settle=0,
        final_heal=lambda: {},
        on_fault=on_fault,
    )
    asyncio.run(nemesis(max(s.at + (s.hold or 0) for s in steps) + 0.1))
    recorder.close()
    assert [r for r in read_jsonl(history) if r["type"] == "info"] == []
    return read_fault_evidence(history)


def test_a_power_cut_with_everything_synced_is_named_no_effect(tmp_path: Path) -> None:
    with local_inits(["n1"], child=SYNCED) as inits:
        ev = run_nemesis(
            tmp_path, LocalCluster(inits), [PlannedFault("f1", 0.0, 0.2, "power-loss", {"node": "n1"})]
        )
    [action] = ev["actions"]
    assert action["effect"] is False and action["facts"]["dropped_bytes"] == 0
    assert ev["lines"] == ["f1 power-loss on n1: nothing unsynced was dropped"]
    assert ev["no_fault_bit"] and ev["no_effect"] == 1 and ev["bit"] == 0
    # The broker was killed and came back: the process part of the evidence says so.
    assert action["facts"]["process"]["effect"] is True and action["restored"] is True
    results = {"verdict": "durable", "valid": True, "fault_evidence": ev}
    assert verdict_line(results) == "durable (no fault bit: 1 of 1 fault had no effect)"
    assert exit_code(results) == EXIT_NO_FAULT_BIT
    assert "f1 power-loss on n1: nothing unsynced was dropped" in summary_table(results)
    # A definite failure is never hidden behind it.
    assert exit_code({**results, "verdict": "LOST", "valid": False}) == EXIT_FAILED


def test_a_power_cut_over_unsynced_writes_measures_what_it_dropped(tmp_path: Path) -> None:
    with local_inits(["n1"]) as inits:
        ev = run_nemesis(
            tmp_path, LocalCluster(inits), [PlannedFault("f1", 0.0, 0.2, "power-loss", {"node": "n1"})]
        )
    [action] = ev["actions"]
    facts = action["facts"]
    assert action["effect"] is True and facts["dropped_bytes"] > 0 and facts["shorter_or_torn"] == ["/log"]
    [f] = facts["files"]
    assert f["dropped_bytes"] == facts["dropped_bytes"] and f["dropped_ranges"]
    assert not ev["no_fault_bit"] and ev["lines"] == [] and action["restored"] is True
    assert exit_code({"verdict": "durable", "fault_evidence": ev}) == EXIT_DURABLE


def test_a_torn_coordinated_cut_reports_bytes_kept_and_dropped_per_node(tmp_path: Path) -> None:
    with local_inits(["n1", "n2"]) as inits:
        step = PlannedFault(
            "f1",
            0.0,
            0.2,
            "power-loss-coordinated",
            {"nodes": ["n1", "n2"], "torn": True, "torn_seed": 5, "lead": 0.5},
        )
        ev = run_nemesis(tmp_path, LocalCluster(inits), [step])
    [action] = ev["actions"]
    assert action["node"] == "n1,n2" and action["effect"] is True and action["restored"] is True
    for n in ("n1", "n2"):
        node = action["facts"][n]
        assert node["dropped_bytes"] + node["kept_bytes"] > 0, node
        assert action["facts"]["back_at"][n] and action["facts"]["running_after"][n]


def test_kill_and_pause_measure_the_process_tree(tmp_path: Path) -> None:
    with local_inits(["n1"]) as inits:
        steps = [
            PlannedFault("f1", 0.0, 0.2, "kill", {"node": "n1"}),
            PlannedFault("f2", 0.5, 0.2, "pause", {"node": "n1"}),
        ]
        ev = run_nemesis(tmp_path, LocalCluster(inits), steps)
    kill, pause = ev["actions"]
    assert kill["effect"] is True and kill["facts"]["exit"]["signal"] == "SIGKILL"
    assert kill["facts"]["pids"] and kill["facts"]["alive_after"] == [] and kill["facts"]["back_at"]
    assert pause["effect"] is True and set(pause["facts"]["states"].values()) <= {"T", "t"}
    assert pause["restored"] is True and "T" not in pause["facts"]["states_after"].values()
    assert ev["bit"] == 2 and ev["lines"] == []


def test_a_bit_flip_on_a_file_then_deleted_is_named_no_effect(tmp_path: Path) -> None:
    with local_inits(["n1"]) as inits:
        cluster = LocalCluster(inits)
        step = PlannedFault(
            "f1",
            0.0,
            0.3,
            "corrupt-file",
            {
                "nodes": ["n1"],
                "mode": "bitflip",
                "bits": 2,
                "files": "log",
                "picks": {"n1": {"file": 0.0, "flips": [[0.5, 1], [0.1, 3]]}},
            },
        )
        ev = run_nemesis(
            tmp_path, cluster, [step], during=lambda fid: os.unlink(Path(inits["n1"].data, "log"))
        )
    [action] = ev["actions"]
    assert action["effect"] is False
    assert action["facts"]["n1"]["sha256_before"] != action["facts"]["n1"]["sha256_after"]
    assert ev["lines"] == [
        "f1 corrupt-file on n1: n1: the corrupted file was deleted before the broker read it"
    ]
    assert ev["no_fault_bit"]


def test_a_bit_flip_that_stays_is_evidence_with_checksums(tmp_path: Path) -> None:
    with local_inits(["n1"]) as inits:
        step = PlannedFault(
            "f1",
            0.0,
            0.2,
            "corrupt-file",
            {
                "nodes": ["n1"],
                "mode": "bitflip",
                "bits": 1,
                "files": "log",
                "picks": {"n1": {"file": 0.0, "flips": [[0.5, 1]]}},
            },
        )
        ev = run_nemesis(tmp_path, LocalCluster(inits), [step])
    [action] = ev["actions"]
    n1 = action["facts"]["n1"]
    assert action["effect"] is True and n1["changes"][0]["offset"] < n1["written_extent"][1]
    assert n1["sha256_before"] != n1["sha256_after"]


def test_series_exit_is_the_worst_run() -> None:
    assert series_exit([0, 4, 0]) == EXIT_NO_FAULT_BIT
    assert series_exit([4, 1]) == EXIT_FAILED
    assert series_exit([4, 3]) == 3
    assert series_exit([0, 0]) == EXIT_DURABLE


# Writes message bodies into a commit-log segment: the first three fsynced, the next four not,
# then idles (the reference broker's record layout does not matter: its plugin reads bodies).
COMMIT_LOG = r"""
import os, sys, time
from harness.spec import message_body
d = sys.argv[1]
os.makedirs(os.path.join(d, "commitlog"), exist_ok=True)
fd = os.open(os.path.join(d, "commitlog", "00000000000000000000"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
for seq in range(1, 4):
    os.write(fd, b"\x00\x00\x00\x61" + message_body(f"p1:{seq}", 7, 120))
os.fsync(fd)
dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY); os.fsync(dfd); os.close(dfd)
log = os.open(os.path.join(d, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.write(log, b"boot\ntick\n"); os.fsync(log)
for seq in range(4, 8):
    os.write(fd, b"\x00\x00\x00\x61" + message_body(f"p1:{seq}", 7, 120))
print("broker up", flush=True)
while True:
    time.sleep(1)
"""


def cut_over_a_commit_log(history: Path) -> None:
    """A power cut of a node whose commit log holds p1:4..p1:7 unsynced, p1:1..p1:6 confirmed."""
    with local_inits(["n1"], child=COMMIT_LOG) as inits:
        # It prints "broker up" once its last (unsynced) record is written.
        wait_for(lambda: b"broker up" in Path(inits["n1"].log_file).read_bytes(), "the records written")
        cluster = LocalCluster(inits)
        cluster.plugin = ReferenceBroker()  # type: ignore[attr-defined]
        recorder = Recorder(history)
        for seq in range(1, 8):  # p1:7 is never confirmed: written, unsynced, not acknowledged
            inv = recorder.invoke("p1", "publish", node="n1", queue="q", value=f"p1:{seq}")
            if seq < 7:
                inv.ok()
        step = PlannedFault("f1", 0.0, 0.2, "power-loss", {"node": "n1"})
        nemesis = Nemesis(
            Plan([step]), KINDS, FaultContext(cluster), recorder, settle=0, final_heal=lambda: {}
        )
        asyncio.run(nemesis(0.3))
        recorder.close()


def test_a_power_cut_counts_the_acknowledged_messages_it_found_unsynced(tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    cut_over_a_commit_log(history)
    ev = read_fault_evidence(history, lost=["p1:4", "p1:5"])
    [action] = ev["actions"]
    exposure = action["exposure"]
    assert exposure == {
        "in_dropped_writes": 4,
        "confirmed_before_cut": 3,
        "lost": 2,
        "unreachable": 0,
        "lower_bound": False,
        "ids": ["p1:4", "p1:5", "p1:6", "p1:7"],
    }
    assert ev["exposure_lines"] == [
        "f1 power-loss on n1: 3 acknowledged message(s) were unsynced at the cut (4 in the dropped writes); 2 of them lost"
    ]


@pytest.mark.parametrize(
    ("counts", "want_lost", "want_unreachable", "tail"),
    [
        ({"lost": 2, "unreachable": 0}, 2, 0, "2 of them lost"),
        ({"lost": 0, "unreachable": 2}, 0, 2, "0 of them lost, 2 unreachable"),
        # More missing than the checkers list: what the cut's ids meet in the list is a floor.
        ({"lost": 1500, "unreachable": 0}, 2, 0, "at least 2 of them lost"),
        ({"lost": 0, "unreachable": 1500}, 0, 2, "0 of them lost, at least 2 unreachable"),
    ],
)
def test_the_exposure_tells_lost_from_unreachable(
    tmp_path: Path, counts: dict[str, int], want_lost: int, want_unreachable: int, tail: str
) -> None:
    """The checkers' ``lost`` list holds the confirmed ids the drain did not consume whether
    their counts call them lost (a completed drain) or unreachable (it did not complete): a
    cut's exposure counts each class under its own name, never unreachable ones as lost. The
    list is capped: past the cap, the count is a lower bound and says so."""
    rd = RunDir.create(tmp_path, "s")
    cut_over_a_commit_log(rd.history_jsonl)
    truncated = sum(counts.values()) > 2
    missing = verdict(
        "LOST" if counts["lost"] else "UNAVAILABLE",
        lost=["p1:4", "p1:5"],
        counts=counts,
        lost_truncated=truncated,
    )
    res = check_run(host_with({"c": missing}), rd, {"name": "s"}, ["c"])
    ev = res["fault_evidence"]
    assert ev["exposure_lines"] == [
        "f1 power-loss on n1: 3 acknowledged message(s) were unsynced at the cut "
        f"(4 in the dropped writes); {tail}"
    ]
    [action] = ev["actions"]
    assert action["exposure"] is not None
    assert (action["exposure"]["lost"], action["exposure"]["unreachable"]) == (want_lost, want_unreachable)
    assert action["exposure"]["lower_bound"] is truncated


@pytest.mark.parametrize(
    ("flush", "want_verdict", "want_exit"),
    [("sync", "UNSYNCED", EXIT_FAILED), ("async", "durable", EXIT_DURABLE)],
)
def test_acknowledged_messages_unsynced_under_flush_sync_fail_the_run(
    tmp_path: Path, flush: str, want_verdict: str, want_exit: int
) -> None:
    """Nothing lost, every checker durable: under ``flush: sync`` the three acknowledged
    messages the cut found unsynced are a broken promise, the run is not durable; under
    ``flush: async`` they are the exposure that setting accepts."""
    rd = RunDir.create(tmp_path, "s")
    cut_over_a_commit_log(rd.history_jsonl)
    host = Host.load(entry_points=False)
    host.register(plugins.reference, "reference")
    host.register(CheckerPlugin({"c": verdict("durable")}), "fake-checkers")
    scenario = {"name": "s", "broker": {"plugin": "reference", "settings": {"flush": flush}}}
    res = check_run(host, rd, scenario, ["c"])
    ev = res["fault_evidence"]
    assert ev["confirms_after_sync"] is (flush == "sync")
    assert (res["verdict"], exit_code(res)) == (want_verdict, want_exit)
    line = (
        "f1 power-loss on n1: 3 acknowledged message(s) were unsynced at the cut although "
        "the broker's settings promise a sync before each confirm"
    )
    assert ev["unsynced_lines"] == ([line] if flush == "sync" else [])
    assert (line in summary_table(res)) is (flush == "sync")
    if flush == "sync":
        assert res["valid"] is False and res["reason"].startswith("fault evidence: 1 power cut(s)")


def test_a_plugin_that_does_not_say_leaves_the_exposure_unjudged(tmp_path: Path) -> None:
    rd = RunDir.create(tmp_path, "s")
    cut_over_a_commit_log(rd.history_jsonl)
    res = check_run(host_with({"c": verdict("durable")}), rd, {"name": "s"}, ["c"])
    assert res["fault_evidence"]["confirms_after_sync"] is None
    assert res["fault_evidence"]["exposure_lines"] and not res["fault_evidence"]["unsynced_lines"]
    assert res["verdict"] == "durable"


def test_allure_shows_the_evidence_and_fails_a_run_none_of_whose_faults_bit(tmp_path: Path) -> None:
    with local_inits(["n1"], child=SYNCED) as inits:
        ev = run_nemesis(
            tmp_path, LocalCluster(inits), [PlannedFault("f1", 0.0, 0.2, "power-loss", {"node": "n1"})]
        )
    run = tmp_path / "run"
    run.mkdir()
    results = {
        "verdict": "durable",
        "valid": True,
        "reason": "nothing lost",
        "counts": {},
        "fault_evidence": ev,
    }
    (run / "results.json").write_text(json.dumps(results))
    result, _ = allure_result(tmp_path, run)
    steps = {s["name"]: s for s in result["steps"]}
    step = steps["fault evidence: 0 of 1 bit"]
    assert step["status"] == "failed"
    params = {x["name"]: x["value"] for x in step["parameters"]}
    assert params["line 1"] == "f1 power-loss on n1: nothing unsynced was dropped"


def _op(index: int, t_s: float, process: str, type_: str, f: str, value: str, node: str = "n1") -> str:
    return json.dumps(
        {
            "index": index,
            "time_ns": int(t_s * 1e9),
            "process": process,
            "type": type_,
            "f": f,
            "node": node,
            "value": value,
        }
    )


def test_a_fault_applied_after_the_last_publish_is_named(tmp_path: Path) -> None:
    """A slow heal can push a planned fault past the workload's end: the run says no publish met it."""

    def fault(index: int, t_s: float, fid: str, kind: str) -> str:
        value = {"fault_id": fid, "kind": kind, "evidence": Evidence.bit("gone").as_dict()}
        return _op(index, t_s, "nemesis", "ok", kind, json.dumps(value))

    history = tmp_path / "history.jsonl"
    lines = [
        _op(0, 1.0, "p1", "invoke", "publish", "p1:1"),
        _op(1, 1.1, "p1", "ok", "publish", "p1:1"),
        fault(2, 2.0, "f1", "kill"),
        _op(3, 5.0, "p1", "invoke", "publish", "p1:2"),
        _op(4, 5.1, "p1", "ok", "publish", "p1:2"),
        fault(5, 8.5, "f2", "power-loss"),
    ]
    history.write_text("\n".join(lines) + "\n")
    ev = read_fault_evidence(history)
    assert ev["bit"] == 2 and not ev["no_fault_bit"]
    assert ev["lines"] == [
        "f2 power-loss on n1: applied 3.5 s after the last publish was sent: no publish met it"
    ]
    results = {"verdict": "durable", "valid": True, "fault_evidence": ev}
    assert exit_code(results) == EXIT_DURABLE  # what it did to stored data still counts
    assert ev["lines"][0] in summary_table(results)


def test_a_long_fault_invoked_before_the_last_publish_met_publishes(tmp_path: Path) -> None:
    """A rolling restart's op completes long after it began: it is applied when it was invoked, so a
    restart that began while the workload published is not a fault that no publish met."""

    def fault(index: int, t_s: float, type_: str, fid: str, kind: str) -> str:
        value: dict[str, object] = {"fault_id": fid, "kind": kind}
        if type_ == "ok":
            value["evidence"] = Evidence.bit("restarted").as_dict()
        return _op(index, t_s, "nemesis", type_, kind, json.dumps(value))

    history = tmp_path / "history.jsonl"
    lines = [
        _op(0, 1.0, "p1", "invoke", "publish", "p1:1"),
        _op(1, 1.1, "p1", "ok", "publish", "p1:1"),
        fault(2, 2.0, "invoke", "f1", "rolling-restart"),
        _op(3, 5.0, "p1", "invoke", "publish", "p1:2"),
        _op(4, 5.1, "p1", "ok", "publish", "p1:2"),
        fault(5, 90.0, "ok", "f1", "rolling-restart"),
        fault(6, 95.0, "invoke", "f2", "power-loss"),
        fault(7, 95.5, "ok", "f2", "power-loss"),
    ]
    history.write_text("\n".join(lines) + "\n")
    ev = read_fault_evidence(history)
    assert ev["bit"] == 2
    assert ev["lines"] == [
        "f2 power-loss on n1: applied 90.0 s after the last publish was sent: no publish met it"
    ]


def test_a_cut_with_nothing_acknowledged_unsynced_says_none_lost_exactly_past_the_cap() -> None:
    """The cap on the checkers' id list makes a cut's count a floor only where the cut held
    acknowledged messages: with none, "0 of them lost" is exact, not "at least 0"."""
    action: Any = {
        "fault_id": "f2",
        "kind": "power-loss",
        "node": "n1",
        "at_ns": 10,
        "exposure": {"ids": ["p1:9"], "in_dropped_writes": 1},
    }
    lines = add_exposure([action], {"p1:9"}, {"p1:9": 20}, {"p1:1"}, capped=True)
    assert lines == [
        "f2 power-loss on n1: 0 acknowledged message(s) were unsynced at the cut "
        "(1 in the dropped writes); 0 of them lost"
    ]
    assert action["exposure"]["lower_bound"] is False
