"""A deliberately broken broker plugin for the conformance kit's tests.

It runs the reference broker unchanged but declares a data directory the broker
never writes to (``/var/lib/not-used``): kill, power loss and the data-directory
listing all act on a directory that stays empty. ``brokerchaos validate`` must say so.

    PYTHONPATH=. brokerchaos -p tests.conformance.broken_plugin validate --plugin broken-datadir
"""

from __future__ import annotations

from typing import Any

from harness import NodeInfo, hookimpl
from plugins.reference import ReferenceBroker


class UnusedDataDirBroker(ReferenceBroker):
    name = "broken-datadir"
    data_dir = "/var/lib/not-used"

    def config_toml(self, node: NodeInfo) -> str:
        # The broker keeps storing where the reference plugin points it.
        return (
            super()
            .config_toml(node)
            .replace(f'data_dir = "{self.data_dir}"', f'data_dir = "{ReferenceBroker.data_dir}"')
        )


class BadPortBroker(ReferenceBroker):
    """Declares a client port no TCP socket can have: a contract error found before Docker."""

    name = "broken-port"
    client_port = 70000


@hookimpl
def brokerchaos_register_brokers(register: Any) -> None:
    register.add_broker(UnusedDataDirBroker())
    register.add_broker(BadPortBroker())
