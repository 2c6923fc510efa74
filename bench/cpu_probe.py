"""A plugin for benchmarks (``brokerchaos -p bench.cpu_probe run ...``): the CPU seconds the harness's
own processes took in each phase of a run, written as JSON to ``$BROKERCHAOS_CPU_PROBE``.

"Own processes" are the harness's process (every thread: the workload's clients, the nemesis, the
check) and all its descendants (the in-process Spark JVM), plus the processes whose ids
``$BROKERCHAOS_CPU_PROBE_PIDS`` lists (a Spark Connect server the checks use). The brokers run in
containers and are not counted.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pluggy

hookimpl = pluggy.HookimplMarker("brokerchaos")
TICK = os.sysconf("SC_CLK_TCK")
_marks: list[dict[str, Any]] = []


def probed_run(store: Path, duration: float, extra: list[str]) -> list[str]:
    """The CLI arguments of the run the overhead benchmarks time: the partitions scenario, probed."""
    args = ["-p", "bench.cpu_probe", "run", "scenarios/partitions.yaml"]
    return [*args, "--store", str(store), "--duration", str(duration), *extra]


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent id, CPU seconds of the process and of its children it waited for)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state): ppid is field 4, utime..cstime fields 14-17.
    return int(fields[1]), sum(int(x) for x in fields[11:15]) / TICK


def tree_cpu(root: int, extra: tuple[int, ...] = ()) -> float:
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            s = _stat(int(entry))
            if s is not None:
                stats[int(entry)] = s
    children: dict[int, list[int]] = {}
    for pid, (ppid, _cpu) in stats.items():
        children.setdefault(ppid, []).append(pid)
    seen, todo = set(), [root, *extra]
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in stats:
            continue
        seen.add(pid)
        todo += children.get(pid, [])
    return round(sum(stats[p][1] for p in seen), 2)


def _extra() -> tuple[int, ...]:
    return tuple(int(p) for p in os.environ.get("BROKERCHAOS_CPU_PROBE_PIDS", "").split(",") if p)


@hookimpl
def brokerchaos_run_started(run: Any) -> None:
    _marks.append(
        {"phase": "run", "status": "start", "t": time.monotonic(), "cpu": tree_cpu(os.getpid(), _extra())}
    )


@hookimpl
def brokerchaos_phase(run: Any, phase: str, status: str, detail: dict[str, Any]) -> None:
    _marks.append(
        {"phase": phase, "status": status, "t": time.monotonic(), "cpu": tree_cpu(os.getpid(), _extra())}
    )


@hookimpl
def brokerchaos_run_finished(run: Any, results: dict[str, Any]) -> None:
    out = os.environ.get("BROKERCHAOS_CPU_PROBE")
    if out:
        Path(out).write_text(json.dumps({"marks": _marks, "cores": os.cpu_count()}, indent=1))
