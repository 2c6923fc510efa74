"""brokerchaos: the harness. Public names for plugin authors: the contract (``harness.spec``), the errors,
and ``exec_output`` (a command in a container, its whole output: use it instead of docker-py's ``exec_run``)."""

from __future__ import annotations

import pluggy

from harness.docker_exec import exec_output
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
    "exec_output",
    "hookimpl",
    "short_error",
    *_spec_all,
]
