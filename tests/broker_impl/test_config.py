"""Config validation: one line naming the key, exit status 2."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from broker_impl.config import ConfigError, load, parse
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]


def _node(cfg: Path) -> subprocess.CompletedProcess[str]:
    """``python -m broker_impl`` on a config that keeps it from starting: it exits on its own."""
    return subprocess.run(
        [sys.executable, "-m", "broker_impl", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )


def test_defaults_are_rabbitmq_defaults() -> None:
    cfg = parse({})
    assert (cfg.port, cfg.frame_max, cfg.channel_max, cfg.heartbeat) == (5672, 131072, 2047, 60)
    assert (cfg.flow.initial, cfg.flow.more_after, cfg.flow.store_initial, cfg.flow.store_more_after) == (
        400,
        200,
        4000,
        800,
    )
    assert [u.name for u in cfg.users] == ["guest"]


def test_example_config_loads() -> None:
    cfg = load(REPO / "plugins/reference/broker.example.toml")
    assert cfg.name == "rabbit@node1"
    assert cfg.store["flush"] == "sync"
    assert cfg.cluster == {}


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"flow": {"initial": 10, "more_after": 11}}, "flow.more_after"),
        ({"flow": {"more_after": -1}}, "flow.more_after"),
        ({"flow": {"store_initial": 100, "store_more_after": 200}}, "flow.store_more_after"),
        ({"node": {"port": 70000}}, "node.port"),
        ({"node": {"port": "x"}}, "node.port"),
        ({"node": {"log_level": "loud"}}, "node.log_level"),
        ({"limits": {"frame_max": 100}}, "limits.frame_max"),
        ({"flow": {"memory_source": "disk"}}, "flow.memory_source"),
        ({"flow": {"enabled": 1}}, "flow.enabled"),
        ({"permissions": [{"user": "u", "vhost": "/", "read": "("}]}, "permissions[0].read"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_values_name_the_key(data: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(data)
    assert str(err.value).startswith(key), str(err.value)
    assert "\n" not in str(err.value)


def test_store_and_cluster_tables_pass_through() -> None:
    cfg = parse({"store": {"flush": "async", "anything": 1}, "cluster": {"peers": ["a", "b"]}})
    assert cfg.store == {"flush": "async", "anything": 1}
    assert cfg.cluster == {"peers": ["a", "b"]}


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ("[flow]\ninitial = 10\nmore_after = 20\n", "flow.more_after"),
        ('[store]\nflush = "sometimes"\n', "flush"),
        ("[node\n", "not valid TOML"),
    ],
)
def test_cli_exits_2_with_one_line(tmp_path: Path, toml: str, needle: str) -> None:
    cfg = tmp_path / "b.toml"
    cfg.write_text(toml)
    proc = _node(cfg)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_example_is_valid_toml() -> None:
    tomllib.loads((REPO / "plugins/reference/broker.example.toml").read_text())


def test_every_key_is_documented() -> None:
    import dataclasses

    import broker_impl.config as config_module
    from broker_impl.config import Config, FlowConfig

    doc = config_module.__doc__ or ""
    names = [f.name for f in dataclasses.fields(Config) if f.name not in ("flow",)]
    names += [f.name for f in dataclasses.fields(FlowConfig)]
    renamed = {
        "name": "name =",
        "data_dir": "data_dir =",
        "users": "[[users]]",
        "permissions": "[[permissions]]",
        "store": "[store]",
        "cluster": "[cluster]",
        "replication": "[replication]",
        "vhosts": "vhosts =",
    }
    missing = [n for n in names if renamed.get(n, f"{n} =") not in doc]
    assert not missing, f"undocumented config keys: {missing}"


@pytest.mark.parametrize("held", ["node.port", "node.control_port", "cluster.port"])
def test_a_port_in_use_names_that_listener_and_its_setting(tmp_path: Path, held: str) -> None:
    """A node has up to four listeners; the line names the one whose port is taken, not the client
    port whatever clashed."""
    ports = {key: free_port() for key in ("node.port", "node.control_port", "cluster.port", "peer")}
    cfg = tmp_path / "b.toml"
    cfg.write_text(
        f'[node]\nname = "n1"\nport = {ports["node.port"]}\ncontrol_port = {ports["node.control_port"]}\n'
        f'data_dir = "{tmp_path / "data"}"\nlog_file = "{tmp_path / "broker.log"}"\n'
        f'[cluster]\nnode = "n1"\nlisten = "127.0.0.1"\nport = {ports["cluster.port"]}\n'
        f'peers = {{ n2 = "127.0.0.1:{ports["peer"]}" }}\n'
    )
    with socket.create_server(("127.0.0.1", ports[held])):
        proc = _node(cfg)
    assert proc.returncode == 1, proc.stderr
    said = [line for line in proc.stderr.splitlines() if line.startswith("broker_impl:")]
    assert len(said) == 1, proc.stderr
    assert f"127.0.0.1:{ports[held]}: address already in use" in said[0], said
    assert f"set another {held}" in said[0], said
