"""`python -m faults.node.clockread [--socket S]`: the wall clock the broker's processes read, measured.

Runs inside the node container. Asks the node init for the broker's processes, then:

- which of them have the fake clock library mapped (``/proc/PID/maps``): a process without it
  (a static binary, a runtime that never loaded libc's clock) does not see the offset at all;
- the offset a libc reader gets with the broker's own clock environment (``LD_PRELOAD`` and
  ``FAKETIME_*`` from ``/proc/PID/environ``): a fresh process started with it reads the clock
  three times, each between two reads of the true clock in this process (same kernel clock,
  no ``docker exec`` latency in the measurement).

Prints one JSON line: ``{"ok": true, "offset_s": ..., "samples": [...], "pids": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from faults.node.wire import ControlError, request

READ = "import time; print(repr(time.time()))"


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e]
    return {k.decode(): v.decode() for k, v in pairs}


def _fake_clock_mapped(pid: int, lib: str) -> bool:
    name = os.path.basename(lib) if lib else "libfaketime"
    try:
        with open(f"/proc/{pid}/maps") as f:
            return any(name in line for line in f)
    except OSError:
        return False


def measure(pids: list[int]) -> dict[str, Any]:
    env: dict[str, str] = {}
    mapped: dict[str, bool] = {}
    for pid in pids:
        try:
            own = _environ(pid)
        except OSError:
            continue
        clock = {k: v for k, v in own.items() if k == "LD_PRELOAD" or k.startswith("FAKETIME")}
        env = env or clock
        mapped[str(pid)] = _fake_clock_mapped(pid, clock.get("LD_PRELOAD", ""))
    samples, spans = [], []
    for _ in range(3):
        before = time.time()
        out = subprocess.run(
            [sys.executable, "-c", READ],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=30,
        )
        after = time.time()
        samples.append(round(float(out.stdout.strip()) - (before + after) / 2, 4))
        spans.append(after - before)
    return {
        "offset_s": statistics.median(samples),
        "samples": samples,
        "uncertainty_s": round(max(samples) - min(samples), 4),
        # A reader on the true clock prints a time between ``before`` and ``after``: each sample is
        # then within half its span of zero, however long a loaded machine took to start it.
        "bound_s": round(max(spans) / 2 + 1e-4, 4),
        "pids": mapped,
        "clock_env": env,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m faults.node.clockread")
    p.add_argument(
        "--socket", default=os.environ.get("BROKERCHAOS_NODE_SOCKET", "/run/brokerchaos/node.sock")
    )
    a = p.parse_args(argv)
    try:
        status = request(a.socket, json.dumps({"cmd": "status"}), timeout=30)
        reply = {"ok": True, **measure([int(x) for x in status.get("pids") or []])}
    except (ControlError, OSError, ValueError, subprocess.SubprocessError) as e:
        reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(reply, sort_keys=True))
    return 0 if reply["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
