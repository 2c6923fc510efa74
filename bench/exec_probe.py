"""A plugin for benchmarks (``brokerchaos -p bench.exec_probe run ...``): every command the harness
ran in a container (``docker exec``), with its start, duration and exit code, the harness's own CPU
and the node containers' CPU (their cgroups: the brokers and every command run in them, such as
the Erlang VM each ``rabbitmqctl`` boots) at each phase's start and end, written as JSON to
``$BROKERCHAOS_EXEC_PROBE``.

Counts of commands and CPU seconds depend much less on the machine's load than wall times do: on
a shared two-core machine they are what a before/after comparison can rest on.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import pluggy

import harness.cluster as _cluster

hookimpl = pluggy.HookimplMarker("brokerchaos")
_t0 = time.monotonic()
_execs: list[dict[str, Any]] = []
_marks: list[dict[str, Any]] = []
_containers: dict[str, str] = {}  # id -> name
_original = _cluster._exec


def _traced(container: Any, cmd: Any, timeout: float) -> tuple[int, str]:
    t = time.monotonic()
    rc, out = _original(container, cmd, timeout)
    name = getattr(container, "name", "?")
    _containers[container.id] = name
    _execs.append(
        {
            "t": round(t - _t0, 2),
            "s": round(time.monotonic() - t, 2),
            "node": name,
            "cmd": list(cmd),
            "rc": rc,
        }
    )
    return rc, out


_cluster._exec = _traced
_remove = _cluster.remove_labelled


def _timed_remove(client: Any, run_id: str | None = None) -> dict[str, int]:
    """The teardown's removal of the run's containers, network and volumes, as a phase of its own."""
    _mark("remove", "start")
    try:
        return _remove(client, run_id)
    finally:
        _mark("remove", "done")


_cluster.remove_labelled = _timed_remove


def _own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return round(r.ru_utime + r.ru_stime, 2)


def _container_cpu() -> dict[str, float]:
    """CPU seconds each known container's cgroup used so far (cgroup v1 ``cpuacct`` or v2 ``cpu.stat``)."""
    out = {}
    for cid, name in _containers.items():
        for path in (
            Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage"),
            Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat"),
        ):
            try:
                text = path.read_text()
            except OSError:
                continue
            if path.name == "cpuacct.usage":
                out[name] = round(int(text) / 1e9, 2)
            else:
                usec = next(int(v) for k, v in (ln.split() for ln in text.splitlines()) if k == "usage_usec")
                out[name] = round(usec / 1e6, 2)
            break
    return out


def _mark(phase: str, status: str) -> None:
    _marks.append(
        {
            "phase": phase,
            "status": status,
            "t": round(time.monotonic() - _t0, 2),
            "epoch": time.time(),
            "cpu": _own_cpu(),
            "containers": _container_cpu(),
        }
    )


@hookimpl
def brokerchaos_run_started(run: Any) -> None:
    _mark("run", "start")


@hookimpl
def brokerchaos_phase(run: Any, phase: str, status: str, detail: dict[str, Any]) -> None:
    _mark(phase, status)


@hookimpl
def brokerchaos_run_finished(run: Any, results: dict[str, Any]) -> None:
    _mark("run", "done")
    out = os.environ.get("BROKERCHAOS_EXEC_PROBE")
    if out:
        Path(out).write_text(json.dumps({"marks": _marks, "execs": _execs}, indent=1))
