"""A Spark Connect server that outlives one command (``brokerchaos spark start|status|stop``).

The server is the installed pyspark's own (its jars ship ``SparkConnectServer``), started with
``spark-submit`` on loopback and the same settings as the in-process session. What it is
(process id, port, log) is kept in a small state file, so every later command of the same user
finds it: while it is up, checks run there instead of starting a JVM of their own
(``_spark_session.where``). ``brokerchaos spark start`` also warms it (``plugin``), so a run's
workload shares the machine with no warm-up at all.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from spark_reports.service.conf import DEFAULT_DRIVER_MEMORY, SESSION_CONF, jvm_options

DEFAULT_PORT = 15002
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT = 180.0
"""Seconds a starting server has to open its port (a JVM start under load takes tens)."""
STOP_TIMEOUT = 30.0


def state_dir(home: Path | None = None) -> Path:
    """Where the state file and the server's log are: ``home`` when given (a test's server, which
    later commands must not find), else the cache directory (``$BROKERCHAOS_CACHE``)."""
    return home or Path(os.environ.get("BROKERCHAOS_CACHE", Path.home() / ".cache" / "brokerchaos"))


def state_file(home: Path | None = None) -> Path:
    return state_dir(home) / "spark-connect.json"


def answers(port: int, host: str = "127.0.0.1", timeout: float = 1.0) -> bool:
    """Something accepts a TCP connection at ``host:port`` within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _ours(pid: int) -> bool:
    """The process is alive and is a Spark Connect server (not a process that took a dead one's id)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return SERVER_CLASS.encode() in cmdline


def status(home: Path | None = None) -> dict[str, Any] | None:
    """The running server's state (``url``, ``pid``, ``port``, ``log``, ``started``), or None
    (a state file left by a server that is gone is removed)."""
    path = state_file(home)
    try:
        state = dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None
    if _ours(int(state["pid"])) and answers(int(state["port"])):
        return state
    if not _ours(int(state["pid"])):
        path.unlink(missing_ok=True)
    return None


def local_url() -> str | None:
    """The local server's address while it is up and answering, else None."""
    state = status()
    return None if state is None else str(state["url"])


def server_command(port: int, driver_memory: str) -> list[str]:
    import pyspark

    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    conf = {
        **SESSION_CONF,
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.extraJavaOptions": jvm_options(driver=True),
        "spark.executor.extraJavaOptions": jvm_options(driver=False),
    }
    cmd = [str(submit), "--class", SERVER_CLASS, "--master", "local[*]", "--driver-memory", driver_memory]
    for k, v in conf.items():
        cmd += ["--conf", f"{k}={v}"]
    return [*cmd, "--name", "brokerchaos-spark-connect", "spark-internal"]


def start(
    port: int | None = None, driver_memory: str | None = None, *, home: Path | None = None
) -> dict[str, Any]:
    """Start the server (or find it up) and wait until it answers; its state, with ``already``
    True when it was up before."""
    state = status(home)
    if state is not None:
        return {**state, "already": True}
    port = port or DEFAULT_PORT
    if answers(port):
        raise ValueError(
            f"port {port} is taken by another program: give another with `brokerchaos spark start --port N`"
        )
    memory = driver_memory or os.environ.get("BROKERCHAOS_SPARK_DRIVER_MEMORY") or DEFAULT_DRIVER_MEMORY
    state_dir(home).mkdir(parents=True, exist_ok=True)
    log = state_dir(home) / "spark-connect.log"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    for var in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE"):
        env.pop(var, None)
    t0 = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            server_command(port, memory),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # not stopped by the terminal's Ctrl-C of a later command
        )
    while not answers(port):
        if proc.poll() is not None:
            tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
            raise ValueError(f"the Spark Connect server exited ({proc.returncode}): {tail} (log: {log})")
        if time.monotonic() - t0 > START_TIMEOUT:
            _terminate(proc.pid)
            raise ValueError(
                f"the Spark Connect server did not answer on port {port} in {START_TIMEOUT:.0f}s (log: {log})"
            )
        time.sleep(0.2)
    state = {
        "url": f"sc://127.0.0.1:{port}",
        "pid": proc.pid,
        "port": port,
        "driver_memory": memory,
        "log": str(log),
        "started": time.time(),
        "start_seconds": round(time.monotonic() - t0, 1),
    }
    state_file(home).write_text(json.dumps(state, indent=1))
    return {**state, "already": False}


def stop(home: Path | None = None) -> dict[str, Any] | None:
    """Stop the server this user started; its last state, or None when none was up."""
    path = state_file(home)
    try:
        state = dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None
    pid = int(state["pid"])
    if not _ours(pid):
        path.unlink(missing_ok=True)
        return None
    _terminate(pid)
    path.unlink(missing_ok=True)
    return state


def _terminate(pid: int) -> None:
    """SIGTERM, then SIGKILL if it has not exited after STOP_TIMEOUT seconds."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    t0 = time.monotonic()
    while _ours(pid) and time.monotonic() - t0 < STOP_TIMEOUT:
        _reap(pid)
        time.sleep(0.2)
    if _ours(pid):
        os.kill(pid, signal.SIGKILL)
        _reap(pid)


def _reap(pid: int) -> None:
    """Collect the exit status when the server is this process's child (else it stays a zombie)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
