"""RabbitMQ streams over the stream protocol (broker plugin ``rabbitmq-stream``).

The same Debian package, image and cluster forming as ``rabbitmq`` at 4.3 or 4.0, with the
``rabbitmq_stream`` plugin enabled: the workload speaks the stream protocol (port 5552, client
plugin ``rabbitmq-stream``, ``plugins.rabbitmq.stream_client``) to one replicated stream per
workload queue. A sibling broker, like Valkey beside Redis, because a plugin names one protocol.

Two things keep every byte on the harness's proxies:

- The stream listener advertises the node's name (``stream.advertised_host``) and port 5552; the
  client maps the advertised name to that node's client proxy, so a producer reaches the
  stream's leader (and a reader a given replica) through the node's own client link.
- A stream's replication (osiris) is a TCP connection from the leader's replica reader to a
  port the replica listens on, outside Erlang distribution. The replica tells the leader its
  own addresses and host name, and the leader tries them in order: its container address first,
  which would bypass the proxies. The server's Erlang resolver (``ERL_INETRC``, the server only:
  the CLI tools resolve as before) resolves the node's own name to the address the node has in
  its peers' namespaces (``127.0.0.10 + index``, ``BrokerPlugin.peer_ports``), so the leader
  dials its sidecar's proxy for that replica; and each node listens on a port range of its own
  (``osiris.port_range``), listed as peer ports, so a partition cuts replication too.
"""

from __future__ import annotations

import json
from typing import Any

from harness import (
    BrokerPlugin,
    BrokerVersion,
    ClusterError,
    ImageRecipe,
    NodeHandle,
    NodeInfo,
    NodeSpec,
    ScenarioError,
    run_or_fail,
)
from plugins.rabbitmq import CONF, V4_0, V4_3, RabbitMQ, erlang_binary

STREAM_PORT = 5552
REPLICATION_BASE = 6000
REPLICATION_PORTS = 8  # per node: one per stream replica it hosts (and a few to restart on)
ENABLED_PLUGINS = "/etc/rabbitmq/enabled_plugins"
ADVANCED = "/etc/rabbitmq/advanced.config"
INETRC = "/etc/rabbitmq/brokerchaos-inetrc"


def holdings_expr(vhost: str, stream: str) -> str:
    """An ``eval`` expression printing, as one JSON line, ``[[offset, id], ...]`` of every entry the
    node's own replica of ``stream`` holds (an osiris reader on the local member, from the first
    entry to the committed end); an entry's id is its body up to the first ``|``."""
    return (
        f"{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r({erlang_binary(vhost)}, queue, {erlang_binary(stream)})), "
        "Id = maps:get(name, amqqueue:get_type_state(Q)), "
        "{ok, Pid} = rabbit_stream_coordinator:local_pid(Id), "
        "{ok, R0} = osiris:init_reader(Pid, first, {{brokerchaos, self()}, []}, #{}), "
        "Read = fun Loop(R, Acc) -> case osiris_log:read_chunk_parsed(R) of "
        "{end_of_stream, R1} -> osiris_log:close(R1), lists:reverse(Acc); "
        "{error, E} -> osiris_log:close(R), exit(E); "
        '{Recs, R1} -> Loop(R1, lists:reverse([[O, hd(binary:split(B, <<"|">>))] '
        "|| {O, B} <- Recs, is_binary(B)], Acc)) end end, "
        'io:format("~ts~n", [rabbit_json:encode(Read(R0, []))]).'
    )


def replicas_expr(vhost: str, stream: str) -> str:
    """An ``eval`` expression printing, as one JSON line, the nodes the stream coordinator lists as
    the stream's members (its writer and replicas, running or not: a member that is down is
    listed without a process, and only a removed one is gone)."""
    return (
        f"{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r({erlang_binary(vhost)}, queue, {erlang_binary(stream)})), "
        "{ok, Members} = rabbit_stream_coordinator:members(maps:get(name, amqqueue:get_type_state(Q))), "
        'io:format("~ts~n", [rabbit_json:encode([atom_to_binary(N) || N <- maps:keys(Members)])]).'
    )


def _json_list(out: str, what: str, node: str, stream: str) -> list[Any]:
    """The first line of an ``eval``'s output that is a JSON list (what the expression printed)."""
    for line in out.splitlines():
        if line.startswith("["):
            try:
                got = json.loads(line)
            except ValueError:
                break
            if isinstance(got, list):
                return got
            break
    raise ClusterError(f"{node}: no {what} for stream {stream!r}: {out.strip()[-200:]}")


def parse_replicas(out: str, node: str, stream: str) -> set[str]:
    """``replicas_expr``'s output as node names (``rabbit@n1`` -> ``n1``)."""
    return {str(n).split("@", 1)[-1] for n in _json_list(out, "members", node, stream)}


def parse_holdings(out: str, node: str, stream: str) -> list[tuple[int | None, str]]:
    """``holdings_expr``'s output as (offset, id) pairs, in the copy's order."""
    entries = _json_list(out, "holdings", node, stream)
    try:
        return [(int(o), str(i)) for o, i in entries]
    except (ValueError, TypeError):
        raise ClusterError(f"{node}: no holdings for stream {stream!r}: {out.strip()[-200:]}") from None


