"""Fixtures: a broker node running in-process on its own event-loop thread, or as a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_impl.config import Config, parse
from broker_impl.server import Server
from tests.polling import until

REPO = Path(__file__).resolve().parents[2]


class InProcessNode:
    """A Server on a background thread, so blocking clients (pika, kombu) can talk to it from the test."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.loop = asyncio.new_event_loop()
        self.server = Server(config)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> InProcessNode:
        self._thread.start()
        self.call(self.server.start())
        return self

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def broker(self) -> Any:
        return self.server.broker

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def run(self, fn: Callable[[], Any]) -> Any:
        """Run a plain function on the broker's loop (to read state without races)."""

        async def wrap() -> Any:
            return fn()

        return self.call(wrap())

    def stop(self) -> None:
        try:
            self.call(self.server.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
            self.loop.close()


def make_config(tmp_path: Path, **overrides: Any) -> Config:
    data: dict[str, Any] = {
        "node": {"port": 0, "data_dir": str(tmp_path / "data"), "log_file": str(tmp_path / "broker.log")}
    }
    for key, value in overrides.items():
        table, _, name = key.partition("__")
        if name:
            data.setdefault(table, {})[name] = value
        else:
            data[table] = value
    return parse(data, tmp_path)


@pytest.fixture
def node_factory(tmp_path: Path) -> Iterator[Callable[..., InProcessNode]]:
    nodes: list[InProcessNode] = []

    def make(**overrides: Any) -> InProcessNode:
        node = InProcessNode(make_config(tmp_path, **overrides)).start()
        nodes.append(node)
        return node

    yield make
    for n in nodes:
        n.stop()


@pytest.fixture
def node(node_factory: Callable[..., InProcessNode]) -> InProcessNode:
    return node_factory()


class SubprocessNode:
    """``python -m broker_impl`` in a child process; killable with SIGKILL for crash tests."""

    def __init__(self, tmp_path: Path, toml: str) -> None:
        self.dir = tmp_path
        self.cfg = tmp_path / "broker.toml"
        self.cfg.write_text(toml)
        self.data_dir = tmp_path / "data"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self) -> SubprocessNode:
        (self.data_dir / "node.json").unlink(missing_ok=True)
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker_impl", "--config", str(self.cfg)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "stderr.log", "ab"),
        )
        proc = self.proc
        info = until(
            lambda: (i := json.loads((self.data_dir / "node.json").read_text())).get("pid") == proc.pid and i,
            "the broker's node.json",
            ignore=(OSError, json.JSONDecodeError),
            gone=lambda: (
                None
                if proc.poll() is None
                else f"broker exited with {proc.returncode}: {(self.dir / 'stderr.log').read_text()[-2000:]}"
            ),
        )
        self.port = info["port"]
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


@pytest.fixture
def subprocess_node(tmp_path: Path) -> Iterator[Callable[[str], SubprocessNode]]:
    nodes: list[SubprocessNode] = []

    def make(toml: str) -> SubprocessNode:
        n = SubprocessNode(tmp_path, toml)
        nodes.append(n)
        return n

    yield make
    for n in nodes:
        n.kill()
