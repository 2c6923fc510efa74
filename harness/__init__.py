"""brokerchaos: the harness. Public names for plugin authors."""

from __future__ import annotations

import pluggy

from harness.errors import (
    BrokerChaosError,
    ClusterError,
    DockerUnavailable,
    FaultError,
    PluginError,
    PortInUse,
    ScenarioError,
    short_error,
)
from harness.spec.broker import (
    BrokerPlugin,
    ImageRecipe,
    NodeHandle,
    NodeInfo,
    NodeSpec,
    run_or_fail,
    wait_until_running,
)

hookimpl = pluggy.HookimplMarker("brokerchaos")

__version__ = "0.1.0"

__all__ = [
    "BrokerChaosError",
    "BrokerPlugin",
    "ClusterError",
    "DockerUnavailable",
    "FaultError",
    "ImageRecipe",
    "NodeHandle",
    "NodeInfo",
    "NodeSpec",
    "PluginError",
    "PortInUse",
    "ScenarioError",
    "hookimpl",
    "run_or_fail",
    "short_error",
    "wait_until_running",
]
