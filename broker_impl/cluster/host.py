"""What the cluster side uses of the node it runs on (``broker_impl.broker.Broker``).

The broker builds its ``ClusterNode``; the parts name the broker by this protocol, not
by its class, so no cluster module imports the broker back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from broker_impl.backing import Store
from broker_impl.client import Client
from broker_impl.config import Permission
from broker_impl.vhost import VHost, VHostOwner


class ClusterHost(VHostOwner, Protocol):
    data_dir: Path
    vhosts: dict[str, VHost]
    users: dict[str, dict[str, Any]]
    permissions: dict[tuple[str, str], Permission]
    policies: dict[tuple[str, str], dict[str, Any]]
    connections: set[Client]
    store: Store | None
    listener_hook: Callable[[bool], None] | None

    def ram_budget(self) -> int: ...
