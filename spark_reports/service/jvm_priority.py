"""The in-process JVM's CPU priority: low while it warms up beside a run's workload, normal for
the real check.

The warm-up checks (``_warmup``) run while the brokers under test serve the workload, on the
same cores. On a quiet 2-core machine they took 100.8 CPU-seconds of an 86.7 s workload phase
(1.16 cores; ``bench/results/fast_answers_quiet.json``), CPU the brokers would otherwise have
had. So the JVM's threads run at nice 19 while they warm up (the kernel's fair scheduler gives
a nice-19 thread 15/1024 of a nice-0 thread's share when both want a core, and whatever is left
when nothing else does), and back at the harness's own nice for the real check. Linux keeps a
nice value per thread: every thread of the JVM is set, and a thread started later inherits its
creator's.
"""

from __future__ import annotations

import os
from typing import Any

WARM_UP_NICE = 19


def jvm_pid(session: Any) -> int | None:
    """The in-process JVM's pid (PySpark's gateway process: ``spark-submit`` execs ``java``);
    None for a Spark Connect session, whose JVM is the server's."""
    gateway = getattr(getattr(session, "sparkContext", None), "_gateway", None)
    proc = getattr(gateway, "proc", None)
    return None if proc is None else int(proc.pid)


def thread_nices(pid: int) -> dict[int, int]:
    """Each thread's nice value, by thread id (threads that end meanwhile are left out)."""
    out: dict[int, int] = {}
    for tid in _threads(pid):
        try:
            out[tid] = os.getpriority(os.PRIO_PROCESS, tid)
        except OSError:
            continue
    return out


def set_nice(pid: int, nice: int) -> bool:
    """Every thread of ``pid`` at ``nice``; False where the kernel refuses one (lowering a nice
    value, i.e. raising priority, needs CAP_SYS_NICE) or the process is gone. Passes repeat until
    one finds no thread the earlier ones missed (a thread started meanwhile by one not yet set)."""
    done, seen = True, set[int]()
    for _ in range(10):
        tids = set(_threads(pid))
        if not tids:
            return False
        if tids <= seen:
            return done
        for tid in tids - seen:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            except ProcessLookupError:
                continue
            except PermissionError:
                done = False
        seen |= tids
    return done


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []
