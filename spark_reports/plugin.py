"""Registers both checkers, the report renderer and the grader with the brokerchaos host."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pluggy

from harness.spec.rundir import GRADE_JSON
from spark_reports.engines.atomicity import check_atomicity_python, check_atomicity_spark
from spark_reports.engines.delay import check_delay_python, check_delay_spark
from spark_reports.engines.python import check_python
from spark_reports.engines.spark.check import check_spark, start_session_in_background, warm_up_server
from spark_reports.engines.stream import check_stream_python
from spark_reports.service import connect as _spark_service
from spark_reports.service.session import check_answers, check_master, check_remote, spark_session

hookimpl = pluggy.HookimplMarker("brokerchaos")

#: What ``brokerchaos_configure`` said (``spark_master`` and ``spark_remote`` are the settings read here).
settings: dict[str, Any] = {}


@hookimpl
def brokerchaos_configure(config: dict[str, Any]) -> None:
    check_master(config.get("spark_master"))
    check_remote(config.get("spark_remote"))
    if config.get("spark_remote"):  # before a run's minutes, not at its check
        check_answers(config["spark_remote"])
    settings.update(config)


def _target() -> str | None:
    """Where the command line said to check: a Spark Connect server (``--spark-remote``) before a
    master (``--spark-master``); None: ``_spark_session.where`` decides."""
    return settings.get("spark_remote") or settings.get("spark_master")


def _spark(run_dir: Path, scenario: dict[str, Any]) -> dict[str, Any]:
    return dict(check_spark(run_dir, scenario, spark_master=_target()))


def _delay_spark(run_dir: Path, scenario: dict[str, Any]) -> dict[str, Any]:
    return check_delay_spark(run_dir, scenario, spark=spark_session(_target()))


def _atomicity_spark(run_dir: Path, scenario: dict[str, Any]) -> dict[str, Any]:
    return check_atomicity_spark(run_dir, scenario, spark=spark_session(_target()))


@hookimpl
def brokerchaos_register_checkers(register: Any) -> None:
    register.add_checker("spark", _spark, default=True)
    register.add_checker("python", check_python)
    register.add_checker("stream", check_stream_python)
    register.add_checker("delay", check_delay_python)
    register.add_checker("delay-spark", _delay_spark)
    register.add_checker("atomicity", check_atomicity_python)
    register.add_checker("atomicity-spark", _atomicity_spark)


@hookimpl
def brokerchaos_run_started(run: Any) -> None:
    """The JVM starts while the cluster comes up and the workload runs, not after the drain."""
    if {"spark", "delay-spark", "atomicity-spark"} & set(getattr(run, "checkers", ())):
        start_session_in_background(_target())


_plotting: threading.Thread | None = None


@hookimpl
def brokerchaos_phase(run: Any, phase: str, status: str, detail: dict[str, Any]) -> None:
    """Once the workload (and its drain) is done, the report's plotting library is imported beside
    the check and the teardown (``_import_plotting``): not during the workload, where its CPU would
    be taken from the brokers under test."""
    global _plotting
    if (phase, status) == ("workload", "done"):
        _plotting = threading.Thread(target=_import_plotting, name="report-imports", daemon=True)
        _plotting.start()


def _import_plotting() -> None:
    """matplotlib, which only the report renders with, imported ahead: the report is the last step
    of a run, after the check, and at a load of 20 on 2 cores this import alone took 7-19 s of
    wall time (about 1 s of CPU). A report that starts meanwhile waits for the import under way
    (Python's import lock), and one that fails here fails again, with its error, in the report."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
    except Exception:  # noqa: BLE001 - reported by the report's own import
        pass


@hookimpl
def brokerchaos_render_report(run_dir: Path, results: dict[str, Any]) -> str | None:
    from spark_reports.reports.report import render_report

    return str(render_report(run_dir, results))  # type: ignore[arg-type]  # a checker's Results, as a dict


@hookimpl
def brokerchaos_grade(run_dirs: list[Path], engine: str, out: Path) -> dict[str, Any]:
    from spark_reports import describe_grade, grade_runs, render_grade_report

    grade = grade_runs(run_dirs, spark_master=_target(), engine=engine)
    (out / GRADE_JSON).write_text(json.dumps(grade, indent=2, sort_keys=True, default=str))
    return {
        "verdict": grade.get("verdict"),
        "lines": describe_grade(grade),
        "report": str(render_grade_report(out, grade)),
        "grade": grade,
    }


@hookimpl
def brokerchaos_service(name: str, action: str, options: dict[str, Any]) -> dict[str, Any] | None:
    """``brokerchaos spark start|status|stop``: the local Spark Connect server (``_spark_service``)."""
    if name != "spark":
        return None
    if action == "start":
        s = _spark_service.start(options.get("port"), options.get("driver_memory"))
        if s["already"]:
            lines = [f"Spark Connect server already up at {s['url']} (pid {s['pid']})"]
        else:
            lines = [
                f"Spark Connect server up at {s['url']} (pid {s['pid']}, JVM started in {s['start_seconds']}s)"
            ]
            if not options.get("no_warm_up"):
                try:
                    seconds = warm_up_server(str(s["url"]))
                except Exception as exc:  # noqa: BLE001 - one line, the server's log has the rest
                    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                    raise ValueError(
                        f"the server started but its warm-up failed: {first} (log: {s['log']})"
                    ) from exc
                lines.append(f"warmed up in {seconds}s (the warm-up checks)")
        lines += [
            "run, analyze, grade and shrink check through it while it is up",
            f"log: {s['log']}",
            "stop it with: brokerchaos spark stop",
        ]
        return {"up": True, "lines": lines}
    if action == "status":
        state = _spark_service.status()
        if state is None:
            return {"up": False, "lines": ["no Spark Connect server is up: checks start Spark in process"]}
        minutes = (time.time() - float(state["started"])) / 60
        return {
            "up": True,
            "lines": [
                f"Spark Connect server up at {state['url']} (pid {state['pid']}, driver memory "
                f"{state['driver_memory']}, up {minutes:.0f} min)",
                f"log: {state['log']}",
            ],
        }
    if action == "stop":
        state = _spark_service.stop()
        if state is None:
            return {"up": False, "lines": ["no Spark Connect server was up"]}
        return {
            "up": False,
            "lines": [f"stopped the Spark Connect server at {state['url']} (pid {state['pid']})"],
        }
    raise ValueError(f"spark {action!r}: give start, status or stop")
