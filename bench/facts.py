"""Machine facts and result files shared by the broker benchmarks.

A number without the machine, the load on it and the command that produced it
cannot be compared with anything, so every result file carries all three.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def command_line() -> str:
    """How this benchmark was started, as one could type it again from the repository root."""
    argv = list(sys.argv)
    if argv and argv[0].endswith(".py"):
        mod = Path(argv[0]).resolve()
        try:
            rel = mod.relative_to(RESULTS.parent.parent)
            argv[0] = "-m " + ".".join(rel.with_suffix("").parts)
        except ValueError:
            pass
    return "python " + " ".join([argv[0]] + [shlex.quote(a) for a in argv[1:]])


def _meminfo_total() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine_facts() -> dict[str, Any]:
    try:
        docker = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        docker = "?"
    return {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory_bytes": _meminfo_total(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "docker_server": docker,
        "client_libraries": {p: _version(p) for p in ("aiormq", "pamqp", "uvloop")},
        "load_average_at_start": os.getloadavg(),
    }


def write_json(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def write_text(name: str, text: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(text)
    return path


def add_store_and_out(p: argparse.ArgumentParser, store: str, out: str) -> None:
    """``--store`` (the run store root, default store/STORE/<time>) and ``--out`` (the report, bench/results/OUT)."""
    p.add_argument("--store", help=f"run store root (default store/{store}/<time>)")
    p.add_argument(
        "--out", default=str(RESULTS / out), help=f"results path without suffix (default bench/results/{out})"
    )


def write_report(out: Path | str, data: dict[str, Any], markdown: Callable[[dict[str, Any]], str]) -> None:
    """``out`` with ``.json`` (the data) and ``.md`` (``markdown(data)``), its folder made."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    out.with_suffix(".md").write_text(markdown(data))


def facts_markdown(facts: dict[str, Any], command: str) -> str:
    mem_gib = facts["memory_bytes"] / 2**30
    libs = ", ".join(f"{k} {v}" for k, v in facts["client_libraries"].items())
    load = load_text(facts["load_average_at_start"])
    lines = [
        f"- command: `{command}`",
        f"- date: {facts['date']}",
        f"- machine: {facts['nproc']} CPUs ({facts['cpu']}), {mem_gib:.1f} GiB RAM, kernel {facts['kernel']}, "
        f"Docker {facts['docker_server']}",
        f"- client: Python {facts['python']}, {libs}",
        f"- load average at start (1/5/15 min): {load}",
    ]
    if "load_average_at_end" in facts:
        lines.append("- load average at end: " + load_text(facts["load_average_at_end"]))
    return "\n".join(lines) + "\n"


def load_average() -> list[float]:
    """The 1/5/15-minute load averages, as ``/proc/loadavg`` states them."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def load_text(loads: Sequence[float]) -> str:
    """Load averages as every result file writes them: two decimals, space-separated."""
    return " ".join(f"{x:.2f}" for x in loads)


def say(line: str) -> None:
    """A progress line, stamped with the time of day."""
    stamp = _dt.datetime.now().strftime("%H:%M:%S")
    print(f"{stamp} {line}", flush=True)


def load_line() -> str:
    """The load on the machine as a long benchmark's opening line states it."""
    return f"load average {load_text(os.getloadavg())} on {os.cpu_count()} CPUs"


def measure(
    work: Callable[[], None],
    write: Callable[[], None],
    interrupts: tuple[type[BaseException], ...] = (KeyboardInterrupt,),
) -> bool:
    """Run ``work`` with SIGTERM taken as Ctrl-C (a benchmark started from a background shell
    ignores SIGINT), then ``write`` what was measured however it ended. True if interrupted."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        work()
    except interrupts:
        say("interrupted: the current run was stopped and torn down; writing what was measured")
        return True
    finally:
        signal.signal(signal.SIGTERM, previous)
        write()
    return False


def run_cli(main: Callable[[], int]) -> None:
    """Exit with ``main``'s code; errors a user can fix (Docker unreachable, a broker that
    does not start, a container removed mid-run) end in one line, not a traceback."""
    import docker.errors

    from harness.errors import BrokerChaosError

    try:
        code = main()
    except BrokerChaosError as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        code = 1
    except docker.errors.NotFound:
        print(
            "error: a benchmark container disappeared during the run (removed by `brokerchaos clean`?); "
            "run the benchmark again",
            file=sys.stderr,
        )
        code = 1
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


class Origin:
    """Where a long benchmark's report comes from: the machine's facts when it started (the load
    average it started under), its command line, and the clock its wall time is taken on."""

    def __init__(self) -> None:
        self.facts = machine_facts()
        self.command = command_line()
        self.started = time.monotonic()

    def record(self) -> dict[str, Any]:
        """The report's ``command``, ``facts`` (with the load average at the end) and ``wall_seconds``."""
        return {
            "command": self.command,
            "facts": {**self.facts, "load_average_at_end": os.getloadavg()},
            "wall_seconds": round(time.monotonic() - self.started, 1),
        }


def stamped_store(given: str | None, name: str) -> Path:
    """``--store`` when given, else ``store/<name>/<UTC time stamp>`` in the repository; resolved."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
    return (Path(given) if given else Path(__file__).resolve().parents[1] / "store" / name / stamp).resolve()
