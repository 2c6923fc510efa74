"""The teardown's removal (``harness.cluster.remove_labelled``) without Docker: a fake engine that
records what was removed when, and answers ``NotFound`` for what another teardown took first."""

from __future__ import annotations

import threading
from typing import Any

import docker.errors

from harness.cluster import DISK_ROLE, DOCKER_CALLS_AT_ONCE, ROLE_LABEL, each, remove_labelled

GUARD_S = 120.0
"""Only how long a test that fails waits before it says so; nothing here is timed."""


class Engine:
    def __init__(self) -> None:
        self.log: list[str] = []
        self.lock = threading.Lock()
        self.brokers_started = threading.Barrier(3, timeout=GUARD_S)

    def note(self, what: str) -> None:
        with self.lock:
            self.log.append(what)


class Container:
    def __init__(self, engine: Engine, name: str, role: str, gone: bool = False) -> None:
        self.engine, self.name, self.gone = engine, name, gone
        self.labels = {ROLE_LABEL: role}
        self.status = "running"

    def stop(self, timeout: int) -> None:
        self.engine.note(f"stop {self.name}")

    def remove(self, force: bool, v: bool) -> None:
        if self.labels[ROLE_LABEL] == "broker":
            self.engine.brokers_started.wait()  # the three brokers' removals are under way at once
        if self.gone:
            raise docker.errors.NotFound("gone")
        self.engine.note(f"remove {self.name}")


class Listed:
    def __init__(self, engine: Engine, kind: str, names: list[str]) -> None:
        self.engine, self.kind, self.names = engine, kind, names

    def list(self, **_: Any) -> list[Any]:
        out = []
        for n in self.names:
            item: Any = type(self.kind, (), {})()
            item.remove = lambda force=False, n=n: self.engine.note(f"remove {self.kind} {n}")
            out.append(item)
        return out


class Client:
    def __init__(self, engine: Engine, containers: list[Container]) -> None:
        self.containers = type("Cs", (), {"list": lambda _self, **_: list(containers)})()
        self.networks = Listed(engine, "network", ["net"])
        self.volumes = Listed(engine, "volume", ["v1", "v2"])


def test_brokers_go_at_once_then_disks_stopped_then_sidecars_then_networks_and_volumes() -> None:
    engine = Engine()
    containers = [
        Container(engine, "n1", "proxy"),
        Container(engine, "n1-broker", "broker"),
        Container(engine, "disk", DISK_ROLE),
        Container(engine, "n2-broker", "broker", gone=True),  # already removed: not counted
        Container(engine, "n3-broker", "broker"),
        Container(engine, "n2", "proxy"),
    ]
    counts = remove_labelled(Client(engine, containers), "run1")
    assert counts == {"containers": 5, "networks": 1, "volumes": 2}
    log = engine.log
    assert set(log[:2]) == {"remove n1-broker", "remove n3-broker"}
    assert log[2:4] == ["stop disk", "remove disk"]
    assert set(log[4:6]) == {"remove n1", "remove n2"}
    assert log[6] == "remove network net"
    assert set(log[7:]) == {"remove volume v1", "remove volume v2"}


def test_each_at_most_takes_any_number_a_few_at_a_time() -> None:
    running, most = [0], [0]
    lock = threading.Lock()

    def fn(i: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        with lock:
            running[0] -= 1
        return i

    items = list(range(3 * DOCKER_CALLS_AT_ONCE))
    assert each(fn, items, DOCKER_CALLS_AT_ONCE) == items
    assert most[0] <= DOCKER_CALLS_AT_ONCE
