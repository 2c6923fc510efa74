"""Broker nodes as subprocesses of the tests: ``python -m broker_impl --config`` on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker_impl.ctl import CtlError, call

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BrokerProc:
    """One node process on the config a subclass writes to ``self.config``; ``kill()`` is SIGKILL,
    ``start()`` brings it back on the same data."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.dir = root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.dir / "data"
        self.amqp_port = free_port()
        self.config = self.dir / "broker.toml"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait: bool = True) -> BrokerProc:
        (self.data_dir / "node.json").unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker_impl", "--config", str(self.config)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(self.dir / "stderr.log", "ab"),
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        if wait:
            self.wait_serving()
        return self

    def wait_serving(self) -> None:
        deadline = time.monotonic() + 60  # generous: several nodes starting on a busy 2-core machine
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"node {self.name} exited: {(self.dir / 'stderr.log').read_text()[-2000:]}")
            try:
                call(self.data_dir, "status", timeout=2)
                return
            except (CtlError, OSError, ValueError):
                time.sleep(0.1)
        raise RuntimeError(f"node {self.name} did not start")

    def ctl(self, cmd: str, **args: Any) -> Any:
        return call(self.data_dir, cmd, args)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def log(self) -> str:
        p = self.dir / "broker.log"
        return p.read_text() if p.exists() else ""


def wait_for(cond: Callable[[], Any], timeout: float = 45.0, what: str = "condition") -> Any:
    """Poll ``cond`` until it returns something true; a node that does not answer yet is polled again."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = cond()
            if last:
                return last
        except (CtlError, OSError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")
