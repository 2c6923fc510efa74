"""brokerchaos: the harness. Public names for plugin authors: the contract (``harness.spec``) and the errors."""

from __future__ import annotations

import pluggy

from harness.errors import (
    BrokerChaosError,
    ClusterError,
    DockerUnavailable,
    FaultError,
    NodesDown,
    PluginError,
    PortInUse,
    ScenarioError,
    short_error,
)
from harness.spec import *  # noqa: F403 - the contract, re-exported whole
from harness.spec import __all__ as _spec_all

hookimpl = pluggy.HookimplMarker("brokerchaos")

__version__ = "0.1.0"

__all__ = [
    "BrokerChaosError",
    "ClusterError",
    "DockerUnavailable",
    "FaultError",
    "NodesDown",
    "PluginError",
    "PortInUse",
    "ScenarioError",
    "hookimpl",
    "short_error",
    *_spec_all,
]
