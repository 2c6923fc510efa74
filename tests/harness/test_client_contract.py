"""The client factory's keyword options are the contract's ``DriverOptions``, all of them given."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, get_type_hints

import pytest

from harness.host import Host
from harness.scenario import WorkloadSection
from harness.spec.broker import BrokerPlugin
from harness.spec.client import DriverOptions
from harness.workload import driver_options


class StreamBroker(BrokerPlugin):
    name = "stream-broker"
    protocol = "streams"
    client_port = 6379
    data_dir = "/data"
    username = "default"
    password = ""

    def client_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        return {"wait_replicas": settings.get("wait_replicas", 0)}


def test_driver_options_are_every_key_of_the_contract_and_nothing_else() -> None:
    w = WorkloadSection()
    opts = driver_options(w, StreamBroker(), {"wait_replicas": 2}, seed=5, first_node={"p1": "n2"})
    assert set(opts) == set(get_type_hints(DriverOptions)) == set(DriverOptions.__annotations__)
    assert opts["client_settings"] == {"wait_replicas": 2}
    assert opts["queue_arguments"] == {}
    assert (opts["username"], opts["password"], opts["vhost"]) == ("default", "", "/")
    assert opts["first_node"] == {"p1": "n2"} and opts["seed"] == 5 and opts["workload"] is w


def test_a_broker_plugin_hands_its_client_nothing_by_default() -> None:
    assert BrokerPlugin.client_settings(StreamBroker(), {}) == {}  # the base hook
    assert BrokerPlugin.queue_arguments(StreamBroker(), {}) == {}


@pytest.mark.parametrize("protocol", ["amqp091", "nats"])
def test_the_shipped_drivers_accept_every_option(protocol: str) -> None:
    """Each shipped client's driver takes every ``DriverOptions`` key (an unknown keyword would be
    a TypeError at the start of every run of its brokers)."""
    factory = Host.load().client(protocol)
    cls = {"amqp091": "AmqpDriver", "nats": "NatsDriver"}[protocol]
    driver_cls = getattr(inspect.getmodule(factory), cls)
    params = inspect.signature(driver_cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    assert takes_any or set(DriverOptions.__annotations__) <= set(params), set(
        DriverOptions.__annotations__
    ) - set(params)


def test_reconnecting_retries_a_refused_node_and_closes_each_connection() -> None:
    import asyncio
    import itertools

    from harness.spec.client import reconnecting

    opened: list[str] = []
    closed: list[str] = []

    async def connect(node: str) -> str:
        if node == "n2":
            raise ConnectionRefusedError(node)
        opened.append(node)
        return node

    async def close(conn: str) -> None:
        closed.append(conn)

    async def go() -> list[str]:
        stop = asyncio.Event()
        got = []
        conns = reconnecting(
            itertools.cycle(["n1", "n2", "n3"]), connect, close, stop, errors=(OSError,), delay=0
        )
        async for conn in conns:
            got.append(conn)
            if len(got) == 3:
                stop.set()
        return got

    assert asyncio.run(go()) == ["n1", "n3", "n1"]  # n2 refused: skipped, the next node tried
    assert opened == closed == ["n1", "n3", "n1"]
