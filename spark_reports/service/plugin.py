"""The Spark service as a brokerchaos plugin: where checks run (``--spark-master``,
``--spark-remote``), and ``brokerchaos spark start|status|stop`` for the local Spark Connect server."""

from __future__ import annotations

import time
from typing import Any

import pluggy

from spark_reports.engines.spark.check import warm_up_server
from spark_reports.service import connect
from spark_reports.service.session import check_answers, check_master, check_remote, settings

hookimpl = pluggy.HookimplMarker("brokerchaos")


@hookimpl
def brokerchaos_configure(config: dict[str, Any]) -> None:
    check_master(config.get("spark_master"))
    check_remote(config.get("spark_remote"))
    if config.get("spark_remote"):  # before a run's minutes, not at its check
        check_answers(config["spark_remote"])
    settings.update(config)


@hookimpl
def brokerchaos_service(name: str, action: str, options: dict[str, Any]) -> dict[str, Any] | None:
    """``brokerchaos spark start|status|stop``: the local Spark Connect server (``service.connect``)."""
    if name != "spark":
        return None
    actions = {"start": _start, "status": _status, "stop": _stop}
    if action not in actions:
        raise ValueError(f"spark {action!r}: give start, status or stop")
    return actions[action](options)


def _start(options: dict[str, Any]) -> dict[str, Any]:
    s = connect.start(options.get("port"), options.get("driver_memory"))
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


def _status(options: dict[str, Any]) -> dict[str, Any]:
    state = connect.status()
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


def _stop(options: dict[str, Any]) -> dict[str, Any]:
    state = connect.stop()
    if state is None:
        return {"up": False, "lines": ["no Spark Connect server was up"]}
    return {
        "up": False,
        "lines": [f"stopped the Spark Connect server at {state['url']} (pid {state['pid']})"],
    }
