"""Allure for chaos runs: a brokerchaos plugin that turns run hooks into Allure labels, steps
and attachments of the pytest test that is running.

Registered on the host by ``harness.pytest_plugin`` only when allure-pytest writes
results (``--alluredir``). Labels: epic = broker plugin, feature = fault kind(s),
story = scenario. Steps: one per phase (image build, cluster start, workload,
drain, teardown, reconciliation, report), one per fault applied or healed with
its parameters and times, nested in the workload step. Attachments: the
scenario, the results, the timeline plot, the attribution table, and the node
logs when the run is not durable or dies. Parameters carry the seed, so a
reviewer can rerun exactly what failed.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any

import allure
import allure_commons
from allure_commons.types import AttachmentType, LabelType
from allure_commons.utils import uuid4

from harness import hookimpl
from harness.errors import BrokerChaosError
from harness.liveness import recovery_row
from harness.spec.history import EVIDENCE
from harness.spec.results import (
    ANOMALY_CLASSES,
    INTEGRITY_ANOMALIES,
    exposure_classes,
    row_class,
    shown_classes,
)
from harness.spec.rundir import NODES, PLOTS, RESULTS_JSON, SCENARIO_JSON
from harness.verdicts import checker_lines, no_fault_bit, verdict_line

PHASE_TITLES = {
    "images": "build images",
    "cluster": "start cluster",
    "workload": "workload and faults",
    "teardown": "collect logs, tear down",
    "history": "history to Parquet",
    "check": "reconciliation",
    "report": "HTML report",
}


def _epoch_ms(iso: str) -> int:
    return int(_dt.datetime.fromisoformat(iso).timestamp() * 1000)


def _current_test() -> Any:
    """The Allure result of the test now running, or None (no allure-pytest listener)."""
    for plugin in allure_commons.plugin_manager.get_plugins():
        logger = getattr(plugin, "allure_logger", None)
        if logger is not None:
            return logger.get_test(None)
    return None


def _step_item(uuid: str) -> Any:
    for plugin in allure_commons.plugin_manager.get_plugins():
        logger = getattr(plugin, "allure_logger", None)
        if logger is not None:
            return logger.get_item(uuid)
    return None


class AllureReporter:
    """Listens to one host's run hooks; keeps the open phase steps of the run in progress."""

    def __init__(self) -> None:
        self._open: list[tuple[str, str]] = []  # (phase, step uuid), innermost last

    # -- steps ---------------------------------------------------------------------------

    def _start(self, title: str, params: dict[str, Any] | None = None) -> str:
        uuid = uuid4()
        # Allure's format wants parameter values as text; a bare 0 would be dropped as empty.
        text = {k: v if isinstance(v, str) else json.dumps(v, default=str) for k, v in (params or {}).items()}
        allure_commons.plugin_manager.hook.start_step(uuid=uuid, title=title, params=text)
        return uuid

    def _stop(self, uuid: str, error: BaseException | None = None) -> None:
        allure_commons.plugin_manager.hook.stop_step(
            uuid=uuid, title="", exc_type=type(error) if error else None, exc_val=error, exc_tb=None
        )

    def _past_step(
        self,
        title: str,
        params: dict[str, Any],
        start_ms: int | None,
        stop_ms: int | None,
        error: BaseException | None = None,
    ) -> None:
        """A step for something that already happened, with its own start and stop times."""
        uuid = self._start(title, params)
        item = _step_item(uuid)
        self._stop(uuid, error)
        if item is not None:
            if start_ms is not None:
                item.start = start_ms
            if stop_ms is not None:
                item.stop = stop_ms

    def _close_all(self, error: BaseException | None = None) -> None:
        while self._open:
            _, uuid = self._open.pop()
            self._stop(uuid, error)

    # -- hooks ---------------------------------------------------------------------------

    @hookimpl
    def brokerchaos_run_started(self, run: Any) -> None:
        self._close_all()
        sc = run.scenario
        kinds = sorted({s.kind for s in run.plan.steps}) or ["no faults"]
        test = _current_test()
        have = {(lb.name, lb.value) for lb in test.labels} if test is not None else set()
        for label_type, value in (
            [(LabelType.EPIC, run.plugin.name)]
            + [(LabelType.FEATURE, k) for k in kinds]
            + [(LabelType.STORY, sc.name)]
        ):
            if (label_type, value) not in have:
                allure.dynamic.label(label_type, value)
        if test is not None:
            for name, value in (
                ("seed", sc.seed),
                ("broker", run.plugin.name),
                ("broker_version", run.plugin.release.name if run.plugin.release else "-"),
                ("scenario", sc.name),
                ("nodes", sc.broker.nodes),
                ("duration_s", sc.workload.duration),
            ):
                allure.dynamic.parameter(name, value)
            allure.dynamic.parameter("run_dir", str(run.dir.path) if run.dir else "", excluded=True)
        uuid = self._start(
            f"run {sc.name} seed={sc.seed} on {run.plugin.name}",
            {
                "seed": sc.seed,
                "broker": run.plugin.name,
                "run_id": run.id,
                "rerun": f"brokerchaos run {sc.source or sc.name} --seed {sc.seed}",
            },
        )
        self._open.append(("run", uuid))

    @hookimpl
    def brokerchaos_phase(self, run: Any, phase: str, status: str, detail: dict[str, Any]) -> None:
        if status == "start":
            if phase == "teardown":
                self._drain_step(run)
            title = PHASE_TITLES.get(phase, phase)
            if phase == "cluster":
                title = f"start cluster ({len(run.nodes)} node{'s' if len(run.nodes) != 1 else ''})"
            uuid = self._start(title)
            self._open.append((phase, uuid))
            # A phase that ran on another thread (the check, beside the teardown) is reported
            # afterwards with its real start and stop.
            if detail.get("start_ms") is not None and (item := _step_item(uuid)) is not None:
                item.start = detail["start_ms"]
            return
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i][0] == phase:
                error = BrokerChaosError(str(detail.get("error"))) if status == "failed" else None
                closing = self._open[i:]
                del self._open[i:]
                for _, uuid in reversed(closing):
                    item = _step_item(uuid) if detail.get("stop_ms") is not None else None
                    self._stop(uuid, error)
                    if item is not None:
                        item.stop = detail["stop_ms"]
                return

    @hookimpl
    def brokerchaos_fault(self, run: Any, op: dict[str, Any]) -> None:
        value = json.loads(op["value"]) if isinstance(op.get("value"), str) else (op.get("value") or {})
        t = op["time_ns"] / 1e9
        if op["f"] == "heal":
            if value.get("final"):
                title = f"final heal at t={t:.1f}s"
            else:
                title = f"heal {', '.join(value.get('fault_ids', []))} at t={t:.1f}s"
        else:
            node = op.get("node")
            title = f"{value.get('fault_id', '?')} {op['f']}{' on ' + node if node else ''} at t={t:.1f}s"
        params = {
            "time_s": f"{t:.3f}",
            "wall_time": op["wall_time"],
            "outcome": op["type"],
            "params": json.dumps(value.get("params", {}), sort_keys=True),
            "done": json.dumps(value.get("done", {}), sort_keys=True, default=str)[:2000],
        }
        if value.get("hold") is not None:
            params["hold_s"] = value["hold"]
        evidence = value.get(EVIDENCE) or {}
        if evidence:
            params["evidence"] = str(evidence.get("summary"))
            params["effect"] = {True: "bit", False: "no effect", None: "not measured"}[evidence.get("effect")]
            title += " (no effect)" if evidence.get("effect") is False else ""
        error = BrokerChaosError(op["error"]) if op["type"] != "ok" and op.get("error") else None
        at = _epoch_ms(op["wall_time"])  # when it completed; the step is a point on the timeline
        self._past_step(title, params, at, at, error)

    @hookimpl
    def brokerchaos_run_finished(self, run: Any, results: dict[str, Any]) -> None:
        running = (results.get("broker") or {}).get("running")
        if running and _current_test() is not None:
            allure.dynamic.parameter("broker_running", running, excluded=True)  # what it reported
        self._checker_steps(results)
        self._liveness_steps(results)
        self._evidence_step(results)
        self._anomaly_step(results)
        self._attach_run(run, results)
        error = None
        if results.get("valid") is not True or no_fault_bit(results):
            error = AssertionError(f"verdict {verdict_line(results)}: {results.get('reason', '')}")
        self._close_all(error)

    def _evidence_step(self, results: dict[str, Any]) -> None:
        """How many faults bit, with each no-effect line (failed when none bit), and each power cut's
        exposure (failed when acknowledged messages were unsynced under a promise to sync first)."""
        ev = results.get("fault_evidence") or {}
        if not ev.get("faults"):
            return
        params = {k: ev.get(k) for k in ("faults", "bit", "no_effect", "unmeasured", "not_restored")}
        params |= {
            f"line {i + 1}": line
            for i, line in enumerate(
                [*ev.get("lines", []), *ev.get("exposure_lines", []), *ev.get("unsynced_lines", [])]
            )
        }
        broke = ev.get("unsynced_lines") or []
        error = AssertionError(verdict_line(results)) if ev.get("no_fault_bit") else None
        error = AssertionError("; ".join(broke)) if broke else error
        self._past_step(f"fault evidence: {ev['bit']} of {ev['faults']} bit", params, None, None, error)

    def run_aborted(self, run: Any, exc: BaseException) -> None:
        """The run raised before it was checked: attach what exists, close the open steps."""
        try:
            self._attach_run(run, None)
        finally:
            self._close_all(
                exc if isinstance(exc, Exception) else BrokerChaosError(str(exc) or type(exc).__name__)
            )

    def _checker_steps(self, results: dict[str, Any]) -> None:
        """One step per checker with its own verdict (failed unless durable), reason and counts;
        the run's verdict is the worst of them."""
        for name, p in (results.get("checkers") or {}).items():
            verdict = p.get("verdict") or "no verdict"
            why = p.get("error") or p.get("reason") or "; ".join(p.get("notes") or [])
            params = {"verdict": verdict, "reason": why or "-", "engine": p.get("engine") or "-"}
            params |= {k: v for k, v in (p.get("counts") or {}).items() if v}
            error = AssertionError(f"{name}: {verdict}: {why}") if verdict != "durable" else None
            self._past_step(f"checker {name}: {verdict}", params, None, None, error)

    def _liveness_steps(self, results: dict[str, Any]) -> None:
        """One step per fault step: did every queue come back after its heal, and how fast (failed
        when a queue did not recover or recovered over its budget)."""
        by_fault: dict[str, list[dict[str, Any]]] = {}
        for r in (results.get("liveness") or {}).get("recovery") or []:
            by_fault.setdefault(r["fault_id"], []).append(r)
        for fault_id, rows in by_fault.items():
            bad = [r for r in rows if r.get("healed") and (not r.get("recovered") or r.get("over_budget"))]
            healed = any(r.get("healed") for r in rows)
            state = "not healed" if not healed else "did not recover" if bad else "recovered"
            params = {r["queue"]: recovery_row(r) for r in rows}
            error = AssertionError("; ".join(recovery_row(r) for r in bad)) if bad else None
            self._past_step(f"liveness {fault_id} ({rows[0]['kind']}): {state}", params, None, None, error)

    def _anomaly_step(self, results: dict[str, Any]) -> None:
        """Jepsen's finer classes, one step when any occurred or nodes' holdings were recorded
        (failed for the classes that make a run INTEGRITY), with each node's holdings."""
        a = results.get("anomalies") or {}
        counts = a.get("counts") or {}
        found = {k: counts[k] for k in ANOMALY_CLASSES if counts.get(k)}
        if not found and not a.get("holdings"):
            return
        params: dict[str, Any] = {k.replace("_", " "): v for k, v in found.items()}
        for h in a.get("holdings") or []:
            held = f"{h['entries']} entries" if h["outcome"] == "ok" else f"{h['outcome']}: {h['error']}"
            params[f"holdings {h['node']} {h['queue']}"] = held
        bad = {k: v for k, v in found.items() if k in INTEGRITY_ANOMALIES}
        error = (
            AssertionError(", ".join(f"{v} {k.replace('_', ' ')}" for k, v in bad.items())) if bad else None
        )
        title = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in found.items()) or "none"
        self._past_step(f"anomaly classes: {title}", params, None, None, error)

    # -- drain and attachments -------------------------------------------------------------

    def _drain_step(self, run: Any) -> None:
        """The drain happens inside the workload phase; the closed history says when and how much."""
        if run.dir is None or not run.dir.history_jsonl.exists():
            return
        from harness.history import read_jsonl

        first: dict[str, Any] | None = None
        last: dict[str, Any] | None = None
        drained: dict[str, Any] = {}
        failed = 0
        for rec in read_jsonl(run.dir.history_jsonl):
            if rec["f"] != "drain":
                continue
            if rec["type"] == "invoke":
                first = first or rec
            else:
                last = rec
                failed += rec["type"] != "ok"
                if rec["type"] == "ok" and rec.get("queue"):
                    drained[rec["queue"]] = rec.get("value")
        if first is None:
            return
        params = {"queues": json.dumps(drained, sort_keys=True, default=str)[:2000], "incomplete": failed}
        error = BrokerChaosError(f"{failed} drain operation(s) did not complete") if failed else None
        self._past_step(
            "drain",
            params,
            _epoch_ms(first["wall_time"]),
            _epoch_ms(last["wall_time"]) if last else None,
            error,
        )

    def _attach_run(self, run: Any, results: dict[str, Any] | None) -> None:
        if run.dir is None:
            return
        path: Path = run.dir.path
        if (path / SCENARIO_JSON).exists():
            allure.attach.file(
                str(path / SCENARIO_JSON), name="scenario", attachment_type=AttachmentType.JSON
            )
        if (path / RESULTS_JSON).exists():
            allure.attach.file(str(path / RESULTS_JSON), name="results", attachment_type=AttachmentType.JSON)
        for plot in ("timeline", "latency"):
            png = path / PLOTS / f"{plot}.png"
            if png.exists():
                allure.attach.file(str(png), name=f"{plot} plot", attachment_type=AttachmentType.PNG)
        if results is not None:
            allure.attach(
                attribution_text(results), name="loss attribution", attachment_type=AttachmentType.TEXT
            )
            if results.get("checkers"):
                allure.attach(
                    verdicts_text(results), name="verdicts and findings", attachment_type=AttachmentType.TEXT
                )
        if results is None or results.get("valid") is not True:
            self._attach_logs(path)

    def _attach_logs(self, path: Path) -> None:
        if (path / "harness.log").exists():
            allure.attach.file(
                str(path / "harness.log"), name="harness.log", attachment_type=AttachmentType.TEXT
            )
        nodes = path / NODES
        for f in sorted(nodes.glob("*/*")) if nodes.exists() else []:
            if f.is_file() and f.stat().st_size:
                allure.attach.file(
                    str(f), name=f"{f.parent.name}/{f.name}", attachment_type=AttachmentType.TEXT
                )
        for f in sorted(nodes.glob("*/logs/**/*")) if nodes.exists() else []:
            if f.is_file() and f.stat().st_size:
                allure.attach.file(
                    str(f), name=f"{f.relative_to(nodes)}", attachment_type=AttachmentType.TEXT
                )