def replication_ports(index: int) -> range:
    """The ports node ``index`` (1-based) listens on for its stream replicas."""
    first = REPLICATION_BASE + 10 * index
    return range(first, first + REPLICATION_PORTS)


class RabbitMQStream(RabbitMQ):
    name = "rabbitmq-stream"
    # Streams came with 3.9; offered on 4.3 (sid, Khepri: the default) and 4.0 (trixie, Mnesia by
    # default, Khepri as an opt-in), each on ``rabbitmq``'s image at that version (the stream
    # plugin ships in the package) with its metadata stores.
    versions = tuple(
        BrokerVersion(
            v.name,
            v.suite,
            v.packages,
            v.upstream,
            settings=v.settings,
            note=f"streams over the stream protocol (port 5552); {store}",
        )
        for v, store in ((V4_3, "Khepri"), (V4_0, "Mnesia, or Khepri as an opt-in"))
    )
    protocol = "rabbitmq-stream"
    client_port = STREAM_PORT
    #: A stream is an osiris log per replica (``stream/<stream dir>/``): segment files of
    #: chunks, each with its own CRC, and beside each segment an index of its chunks' offsets.
    #: Only those: a stream node's quorum write-ahead log holds its 5-byte header and no message.
    data_files = {
        "stream-segment": ("*/stream/*/*.segment",),
        "stream-index": ("*/stream/*/*.index",),
    }
    capabilities = RabbitMQ.capabilities - {"mirroring"}

    def message_file_roles(self, settings: Any) -> tuple[str, ...]:
        """The stream's files, whatever the settings (RabbitMQ's own pick is by queue type): a
        stream row runs no other queue."""
        return tuple(sorted(self.data_files))

    features = ()
    settings_schema = {
        k: v
        for k, v in RabbitMQ.settings_schema.items()
        if k in ("partition_handling", "net_ticktime", "metadata_store")
    } | {
        # The stream's replica count (initial cluster size); 0: every node.
        "replicas": (0, int),
    }

    def image(self) -> ImageRecipe:
        """``rabbitmq``'s image at the bound version, byte for byte (the stream plugin ships in the package)."""
        rel = self.release
        assert rel is not None
        return RabbitMQ().at_version(rel.name).image()

    def peer_ports_for(self, index: int) -> tuple[int, ...]:
        return (*super().peer_ports_for(index), *replication_ports(index))

    def node_spec(self, node: NodeInfo) -> NodeSpec:
        base = super().node_spec(node)
        ports = replication_ports(node.index)
        conf = base.files[CONF] + "\n".join(
            [
                f"stream.listeners.tcp.1 = {STREAM_PORT}",
                f"stream.advertised_host = {node.name}",
                f"stream.advertised_port = {STREAM_PORT}",
                "",
            ]
        )
        own = f"127.0.0.{10 + node.index}"  # the node's address in its peers' namespaces, free in its own
        files = {
            **base.files,
            CONF: conf,
            ENABLED_PLUGINS: "[rabbitmq_stream].\n",
            # Both ends inclusive: 4.3.6's osiris listened on the range's last port too.
            ADVANCED: f"[{{osiris, [{{port_range, {{{ports.start}, {ports[-1]}}}}}]}}].\n",
            INETRC: f'{{host, {{{own.replace(".", ",")}}}, ["{node.name}"]}}.\n{{lookup, [file, native]}}.\n',
        }
        # The server resolves its own name to ``own``, where it must also find its epmd.
        env = {**base.env, "BROKERCHAOS_INETRC": INETRC, "BROKERCHAOS_EPMD_ALSO": own}
        return NodeSpec(command=base.command, env=env, files=files)

    def validate_settings(self, settings: Any) -> dict[str, Any]:
        out = BrokerPlugin.validate_settings(self, settings)
        self._check_store(out)
        if out["replicas"] < 0:
            raise ScenarioError(f"broker.settings.replicas: {out['replicas']} is out of range; allowed >= 0")
        if out["net_ticktime"] < 1:
            raise ScenarioError(
                f"broker.settings.net_ticktime: {out['net_ticktime']} is out of range; allowed >= 1"
            )
        return out

    def node_holdings(self, node: NodeHandle, queue: str) -> list[tuple[int | None, str]] | None:
        """What the node's own replica of the stream holds, read on the node by an osiris reader."""
        out = run_or_fail(node, ["rabbitmqctl", "-q", "eval", holdings_expr(self.vhost, queue)], timeout=60)
        return parse_holdings(out, node.name, queue)

    def queue_replicas(self, node: NodeHandle, queue: str) -> set[str] | None:
        """The stream's members as its coordinator lists them, running or not: a node that left
        the cluster lost its replica (the coordinator removes a member on a node no longer in the
        cluster) and gets one again only when one is added (``rabbitmq-streams add_replica``)."""
        out = run_or_fail(node, ["rabbitmqctl", "-q", "eval", replicas_expr(self.vhost, queue)], timeout=60)
        return parse_replicas(out, node.name, queue)

    def confirms_after_sync(self, settings: Any) -> bool | None:
        """No: a stream confirms once a quorum of replicas has written an entry and never fsyncs it
        (RabbitMQ's documentation, "Data Safety when using Streams")."""
        return False

    def client_settings(self, settings: Any) -> dict[str, Any]:
        return {"replicas": settings.get("replicas") or 0}

    def queue_arguments(self, settings: Any) -> dict[str, Any]:
        return {}
