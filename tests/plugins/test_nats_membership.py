"""The NATS plugin's membership parts that need no Docker: server names and their nodes, the
requests it sends, the NATS protocol lines of ``plugins.nats.sysreq`` on literal bytes, and (where
``nats-server`` is installed) those requests and the drain's per-server views against real
servers on loopback, one of them renamed as a node is when it joins again."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.history import Recorder
from harness.spec import NodeInfo
from plugins.nats import NAME_FILE, SYSTEM_USER, Nats
from plugins.nats.membership import (
    LEADER_JSZ,
    meta_peers,
    name_peers,
    next_server_name,
    peer_id,
    remove_request,
    server_names,
    server_node,
    unnamed_peers,
)
from plugins.nats.sysreq import Parser, ProtocolError, handshake, request, request_lines
from tests.plugins.test_nats_client import QUEUE, Server, _driver
from tests.polling import until
from tests.ports import free_ports

needs_server = pytest.mark.skipif(shutil.which("nats-server") is None, reason="nats-server is not installed")

#: ``meta_cluster`` of a ``leader_only`` JSZ answer of nats-server 2.9.10 (3 servers, n3 rejoined as n3-2).
META = {
    "name": "t",
    "leader": "n2",
    "peer": "44jzkV9D",
    "replicas": [
        {"name": "n1", "current": True, "active": 152484745, "peer": "fjFyEjc1"},
        {"name": "n3-2", "current": False, "offline": True, "active": 3929344873, "peer": "QUVmGLOC"},
    ],
    "cluster_size": 3,
}


def test_server_names_map_back_to_their_node() -> None:
    assert [server_node(s) for s in ("n2", "n2-2", "n12-3", "n1-10")] == ["n2", "n2", "n12", "n1"]
    assert server_node("n2-x") == "n2-x"  # not a generation: left as it is
    assert server_node("-3") == "-3"


def test_a_returning_node_takes_a_name_never_used() -> None:
    assert next_server_name("n2", "n2") == "n2-2"
    assert next_server_name("n2-2", "n2") == "n2-3"
    assert next_server_name("n12-9", "n12") == "n12-10"
    with pytest.raises(ValueError, match="does not belong"):
        next_server_name("n3-2", "n2")


def test_meta_peers_lists_the_leader_and_every_replica_running_or_not() -> None:
    peers = meta_peers(META)
    assert sorted(peers) == ["n1", "n2", "n3-2"]
    assert peers["n2"]["current"] and not peers["n2"]["offline"]
    assert peers["n3-2"]["offline"]
    assert meta_peers({"leader": "n1"}) == {"n1": {"name": "n1", "current": True, "offline": False}}
    assert meta_peers({}) == {}


def test_the_requests_are_what_the_server_parses() -> None:
    assert json.loads(remove_request("n4-2")) == {"peer": "n4-2"}
    subject, body = LEADER_JSZ
    assert subject == "$SYS.REQ.SERVER.PING.JSZ"
    assert json.loads(body) == {"leader_only": True}


def test_protocol_lines() -> None:
    line = handshake("sys", "pw")
    assert line.startswith(b"CONNECT {") and line.endswith(b"}\r\n")
    opts = json.loads(line[len(b"CONNECT ") : -2])
    assert (opts["user"], opts["pass"], opts["verbose"], opts["echo"]) == ("sys", "pw", False, False)
    assert request_lines("$JS.API.SERVER.REMOVE", b'{"peer":"n2"}', "_INBOX.x") == (
        b"SUB _INBOX.x 1\r\nPUB $JS.API.SERVER.REMOVE _INBOX.x 13\r\n" + b'{"peer":"n2"}\r\nPING\r\n'
    )


def test_parser_waits_for_whole_payloads_and_names_every_event() -> None:
    p = Parser()
    assert p.feed(b'INFO {"server_name":"n1"}\r\nPI') == [("info", {"server_name": "n1"})]
    assert p.feed(b'NG\r\n+OK\r\nMSG _INBOX.x 1 11\r\n{"ok') == [("ping",), ("ok",)]
    assert p.feed(b'":true}\r\nPONG\r\n') == [("msg", "_INBOX.x", None, b'{"ok":true}'), ("pong",)]
    assert p.feed(b"MSG a 1 r.1 2\r\nhi\r\n-ERR 'Authorization Violation'\r\n") == [
        ("msg", "a", "r.1", b"hi"),
        ("err", "Authorization Violation"),
    ]
    with pytest.raises(ProtocolError, match="unknown"):
        p.feed(b"HELLO\r\n")


def test_node_spec_names_the_server_from_a_file() -> None:
    plugin = Nats()
    node = NodeInfo(
        name="n2", index=2, peers=("n1", "n3"), cluster="c", settings=plugin.validate_settings({})
    )
    spec = plugin.node_spec(node)
    assert spec.files[NAME_FILE] == "n2"
    config = next(text for path, text in spec.files.items() if path.endswith(".conf.in"))
    assert "server_name: @SERVER_NAME@" in config


@pytest.fixture
def renamed(tmp_path: Path) -> Iterator[list[Server]]:
    """Three servers on loopback, the third named as node n3 is after its first return."""
    ports = free_ports(9)
    routes = ports[3:6]
    names = ["n1", "n2", "n3-2"]
    servers = [
        Server(tmp_path, names[i], ports[i], routes[i], ports[6 + i], [r for r in routes if r != routes[i]])
        for i in range(3)
    ]
    for s in servers:
        s.start()
    try:
        until(
            lambda: all(s.healthy() for s in servers), "the local JetStream cluster to be healthy", every=0.2
        )
        yield servers
    finally:
        for s in servers:
            s.stop()


@needs_server
def test_leader_jsz_and_views_by_node_on_real_servers(renamed: list[Server], tmp_path: Path) -> None:
    user, password = SYSTEM_USER
    subject, body = LEADER_JSZ

    def leader_view() -> dict[str, dict[str, object]] | None:
        got = request(renamed[0].port, user, password, subject, body, wait=2.0)
        return meta_peers(got[0]["data"]["meta_cluster"]) if got else None

    until(lambda: (v := leader_view()) is not None and len(v) == 3, "the meta leader to list 3 peers")
    assert sorted(leader_view() or {}) == ["n1", "n2", "n3-2"]
    with pytest.raises(ProtocolError, match="Authorization"):
        request(renamed[0].port, user, "wrong", subject, body, wait=2.0)

    for s in renamed:  # the driver knows nodes, not servers: n3 is served by n3-2
        s.name = server_node(s.name)
    rec = Recorder(tmp_path / "history.jsonl")
    driver = _driver(renamed, rec)

    async def views() -> dict[str, Any]:
        await driver.setup([QUEUE])
        return await driver.replica_views(QUEUE)

    got = asyncio.run(views())
    rec.close()
    assert sorted(got) == ["n1", "n2", "n3"]
    assert got["n3"]["server"] == "n3-2"
    assert {v["leader"] for v in got.values()} <= {"n1", "n2", "n3"}


def test_a_peer_the_leader_has_not_named_yet_is_told_apart() -> None:
    peers = meta_peers(
        {
            "leader": "n2",
            "replicas": [{"name": "Server name unknown at this time (peerID: fjFyEjc1)"}, {"name": "n3"}],
        }
    )
    assert unnamed_peers(peers) == ["Server name unknown at this time (peerID: fjFyEjc1)"]
    assert unnamed_peers(meta_peers(META)) == []


def test_an_unnamed_peer_is_named_back_by_its_peer_id() -> None:
    # Peer ids nats-server 2.9.10 gave these names (its meta leader's JSZ, loopback cluster).
    assert [peer_id(n) for n in ("n1", "n2", "n3", "n3-2")] == [
        "fjFyEjc1",
        "44jzkV9D",
        "BXScrY9i",
        "QUVmGLOC",
    ]
    unknown = "Server name unknown at this time (peerID: fjFyEjc1)"
    peers = meta_peers(
        {"leader": "n2", "replicas": [{"name": unknown, "peer": "fjFyEjc1"}, {"name": "n3-2"}]}
    )
    named = name_peers(peers, server_names(5, 3))
    assert sorted(named) == ["n1", "n2", "n3-2"] and named["n1"]["unnamed"]
    assert unnamed_peers(name_peers(peers, ["n2", "n3"])) == [unknown]  # no candidate: kept
    assert "n5-3" in server_names(5, 3) and "n5-4" not in server_names(5, 3)
