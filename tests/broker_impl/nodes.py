"""Broker nodes as subprocesses of the tests: ``python -m broker_impl --config`` on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika

from broker_impl.ctl import CtlError, call
from tests.polling import until
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]


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
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "stderr.log", "ab"),
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        if wait:
            self.wait_serving()
        return self

    def wait_serving(self) -> None:
        until(
            lambda: call(self.data_dir, "status", timeout=2) or True,
            f"node {self.name} to serve",
            every=0.1,
            ignore=(CtlError, OSError, ValueError),
            gone=self.gone,
        )

    def gone(self) -> str | None:
        """Why this node can no longer come up: its process exited (with its last stderr)."""
        if self.proc is not None and self.proc.poll() is not None:
            return f"node {self.name} exited: {(self.dir / 'stderr.log').read_text()[-2000:]}"
        return None

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


PERSISTENT = pika.BasicProperties(delivery_mode=2)


def amqp(node: BrokerProc) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", node.amqp_port, heartbeat=0, connection_attempts=1)
    )


def declare(node: BrokerProc, queue: str) -> None:
    """A durable queue declared through ``node`` (its master, unless a policy says otherwise)."""
    c = amqp(node)
    c.channel().queue_declare(queue, durable=True)
    c.close()


def drain(node: BrokerProc, queue: str) -> list[int]:
    """basic.get with auto-ack until empty; bodies as ints, in delivery order."""
    c = amqp(node)
    ch = c.channel()
    out = []
    while True:
        m, _p, body = ch.basic_get(queue, auto_ack=True)
        if m is None:
            break
        out.append(int(body))
    c.close()
    return out


def wait_for(cond: Callable[[], Any], what: str = "condition") -> Any:
    """Poll ``cond`` until it returns something true (no deadline: tests/polling.py); a node that
    does not answer yet is polled again."""
    return until(cond, what, every=0.1, ignore=(CtlError, OSError))
