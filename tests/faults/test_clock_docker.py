"""Clock faults seen by the broker itself: the reference broker's log timestamps (its own
``time.time()``) move by the offset a fault writes, change while it runs, and come back."""

from __future__ import annotations

import datetime
import random
import re
import time

import pytest

from faults.clock import ClockBump, ClockSkew, ClockStrobe, _ClockFault, read_offset
from harness.spec import FaultContext
from tests.faults.docker_cluster import running_cluster

pytestmark = pytest.mark.docker

OPENED = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO broker_impl\.connection: connection \S+ opened"
)


@pytest.fixture(scope="module")
def cluster():
    with running_cluster("reference", "clock", 1, faketime=True) as c:
        yield c


def broker_offset(cluster) -> float:
    """How far the broker's clock is from the real one: it logs each AMQP connection it opens
    with its own time; the real time is taken around the connection."""
    import pika

    host, port = cluster.client_endpoints()["n1"]
    before = len(cluster.nodes["n1"].container.logs().splitlines())
    t0 = time.time()
    pika.BlockingConnection(pika.ConnectionParameters(host, port, connection_attempts=3)).close()
    t1 = time.time()
    for _ in range(50):  # the log line may reach the container log a moment after the close
        lines = cluster.nodes["n1"].container.logs().decode(errors="replace").splitlines()[before:]
        stamps = [m.group(1) for m in map(OPENED.match, lines) if m]
        if stamps:
            logged = datetime.datetime.strptime(stamps[-1], "%Y-%m-%d %H:%M:%S,%f").replace(
                tzinfo=datetime.UTC
            )
            return logged.timestamp() - (t0 + t1) / 2
        time.sleep(0.1)
    raise AssertionError("the broker logged no connection")


def settled_offset(cluster, want: float, tolerance: float = 1.0) -> float:
    """The broker's offset once it re-read the control file (at most a second after a change)."""
    seen = broker_offset(cluster)
    for _ in range(10):
        if abs(seen - want) <= tolerance:
            break
        time.sleep(0.3)
        seen = broker_offset(cluster)
    return seen


def test_skew_bump_strobe_reach_the_broker_and_heal(cluster) -> None:
    ctx = FaultContext(cluster)
    nodes = list(cluster.topology.nodes)
    assert abs(settled_offset(cluster, 0.0)) <= 1.0, "the fake clock starts true"

    skew = ClockSkew(ctx, ClockSkew.resolve({"node": "n1", "offset": 3600}, nodes, random.Random(1)), "f1")
    assert skew.apply()["set"]["offset"] == "+3600"
    assert abs(settled_offset(cluster, 3600.0) - 3600.0) <= 1.0
    skew.heal()
    assert abs(settled_offset(cluster, 0.0)) <= 1.0

    # Bumps add up and stay after their heal; the final heal sets the clock right.
    for delta in (-120.0, -30.5):
        bump = ClockBump(ctx, {"node": "n1", "delta": delta}, "f2")
        bump.apply()
        bump.heal()
    assert read_offset(ctx, "n1") == -150.5
    assert abs(settled_offset(cluster, -150.5) + 150.5) <= 1.0

    # A strobe flips the broker's clock while it runs (seen from the broker), then ends true.
    strobe = ClockStrobe(
        ctx,
        ClockStrobe.resolve(
            {"node": "n1", "a": 0, "b": 600, "period": 1, "duration": 30}, nodes, random.Random(2)
        ),
        "f3",
    )
    strobe.apply()
    seen = set()
    for _ in range(40):
        seen.add(round(broker_offset(cluster) / 600))  # 0 or 1
        if seen == {0, 1}:
            break
        time.sleep(0.2)
    assert seen == {0, 1}, seen
    done = _ClockFault.heal_all(ctx)
    assert done is not None and done["n1"]["offset"] == "+0" and done["n1"].get("stopped_strobe")
    assert abs(settled_offset(cluster, 0.0)) <= 1.0
    assert _ClockFault.heal_all(ctx) is not None  # idempotent: the clock is already right
    assert read_offset(ctx, "n1") == 0.0
