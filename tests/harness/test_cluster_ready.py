"""Readiness and start-up steps run for every node at once (``harness.cluster.each``), without Docker:
the nodes here answer ``running`` and the plugin's ``is_ready`` from this process."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from harness import ClusterError, NodesDown
from harness.cluster import Cluster, each
from harness.host import Host
from harness.spec.broker import NODE_CONTROL
from harness.spec.rundir import NODES
from tests.harness.test_topology import build

GUARD_S = 120.0
"""Only how long a test that fails waits before it says so; nothing here is timed."""


def test_each_returns_every_result_in_the_items_order() -> None:
    assert each(lambda x: x * 2, [3, 1, 2]) == [6, 2, 4]
    assert each(lambda x: x, []) == []


def test_each_runs_the_items_at_once() -> None:
    """The first item can only finish once the last has started: one after the other, it never would."""
    last_started = threading.Event()

    def fn(i: int) -> bool:
        if i == 2:
            last_started.set()
            return True
        return last_started.wait(GUARD_S)

    assert each(fn, [0, 1, 2]) == [True, True, True]


def test_each_raises_the_first_items_error_after_all_have_finished() -> None:
    finished: list[int] = []

    def fn(i: int) -> int:
        if i in (1, 2):
            raise ValueError(f"item {i}")
        finished.append(i)
        return i

    with pytest.raises(ValueError, match="item 1"):
        each(fn, [0, 1, 2, 3])
    assert sorted(finished) == [0, 3]


class Standin:
    """A node as ``wait_ready`` sees it: its container runs or not, and its node init answers
    ``status`` with ``init`` (a broker that runs, unless a test says otherwise)."""

    def __init__(self, name: str, running: bool = True) -> None:
        self.name = name
        self.is_running = running
        self.init: dict[str, Any] = {
            "ok": True,
            "state": "running",
            "last_exit": None,
            "restart_pending": False,
        }
        self.commands: list[list[str]] = []

    def running(self) -> bool:
        return self.is_running

    def exec(self, cmd: Any, timeout: float = 30.0) -> tuple[int, str]:
        self.commands.append(list(cmd))
        assert list(cmd) == [*NODE_CONTROL, "status"], cmd
        return 0, json.dumps(self.init) + "\n"


class Readiness:
    """A plugin's ``is_ready``: n1 answers ready only once n3 has been asked in the same round (so a
    poll of one node after the other would never see n1 ready in its first round), n2 on its second
    question, n3 at once."""

    ready_timeout = GUARD_S

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.lock = threading.Lock()
        self.n3_asked = threading.Event()

    def is_ready(self, node: Any) -> bool:
        with self.lock:
            self.asked.append(node.name)
            n = self.asked.count(node.name)
        if node.name == "n1":
            return n > 1 or self.n3_asked.wait(GUARD_S)
        if node.name == "n3":
            self.n3_asked.set()
            return True
        return n >= 2


def cluster(host: Host, plugin: Any, down: frozenset[str] = frozenset()) -> Cluster:
    topo = build(host.broker("reference"))
    c = Cluster(None, topo, plugin, {})
    c.nodes = {n: Standin(n, n not in down) for n in topo.nodes}  # type: ignore[misc]
    return c


def test_wait_ready_asks_every_pending_node_in_each_round(host: Host) -> None:
    plugin = Readiness()
    cluster(host, plugin).wait_ready()
    # Round one asks all three (n1 and n3 ready), round two asks only n2, which is then ready.
    assert sorted(plugin.asked[:3]) == ["n1", "n2", "n3"]
    assert plugin.asked[3:] == ["n2"]


def test_wait_ready_of_some_nodes_asks_only_those(host: Host) -> None:
    plugin = Readiness()
    cluster(host, plugin).wait_ready(["n2"])
    assert plugin.asked == ["n2", "n2"]


def test_a_node_whose_container_exited_is_an_error_with_its_name(host: Host) -> None:
    c = cluster(host, Readiness(), down=frozenset({"n2"}))
    c.tail_log = lambda name, lines=15: f"(log of {name})"  # type: ignore[method-assign]
    with pytest.raises(ClusterError, match="n2: the broker container exited"):
        c.wait_ready()


class OnlyN3:
    """A plugin whose n3 is ready and whose other nodes never are."""

    ready_timeout = GUARD_S

    def is_ready(self, node: Any) -> bool:
        return bool(node.name == "n3")


def test_every_node_that_does_not_get_ready_is_named_with_why(host: Host) -> None:
    """Past the deadline, each node left is named: one whose container exited and one still not
    ready (the deadline is already over after the first round), while n3 is ready."""
    c = cluster(host, OnlyN3(), down=frozenset({"n2"}))
    c.tail_log = lambda name, lines=15: f"(log of {name})"  # type: ignore[method-assign]
    with pytest.raises(NodesDown) as err:
        c.wait_ready(timeout=1e-9)
    assert sorted(err.value.nodes) == ["n1", "n2"]
    assert err.value.nodes["n1"].startswith("not ready after 0s\nlast log lines:\n(log of n1)")
    assert err.value.nodes["n2"].startswith("the broker container exited\nits log:\n(log of n2)")


class ExitedN2:
    """n1 and n3 are ready at once; n2 is not, and asking it a second time fails the test: its broker
    exited at its start and nothing will start it again, which its first round can already know."""

    ready_timeout = GUARD_S

    def __init__(self) -> None:
        self.asked: list[str] = []

    def is_ready(self, node: Any) -> bool:
        assert node.name not in self.asked, f"{node.name} asked again after its broker had ended"
        self.asked.append(node.name)
        return bool(node.name != "n2")


EXITED = {"code": 1, "at": "2026-11-30T07:09:48+00:00", "pid": 41}


def test_a_node_whose_broker_ended_and_is_not_restarting_is_down_without_waiting_out_the_limit(
    host: Host,
) -> None:
    """A broker that refuses its damaged data exits at start; its node init says so (stopped, its
    last exit, no restart pending). ``wait_ready`` names it with why in its first round instead of
    polling it until ``ready_timeout`` (300 s for RabbitMQ) runs out."""
    plugin = ExitedN2()
    c = cluster(host, plugin)
    c.tail_log = lambda name, lines=15: f"(log of {name})"  # type: ignore[method-assign]
    n2 = c.nodes["n2"]
    assert isinstance(n2, Standin)
    n2.init = {"ok": True, "state": "stopped", "last_exit": EXITED, "restart_pending": False}
    with pytest.raises(NodesDown) as err:
        c.wait_ready()
    assert list(err.value.nodes) == ["n2"]
    assert err.value.nodes["n2"] == (
        "its broker process ended and its node init does not start it again\nits log:\n(log of n2)"
    )
    assert sorted(plugin.asked) == ["n1", "n2", "n3"]


class NotYetN2:
    """n2 answers not ready twice, then ready."""

    ready_timeout = GUARD_S

    def __init__(self) -> None:
        self.asked = 0

    def is_ready(self, node: Any) -> bool:
        self.asked += 1
        return self.asked > 2


@pytest.mark.parametrize(
    "init",
    [
        {
            "ok": True,
            "state": "stopped",
            "last_exit": EXITED,
            "restart_pending": True,
        },  # a crash's timed restart
        {"ok": True, "state": "stopped", "last_exit": None, "restart_pending": False},  # never started yet
        {"ok": True, "state": "running", "last_exit": EXITED, "restart_pending": False},  # started again
        {"ok": True, "state": "paused", "last_exit": None, "restart_pending": False},
        {"ok": False, "error": "connection refused"},  # an init still starting
    ],
)
def test_a_node_whose_broker_may_still_come_back_is_waited_for(host: Host, init: dict[str, Any]) -> None:
    c = cluster(host, NotYetN2())
    n2 = c.nodes["n2"]
    assert isinstance(n2, Standin)
    n2.init = init
    c.wait_ready(["n2"])
    assert n2.commands[0] == [*NODE_CONTROL, "status"]


class Logs:
    """A Docker client whose containers answer ``logs()`` only once every node's broker log has been
    asked for (one node after the other, the first would never be answered)."""

    def __init__(self, nodes: int) -> None:
        self.brokers = threading.Barrier(nodes, timeout=GUARD_S)
        self.containers = self

    def get(self, name: str) -> Any:
        barrier = self.brokers

        class Container:
            def logs(self) -> bytes:
                if name.endswith("-broker"):
                    barrier.wait()
                return f"log of {name}\n".encode()

        return Container()


def test_collect_takes_every_node_s_logs_at_once(host: Host, tmp_path: Any) -> None:
    c = cluster(host, Readiness(), down=frozenset({"n1", "n2", "n3"}))  # stopped: logs only
    for name, node in c.nodes.items():
        node.container_name, node.sidecar_name = f"{name}-broker", name
    c.client = Logs(len(c.nodes))
    c.collect(tmp_path)
    for name in c.nodes:
        assert (tmp_path / NODES / name / "broker.log").read_text() == f"log of {name}-broker\n"
        assert (tmp_path / NODES / name / "toxiproxy.log").read_text() == f"log of {name}\n"
