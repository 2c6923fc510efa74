"""Fixtures: a broker node running in-process on its own event-loop thread, or as a subprocess."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from broker_impl.config import Config, parse
from broker_impl.server import Server
from faults.lazyfs import LazyMount, fuse_available, is_mounted
from tests.factories import made_and_ended
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
    yield from made_and_ended(
        lambda **overrides: InProcessNode(make_config(tmp_path, **overrides)).start(), InProcessNode.stop
    )


@pytest.fixture
def node(node_factory: Callable[..., InProcessNode]) -> InProcessNode:
    return node_factory()


def connect(
    node: InProcessNode, user: str = "guest", password: str = "guest", vhost: str = "/", **kw: Any
) -> pika.BlockingConnection:
    creds = pika.PlainCredentials(user, password)
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port, vhost, creds, **kw))


@pytest.fixture
def ch(node: InProcessNode) -> Iterator[BlockingChannel]:
    """A channel on a connection of its own to ``node``; the connection must still close cleanly
    after the test (a broker that closed it under the test fails here)."""
    conn = connect(node)
    yield conn.channel()
    conn.close()


def node_port(proc: subprocess.Popen[bytes], data_dir: Path, stderr: Path) -> int:
    """The port of the broker ``proc`` once its ``node.json`` names it (a restart rewrites the file);
    its stderr's end if it exits first."""
    info = until(
        lambda: (i := json.loads((data_dir / "node.json").read_text())).get("pid") == proc.pid and i,
        "the broker's node.json",
        ignore=(OSError, json.JSONDecodeError),
        gone=lambda: (
            None
            if proc.poll() is None
            else f"broker exited with {proc.returncode}: {stderr.read_text()[-2000:]}"
        ),
    )
    return int(info["port"])


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
        self.port = node_port(self.proc, self.data_dir, self.dir / "stderr.log")
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


Publisher = Callable[[int], Callable[[int], None]]
"""``port -> publish``: connects to the node; ``publish(i)`` publishes the ``i``-th unit (a message,
a transaction) and returns once the node confirmed or committed it."""


#: A subprocess node's config whose store syncs before it confirms or commits (the crash tests').
SYNC_NODE = """
[node]
port = 0
data_dir = "data"
log_level = "warning"

[store]
flush = "sync"
"""


def kill_mid_stream(
    node: SubprocessNode, publisher: Publisher, at_least: int, what: str
) -> tuple[list[int], list[int]]:
    """SIGKILL ``node`` while ``publisher`` is still going, once ``at_least`` are done (``what``:
    "confirms", "commits"); what was done and what was attempted by then. The publisher ends
    with the connection the kill breaks."""
    done: list[int] = []
    attempted: list[int] = []
    stop = threading.Event()

    def publish() -> None:
        try:
            one = publisher(node.port)
            for i in itertools.takewhile(lambda _: not stop.is_set(), itertools.count()):
                attempted.append(i)
                one(i)
                done.append(i)
        except (pika.exceptions.AMQPError, OSError):
            pass  # the node died under us: whatever was in flight is unknown

    t = threading.Thread(target=publish, daemon=True)
    t.start()
    until(
        lambda: len(done) >= at_least,
        f"{at_least} {what} before the kill",
        gone=lambda: None if t.is_alive() else "the publisher stopped",
    )
    node.kill()
    stop.set()
    t.join(10)
    assert len(done) >= at_least, "publisher made too little progress before the kill"
    return done, attempted


@pytest.fixture
def subprocess_node(tmp_path: Path) -> Iterator[Callable[..., SubprocessNode]]:
    yield from made_and_ended(lambda toml: SubprocessNode(tmp_path, toml), SubprocessNode.kill)


@pytest.fixture
def lazy() -> Iterator[LazyMount]:
    """The project's lazy filesystem (FUSE; unsynced writes dropped on a crash), mounted for one test."""
    reason = fuse_available()
    if reason is not None:
        pytest.skip(f"needs FUSE: {reason}")
    with tempfile.TemporaryDirectory(prefix="lz") as tmp:  # socket paths are limited to 108 bytes
        lz = LazyMount(f"{tmp}/backing", f"{tmp}/mnt", f"{tmp}/ctl.sock")
        with lz:
            yield lz
        assert not is_mounted(lz.mountpoint)
