"""A minimal broker plugin the fixture modules subclass; registering it needs no Docker."""

from __future__ import annotations

from harness import BrokerPlugin


class FixtureBroker(BrokerPlugin):
    name = "fixture"
    capabilities = frozenset({"kill", "partition"})
    client_port = 5999
    peer_ports = (26000,)
    data_dir = "/var/lib/fixture"
