"""The reference broker (``broker_impl``) as a brokerchaos plugin.

Each node runs ``python3 -m broker_impl --config /etc/brokerchaos/broker.toml``
in the project's Debian image; ``broker_impl`` is copied in as source, its
wheels (pamqp, uvloop) installed offline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness import BrokerPlugin, ImageRecipe, NodeHandle, NodeInfo, NodeSpec, ScenarioError, hookimpl

__version__ = "0.1.0"

REPO = Path(__file__).resolve().parents[2]
CONFIG_PATH = "/etc/brokerchaos/broker.toml"
CONTROL_PORT = 15990


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


class ReferenceBroker(BrokerPlugin):
    name = "reference"
    version = __version__
    protocol = "amqp091"
    capabilities = frozenset({"kill", "pause", "stop", "power-loss", "partition"})
    client_port = 5672
    peer_ports = (25672,)
    data_dir = "/var/lib/brokerchaos/data"
    log_paths = ("/var/log/brokerchaos",)
    ready_timeout = 60.0
    settings_schema = {
        "flush": ("sync", ("sync", "async")),
        "flush_interval_ms": (500, int),
        "segment_bytes": (16 << 20, int),
        "flow": (True, bool),
        "heartbeat": (10, int),
    }

    #: Ranges ``broker_impl`` enforces at start-up, checked here before any container starts.
    RANGES = {"flush_interval_ms": (1, None), "segment_bytes": (4096, None), "heartbeat": (0, 65535)}

    def validate_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        out = super().validate_settings(settings)
        for key, (lo, hi) in self.RANGES.items():
            value = out[key]
            if value < lo or (hi is not None and value > hi):
                allowed = f"from {lo} to {hi}" if hi is not None else f">= {lo}"
                raise ScenarioError(f"broker.settings.{key}: {value} is out of range; allowed {allowed}")
        return out

    def image(self) -> ImageRecipe:
        return ImageRecipe(
            name="brokerchaos/reference",
            python_packages=("pamqp", "uvloop"),
            copy={str(REPO / "broker_impl"): "/opt/brokerchaos/broker_impl"},
        )

    def config_toml(self, node: NodeInfo) -> str:
        s = node.settings
        lines = [
            'vhosts = ["/"]',
            "",
            "[node]",
            f"name = {_toml_value('rabbit@' + node.name)}",
            'host = "0.0.0.0"',
            f"port = {self.client_port}",
            f"data_dir = {_toml_value(self.data_dir)}",
            f"log_file = {_toml_value(f'/var/log/brokerchaos/{node.name}.log')}",
            f"control_port = {CONTROL_PORT}",
            "",
            "[limits]",
            f"heartbeat = {int(s.get('heartbeat', 10))}",
            "",
            "[flow]",
            f"enabled = {_toml_value(bool(s.get('flow', True)))}",
            "",
            "[store]",
            f"flush = {_toml_value(s.get('flush', 'sync'))}",
            f"flush_interval_ms = {int(s.get('flush_interval_ms', 500))}",
            f"segment_bytes = {int(s.get('segment_bytes', 16 << 20))}",
            "",
            "[cluster]",
            f"node = {_toml_value(node.name)}",
            f"peers = [{', '.join(_toml_value(p) for p in node.peers)}]",
            f"port = {self.peer_ports[0]}",
        ]
        return "\n".join(lines) + "\n"

    def node_spec(self, node: NodeInfo) -> NodeSpec:
        return NodeSpec(
            command=["python3", "-m", "broker_impl", "--config", CONFIG_PATH],
            files={CONFIG_PATH: self.config_toml(node)},
        )

    def is_ready(self, node: NodeHandle) -> bool:
        rc, _ = node.exec(["python3", "-m", "broker_impl.ctl", "--config", CONFIG_PATH, "status"], timeout=10)
        return rc == 0

    def form_cluster(self, nodes: Sequence[NodeHandle], settings: Mapping[str, Any]) -> None:
        # Nodes are independent until broker_impl's clustering is configured through [cluster].
        return None


@hookimpl
def brokerchaos_register_brokers(register: Any) -> None:
    register.add_broker(ReferenceBroker())
