"""The runner: listening, connection tracking, alarms, the control socket, graceful shutdown.

On start the node writes ``<data_dir>/node.json`` (pid, AMQP address, control
address) so the admin CLI and test harnesses can find a node started on port 0.

As with RabbitMQ, the *app* (the broker: its listener, queues, store and
cluster links) can be stopped and started again inside the running node
(``stop_app``, ``start_app``) while the control socket stays, so the operator
can ``reset`` the node's data and ``join_cluster`` in between.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

from broker_impl.broker import Broker
from broker_impl.config import Config
from broker_impl.control import CONTROL_SOCKET, NODE_FILE, dispatch
from broker_impl.errors import BrokerError, cannot_listen
from broker_impl.protocol import AMQPProtocol

log = logging.getLogger("broker_impl.server")


def total_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 1024**3


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class Server:
    """One node. ``await start()``, then ``await serve_forever()`` or ``await stop()``."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.broker = Broker(config)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._control: asyncio.Server | None = None
        self.control_address: str | int = ""
        self._monitor: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._fatal = asyncio.Event()
        self.failure: str | None = None  # why the node stopped itself (a failed fsync), None if it did not
        self._want_listening = True
        self._listener_task: asyncio.Task[None] | None = None
        self.app_running = False
        self._spent = False

    async def start(self) -> None:
        await self.start_app()
        await self._start_control()
        self._write_node_file()

    async def start_app(self) -> str:
        """Start the broker (again): recover from the data dir, open the listener, join the cluster."""
        if self.app_running:
            return "already running"
        if self._spent:
            self.broker = Broker(self.config)  # a stopped app's broker is spent: a new one recovers from disk
            self._spent = False
        # Set before the broker starts: a cluster node that starts paused (pause_minority, no majority
        # visible) closes the listener from the start.
        self._want_listening = True
        self.broker.listener_hook = self.set_listening
        await self.broker.start()
        if self.broker.store is not None:
            self.broker.store.on_failure = self._store_failed
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                lambda: AMQPProtocol(self.broker),
                self.config.host,
                self.port or self.config.port,
                reuse_address=True,
            )
        except OSError as exc:
            port = self.port or self.config.port
            raise cannot_listen("AMQP clients", "node.port", self.config.host, port, exc) from exc
        self.port = self._server.sockets[0].getsockname()[1]
        self._monitor = loop.create_task(self._alarm_monitor())
        self.app_running = True
        # Paused from its start: bound (the port is kept), closed until the node resumes.
        if not self._want_listening:
            self.set_listening(False)
        log.info(
            "node %s listening on %s:%d (flow control %s)",
            self.config.name,
            self.config.host,
            self.port,
            "on" if self.broker.flow_enabled else "off",
        )
        return "started"

    async def stop_app(self, reason: str = "broker app stopped") -> str:
        """Stop the broker but not the node: clients are closed, the store and cluster links go (peers see
        a controlled stop), the control socket stays."""
        if not self.app_running:
            return "already stopped"
        self.app_running = False
        self._spent = True
        self._want_listening = False
        if self._listener_task is not None:
            self._listener_task.cancel()
        if self._server is not None:
            self._server.close()
            self._server = None
        for conn in list(self.broker.connections):
            conn.force_close(reason)
        await asyncio.sleep(0.05)
        for conn in list(self.broker.connections):
            conn.terminate()
        if self._monitor:
            self._monitor.cancel()
        await self.broker.stop()
        log.warning("node %s: app stopped (the node keeps answering its control socket)", self.config.name)
        return "stopped"

    def _write_node_file(self) -> None:
        info = {
            "name": self.config.name,
            "pid": os.getpid(),
            "host": self.config.host,
            "port": self.port,
            "control": self.control_address,
        }
        (self.config.data_dir / NODE_FILE).write_text(json.dumps(info))

    async def _start_control(self) -> None:
        if self.config.control_port:
            try:
                self._control = await asyncio.start_server(
                    self._control_client, "127.0.0.1", self.config.control_port
                )
            except OSError as exc:
                port = self.config.control_port
                raise cannot_listen("the control CLI", "node.control_port", "127.0.0.1", port, exc) from exc
            self.control_address = self._control.sockets[0].getsockname()[1]
        else:
            path = self.config.data_dir / CONTROL_SOCKET
            path.unlink(missing_ok=True)
            self._control = await asyncio.start_unix_server(self._control_client, str(path))
            self.control_address = str(path)

    async def _control_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            try:
                req = json.loads(line)
                result = await dispatch(self, req.get("cmd", ""), req.get("args", {}))
                resp: dict[str, Any] = {"ok": True, "result": result}
            except BrokerError as exc:
                resp = {"ok": False, "error": str(exc)}
            except (ValueError, KeyError, TypeError) as exc:
                resp = {"ok": False, "error": f"bad request: {exc}"}
            writer.write(json.dumps(resp, default=str).encode() + b"\n")
            await writer.drain()
        finally:
            writer.close()

    async def _alarm_monitor(self) -> None:
        f = self.config.flow
        limit = (
            int(f.memory_high_watermark * total_memory())
            if f.memory_high_watermark < 1
            else int(f.memory_high_watermark)
        )
        while True:
            try:
                used = rss_bytes() if f.memory_source == "rss" else self.memory_in_queues()
                self.broker.set_alarm("memory", used > limit)
                self.broker.set_alarm("disk", self.broker.disk_free() < f.disk_free_limit)
            except Exception:
                log.exception("alarm check failed")
            await asyncio.sleep(f.check_interval_ms / 1000)

    def set_listening(self, on: bool) -> None:
        """Close the AMQP listener (a node paused by pause_minority) or open it again on the same port.

        A paused RabbitMQ node stops its app: its listeners go, a client's connect
        is refused at once instead of being accepted and closed, and it comes back
        when the node resumes. The control socket stays (the operator's CLI works).
        """
        self._want_listening = on
        if not self.app_running:
            return  # starting (``start_app`` follows the wish once its listener is bound) or stopped
        if self._listener_task is None or self._listener_task.done():
            self._listener_task = asyncio.get_running_loop().create_task(self._follow_listening())

    async def _follow_listening(self) -> None:
        while (self._server is not None) != self._want_listening and not self._stopped.is_set():
            if not self._want_listening:
                srv, self._server = self._server, None
                assert srv is not None
                srv.close()
                log.warning("AMQP listener on port %d closed (node paused)", self.port)
                continue
            try:
                self._server = await asyncio.get_running_loop().create_server(
                    lambda: AMQPProtocol(self.broker), self.config.host, self.port, reuse_address=True
                )
                log.warning("AMQP listener on port %d open again", self.port)
            except OSError as exc:
                log.error("cannot listen on port %d again (%s); retrying", self.port, exc)
                await asyncio.sleep(1)

    def memory_in_queues(self) -> int:
        return sum(q.bq.ram_bytes() for q in self.broker.all_queues() if q.bq is not None)

    async def stop(self) -> None:
        """Stop accepting, close every connection with 320 CONNECTION_FORCED, flush queues, close the store."""
        await self.stop_app("broker shutdown")
        if self._control is not None:
            self._control.close()
        if isinstance(self.control_address, str) and self.control_address:
            Path(self.control_address).unlink(missing_ok=True)
        (self.config.data_dir / NODE_FILE).unlink(missing_ok=True)
        log.info("node %s stopped", self.config.name)
        self._stopped.set()

    def _store_failed(self, exc: Exception) -> None:
        """The store lost data it was asked to make durable: stop, so a restart recovers from the disk."""
        self.failure = str(exc)
        self._fatal.set()

    async def serve_forever(self) -> None:
        """Run until SIGTERM/SIGINT, or until the store fails (then ``failure`` says why)."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        waits = [loop.create_task(stop.wait()), loop.create_task(self._fatal.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for t in waits:
            t.cancel()
        if self.failure is not None:
            log.critical("node %s stopping: %s", self.config.name, self.failure)
        else:
            log.info("shutdown requested")
        await self.stop()