def attribution_text(results: dict[str, Any]) -> str:
    """The attribution table as plain text (Allure shows it inline)."""
    c = results.get("counts") or {}
    att = results.get("attribution") or {}
    lines = [
        f"verdict: {results.get('verdict', results.get('valid'))}  lost: {c.get('lost')}  "
        f"unreachable: {c.get('unreachable', 0)}  stuck: {c.get('stuck', 0)}  confirmed: {c.get('confirmed')}",
        "",
        f"{'fault kind':<18}{'node':<8}{'class':<14}messages",
    ]
    rows = att.get("rows") or []
    lines += [f"{r['fault_kind']:<18}{str(r['node']):<8}{row_class(r, c):<14}{r['count']}" for r in rows] or [
        "(no lost, unreachable or stuck messages)"
    ]
    shown = shown_classes(results)
    lines += [
        "",
        f"{'fault kind':<18}{'exposed confirmed':<20}"
        + "".join(f"{k:<{len(k) + 2}}" for k in shown).rstrip(),
    ]
    for r in att.get("exposure") or []:
        by = exposure_classes(r, c)
        cells = "".join(f"{by[k]:<{len(k) + 2}}" for k in shown).rstrip()
        lines.append(f"{r['fault_kind']:<18}{r['confirmed']:<20}{cells}")
    stuck = results.get("stuck") or []
    if stuck:
        lines += [
            "",
            "held unacked by no consumer (stuck):",
            f"{'node':<8}{'queue':<16}{'unacked':<10}since s",
        ]
        lines += [
            f"{q['node']:<8}{str(q['queue']):<16}{q['unacked']:<10}{q['since_ns'] / 1e9:.1f}" for q in stuck
        ]
    return "\n".join(lines) + "\n"


def verdicts_text(results: dict[str, Any]) -> str:
    """The run's verdict, each checker's under it, and examples of each checker's findings."""
    head = f"verdict: {results.get('verdict')}  ({results.get('reason') or results.get('error') or '-'})"
    return "\n".join([head, *checker_lines(results, 0, always=True)]) + "\n"
