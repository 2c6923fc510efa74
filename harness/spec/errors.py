"""The errors a user can cause, each ending in one line that says what to do.

Plugins, faults and checkers raise these (a plugin's bad setting is a ``ScenarioError``, a
fault that cannot be applied a ``FaultError``); the CLI catches ``BrokerChaosError`` and
prints ``brokerchaos: <message>`` with exit status 2; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def one_line(text: str, limit: int) -> str:
    """``text`` on one line (every run of whitespace one space), at most ``limit`` characters: a
    longer text keeps its head and its tail around `` … ``, because an error's cause may be
    either (what failed leads; a command's output ends with its last word on why)."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    head = (limit - 3) // 2
    return f"{flat[:head].rstrip()} … {flat[-(limit - 3 - head) :].lstrip()}"


class BrokerChaosError(Exception):
    """Base of every error the harness reports as one line."""


class PluginError(BrokerChaosError):
    """A plugin failed to import, broke the hook spec, or declared something inconsistent."""

    def __init__(self, plugin: str, reason: str) -> None:
        super().__init__(f"plugin {plugin!r}: {reason}")
        self.plugin = plugin
        self.reason = reason


class ScenarioError(BrokerChaosError):
    """A scenario file is missing, unreadable or invalid; names the field and the allowed values."""


class DockerUnavailable(BrokerChaosError):
    """The Docker engine cannot be reached."""


class PortInUse(BrokerChaosError):
    """A port the harness must bind is taken."""


class ImageError(BrokerChaosError):
    """An image could not be built."""


class ClusterError(BrokerChaosError):
    """A cluster did not start or did not become ready in time."""


class NodesDown(ClusterError):
    """Nodes whose broker did not start, or did not become ready within the broker plugin's
    ``ready_timeout``: ``nodes`` gives each one's reason (its exit, its last log lines). At the
    cluster's start it ends the run; at the final heal it is the run's outcome for those nodes
    (the history's final ``heal``, ``harness.spec.history``), and the run drains through the rest.
    ``done``: what the heal that raised it did all the same (on the other nodes, of other kinds)."""

    def __init__(self, nodes: Mapping[str, str], done: Mapping[str, Any] | None = None) -> None:
        self.nodes = dict(sorted(nodes.items()))
        self.done = dict(done or {})
        super().__init__("; ".join(f"{n}: {why}" for n, why in self.nodes.items()))


class ConfigError(BrokerChaosError):
    """A plugin cannot accept a setting of the command line (``brokerchaos_configure``)."""


class FaultError(BrokerChaosError):
    """A fault could not be applied (unsupported capability, bad parameters)."""
