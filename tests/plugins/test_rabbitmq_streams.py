"""The RabbitMQ stream plugin's pure parts: settings, the node's stream listener and replication
ports, and the workload features a stream refuses."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from rstream import exceptions as rexc
from rstream import schema
from rstream.constants import OffsetType

from harness.errors import ClusterError, ScenarioError
from harness.history import Recorder, read_jsonl
from harness.spec import Endpoint, NoCopy
from harness.spec.broker import NodeInfo
from harness.spec.scenario import ConsumerSection, DelaySection, WorkloadSection
from plugins.rabbitmq import CONF, START_SCRIPT, RabbitMQ, stream_client
from plugins.rabbitmq.stream_client import (
    REFERENCE,
    SUBSCRIPTION_ID,
    StreamDriver,
    _Conn,
    _Subscription,
    entry_id,
    refuse_unsupported,
    resume_spec,
    sac_properties,
)
from plugins.rabbitmq.streams import (
    ADVANCED,
    ENABLED_PLUGINS,
    INETRC,
    RabbitMQStream,
    holdings_expr,
    parse_holdings,
    parse_replicas,
    replicas_expr,
    replication_ports,
)
from tests.polling import until_async

RS = RabbitMQStream()


def node(index: int) -> NodeInfo:
    names = ("n1", "n2", "n3")
    return NodeInfo(
        name=names[index - 1],
        index=index,
        peers=tuple(n for n in names if n != names[index - 1]),
        cluster="c1",
        settings=RS.validate_settings({}),
    )


def test_a_sibling_of_rabbitmq_4_x_on_its_image() -> None:
    assert RS.protocol == "rabbitmq-stream" and RS.client_port == 5552
    assert [v.name for v in RS.versions] == ["4.3", "4.0"] and not RS.mirroring
    assert RS.image() == RabbitMQ().at_version("4.3").image()
    for name in ("4.3", "4.0"):  # each version on rabbitmq's image at that version, never mirrored
        bound = RS.at_version(name)
        assert isinstance(bound, RabbitMQStream)
        assert bound.image() == RabbitMQ().at_version(name).image() and not bound.mirroring
    assert RS.at_version("4.0").image() != RS.image()
    notes = {v.name: v.note for v in RS.versions}  # the metadata store each runs on here
    assert notes["4.0"].endswith("Mnesia, or Khepri as an opt-in") and notes["4.3"].endswith("Khepri")
    with pytest.raises(ScenarioError, match="use one of 4.3, 4.0"):
        RS.at_version("3.10")  # no streams on 3.10 here
    assert RS.confirms_after_sync(RS.validate_settings({})) is False  # streams never fsync


def test_settings() -> None:
    assert RS.validate_settings({}) == {
        "partition_handling": "pause_minority",
        "net_ticktime": 10,
        "metadata_store": "khepri",
        "replicas": 0,
    }
    on_40 = RS.at_version("4.0")
    assert on_40.validate_settings({})["metadata_store"] == "mnesia"
    assert on_40.validate_settings({"metadata_store": "khepri"})["metadata_store"] == "khepri"
    assert RS.client_settings(RS.validate_settings({"replicas": 2})) == {"replicas": 2}


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        ({"replicas": -1}, "broker.settings.replicas"),
        ({"queue_type": "quorum"}, "broker.settings.queue_type: unknown setting"),
        ({"ha_mode": "all"}, "broker.settings.ha_mode: unknown setting"),
        ({"net_ticktime": 0}, "broker.settings.net_ticktime"),
        (
            {"metadata_store": "mnesia"},
            'RabbitMQ 4.3 runs on Khepri here; for Mnesia use broker.version "4.0"',
        ),
    ],
)
def test_settings_refused(given: dict[str, Any], needle: str) -> None:
    with pytest.raises(ScenarioError, match=needle):
        RS.validate_settings(given)


def test_node_spec_enables_the_stream_plugin_and_keeps_replication_on_the_proxies() -> None:
    spec = RS.node_spec(node(2))
    conf = spec.files[CONF]
    assert "stream.listeners.tcp.1 = 5552" in conf and "stream.advertised_host = n2" in conf
    assert "listeners.tcp.default = 5672" in conf  # RabbitMQ's own settings are kept
    assert spec.files[ENABLED_PLUGINS] == "[rabbitmq_stream].\n"
    assert "{port_range, {6020, 6027}}" in spec.files[ADVANCED]  # every port of it proxied
    assert '{host, {127,0,0,12}, ["n2"]}' in spec.files[INETRC]  # n2 as its peers reach it
    assert spec.env["BROKERCHAOS_INETRC"] == INETRC and "ERL_INETRC" not in spec.env  # the server only
    assert 'ERL_INETRC="$BROKERCHAOS_INETRC"' in spec.files[START_SCRIPT]


def test_each_node_replicates_on_ports_of_its_own() -> None:
    ports = [set(RS.peer_ports_for(i)) - {4369} for i in (1, 2, 3)]
    assert not (ports[0] & ports[1]) and not (ports[1] & ports[2]) and not (ports[0] & ports[2])
    assert set(replication_ports(3)) <= set(RS.peer_ports_for(3))


@pytest.mark.parametrize(
    ("workload", "needle"),
    [
        (WorkloadSection(delay=DelaySection()), "workload.delay"),
        (WorkloadSection(ttl_ms=100), "workload.ttl_ms"),
        (WorkloadSection(consumer=ConsumerSection(requeue=0.1)), "workload.consumer.requeue"),
        (WorkloadSection(consumer=ConsumerSection(crash_every=5)), "workload.consumer.crash_every"),
    ],
)
def test_what_a_stream_cannot_do_is_refused(workload: WorkloadSection, needle: str) -> None:
    with pytest.raises(ScenarioError, match=needle):
        refuse_unsupported(workload)


def test_entry_id_is_the_head_of_the_body() -> None:
    assert entry_id(b"p1:7|abc|payload") == "p1:7"


def test_holdings_read_the_local_replica_by_name() -> None:
    expr = holdings_expr("/", "chaos-1")
    assert '<<"chaos-1"/utf8>>' in expr and "rabbit_stream_coordinator:local_pid" in expr
    assert "osiris:init_reader(Pid, first" in expr


def test_holdings_parse_the_json_line() -> None:
    out = '[[0,"p2:1"],[1,"p1:1"],[5,"p2:2"]]\nok\n'
    assert parse_holdings(out, "n1", "chaos-1") == [(0, "p2:1"), (1, "p1:1"), (5, "p2:2")]
    assert parse_holdings("[]\n", "n1", "chaos-1") == []
    with pytest.raises(ClusterError, match="n1: no holdings for stream 'chaos-1'"):
        parse_holdings("Error: {badmatch,{error,not_found}}", "n1", "chaos-1")


def test_replicas_are_the_stream_coordinator_s_members_by_node() -> None:
    expr = replicas_expr("/", "chaos-1")
    assert '<<"chaos-1"/utf8>>' in expr and "rabbit_stream_coordinator:members(" in expr
    assert parse_replicas('["rabbit@n1","rabbit@n2"]\nok\n', "n1", "chaos-1") == {"n1", "n2"}
    with pytest.raises(ClusterError, match="n1: no members for stream 'chaos-1'"):
        parse_replicas("Error: {badmatch,{error,not_found}}", "n1", "chaos-1")


# -- single active consumer ---------------------------------------------------------------------


class FakeClient:
    """The slice of rstream's ``Client`` a subscription uses, answering from ``stored``."""

    def __init__(self, stored: int | None) -> None:
        self.stored = stored
        self.handlers: dict[Any, Any] = {}
        self.subscribed: list[dict[str, Any]] = []
        self.updates: list[tuple[int, int, int]] = []  # (correlation id, offset type, offset)
        self.stores: list[int] = []

    def add_handler(self, frame_cls: Any, handler: Any, name: str) -> None:
        self.handlers[frame_cls] = handler

    async def run_queue_listener_task(self, subscriber_id: int, handler: Any) -> None:
        return None

    async def subscribe(self, stream: str, subscription_id: int, spec: Any, **kw: Any) -> None:
        self.subscribed.append({"stream": stream, "spec": spec, **kw})

    async def credit(self, subscription_id: int, credit: int) -> None:
        return None

    async def query_offset(self, stream: str, reference: str) -> int:
        assert reference == REFERENCE
        if self.stored is None:
            raise rexc.OffsetNotFound("no offset")
        return self.stored

    async def store_offset(self, stream: str, reference: str, offset: int) -> None:
        self.stores.append(offset)
        self.stored = offset

    async def consumer_update(self, correlation_id: int, spec: Any) -> None:
        self.updates.append((correlation_id, spec.offset_type, spec.offset))

    def is_connection_alive(self) -> bool:
        return True


def _driver(tmp_path: Path, consumers: int = 2) -> tuple[StreamDriver, Recorder]:
    rec = Recorder(tmp_path / "h.jsonl")
    w = WorkloadSection(consumers=consumers, message_size=64)
    return StreamDriver({n: Endpoint(n, "127.0.0.1", 1) for n in ("n1", "n2")}, rec, workload=w), rec


def _body(msg_id: str) -> bytes:
    return f"{msg_id}|x|payload".encode()


def test_the_shared_workload_s_consumers_are_accepted() -> None:
    refuse_unsupported(WorkloadSection(consumers=2, readers=1))  # one single-active-consumer group


def test_a_consumer_joins_its_group_by_name() -> None:
    assert sac_properties("brokerchaos") == {"single-active-consumer": "true", "name": "brokerchaos"}
    first, after = resume_spec(None), resume_spec(41)
    assert (first.offset_type, first.offset) == (OffsetType.FIRST, 0)
    assert (after.offset_type, after.offset) == (OffsetType.OFFSET, 42)


def _activate(sub: _Subscription, client: FakeClient, correlation_id: int = 7) -> None:
    frame = schema.ConsumerUpdateResponse(
        correlation_id=correlation_id, subscription_id=SUBSCRIPTION_ID, active=1
    )
    client.handlers[schema.ConsumerUpdateResponse](frame)


def test_nothing_is_read_before_activation_then_reading_resumes_after_the_stored_offset(
    tmp_path: Path,
) -> None:
    driver, rec = _driver(tmp_path)
    client = FakeClient(stored=41)

    async def scenario() -> list[tuple[int, bytes]]:
        conn = _Conn("n2", client, asyncio.Event())  # type: ignore[arg-type]
        sub = _Subscription(conn, None, group=REFERENCE)
        sub.activation = lambda: driver._activated(conn, "c2", "q")
        await sub.open("q")
        assert client.subscribed[0]["properties"] == sac_properties(REFERENCE)
        assert not sub.active and client.updates == []  # a standby: no answer, no entries
        _activate(sub, client)
        await until_async(lambda: sub.active, "the activation answered")
        # The chunk began before the stored offset: what precedes the resume point is not an entry read.
        deliver = schema.Deliver(
            subscription_id=SUBSCRIPTION_ID, magic_version=0, chunk_type=0, num_entries=3,
            num_records=3, timestamp=0, epoch=1, chunk_first_offset=41, chunk_crc=0, data_length=0,
            trailer_length=0, _reserved=0, data=b"",
        )  # fmt: skip
        deliver.get_messages = lambda: [_body("p1:1"), _body("p1:2"), _body("p1:3")]  # type: ignore[method-assign]
        await sub._on_deliver(deliver)
        return await sub.batch(1.0)

    got = asyncio.run(scenario())
    rec.close()
    assert client.updates == [(7, OffsetType.OFFSET, 42)]  # answered: start after the stored offset
    assert [o for o, _ in got] == [42, 43]
    seeks = [r for r in read_jsonl(tmp_path / "h.jsonl") if r["f"] == "seek" and r["type"] == "ok"]
    assert [(r["process"], r["node"], json.loads(r["detail"])) for r in seeks] == [
        ("c2", "n2", {"stream_seq": 42, "stored_offset": 41, "single_active": REFERENCE})
    ]


def test_a_first_activation_with_nothing_stored_starts_at_the_first_entry_and_seeks_nowhere(
    tmp_path: Path,
) -> None:
    driver, rec = _driver(tmp_path)
    client = FakeClient(stored=None)

    async def scenario() -> _Subscription:
        conn = _Conn("n1", client, asyncio.Event())  # type: ignore[arg-type]
        sub = _Subscription(conn, None, group=REFERENCE)
        sub.activation = lambda: driver._activated(conn, "c1", "q")
        await sub.open("q")
        _activate(sub, client, correlation_id=3)
        await until_async(lambda: sub.active, "the activation answered")
        return sub

    sub = asyncio.run(scenario())
    rec.close()
    assert client.updates == [(3, OffsetType.FIRST, 0)] and sub.start is None
    assert not [r for r in read_jsonl(tmp_path / "h.jsonl") if r["f"] == "seek"]


def test_an_activation_whose_stored_offset_cannot_be_asked_drops_the_connection(tmp_path: Path) -> None:
    driver, rec = _driver(tmp_path)

    class Unanswering(FakeClient):
        async def query_offset(self, stream: str, reference: str) -> int:
            raise ConnectionError("gone")

    client = Unanswering(stored=5)

    async def scenario() -> _Conn:
        conn = _Conn("n1", client, asyncio.Event())  # type: ignore[arg-type]
        sub = _Subscription(conn, None, group=REFERENCE)
        sub.activation = lambda: driver._activated(conn, "c1", "q")
        await sub.open("q")
        _activate(sub, client)
        await until_async(conn.closed.is_set, "the connection dropped")
        return conn

    conn = asyncio.run(scenario())
    rec.close()
    assert not conn.alive and client.updates == []  # never told the broker where to start


def test_what_a_takeover_reads_again_is_marked_redelivered(tmp_path: Path) -> None:
    """c1 was sent offsets 0-2 but its group stored none; c2, activated, reads them again: the
    same ids at the same offsets, flagged as redeliveries (the checkers count them as duplicates
    or unconfirmed acks, never as loss)."""
    driver, rec = _driver(tmp_path)
    batch = [(offset, _body(f"p1:{offset + 1}")) for offset in range(3)]
    driver._consumed("c1", "n1", "q", batch)
    driver._consumed("c2", "n2", "q", batch)
    rec.close()
    rows = [r for r in read_jsonl(tmp_path / "h.jsonl") if r["f"] == "consume" and r["type"] == "ok"]
    assert [(r["process"], r["value"], r["redelivered"]) for r in rows] == [
        ("c1", "p1:1", False), ("c1", "p1:2", False), ("c1", "p1:3", False),
        ("c2", "p1:1", True), ("c2", "p1:2", True), ("c2", "p1:3", True),
    ]  # fmt: skip


# -- a chunk the client rejects ---------------------------------------------------------------


def test_a_copy_the_client_stops_reading_on_a_bad_chunk_names_why_in_the_drain(tmp_path: Path) -> None:
    """rstream's frame reader ends on a chunk whose CRC does not match (``ValueError: Invalid
    checksum``) and leaves the connection looking alive: the drain read nothing more from that
    node and recorded its copy as whole, with no error. The node's copy ends there however often
    it is visited, so the drain keeps what came before the bad chunk and says why it stopped."""
    driver, rec = _driver(tmp_path)
    driver.w = WorkloadSection(consumers=2, message_size=64, drain_idle=30)

    async def rejected() -> None:
        try:
            raise ValueError("Invalid checksum")  # rstream's Deliver checks the chunk's CRC as it decodes it
        except ValueError as e:
            raise ValueError("Could not decode <class 'rstream.schema.Deliver'>") from e

    async def scenario() -> tuple[bool, _Conn, Any]:
        client = FakeClient(stored=None)
        client._tasks = {}  # type: ignore[attr-defined]
        conn = _Conn("n2", client, asyncio.Event())  # type: ignore[arg-type]
        drain = driver.drain_reader("d1", "q")
        reading = asyncio.ensure_future(drain._read_all(conn, drain.node_views["n2"]))
        await until_async(lambda: schema.Deliver in client.handlers, "the drain subscribed")
        deliver = schema.Deliver(
            subscription_id=SUBSCRIPTION_ID, magic_version=0, chunk_type=0, num_entries=2,
            num_records=2, timestamp=0, epoch=1, chunk_first_offset=0, chunk_crc=0, data_length=0,
            trailer_length=0, _reserved=0, data=b"",
        )  # fmt: skip
        deliver.get_messages = lambda: [_body("p1:1"), _body("p1:2")]  # type: ignore[method-assign]
        await client.handlers[schema.Deliver](deliver)
        task = asyncio.ensure_future(rejected())  # the next chunk: the frame reader ends on it
        await asyncio.gather(task, return_exceptions=True)
        client._tasks["listener"] = task  # type: ignore[attr-defined]
        async with asyncio.timeout(10):
            empty = await reading
        return empty, conn, drain.node_views["n2"]

    empty, conn, view = asyncio.run(scenario())
    rec.close()
    assert not conn.alive
    assert "Invalid checksum" in (conn.reader_failure() or "")
    # What it read before the bad chunk is the node's copy, kept for the replica comparison.
    assert empty and view.empty_at_ns is not None
    assert (view.entries, view.first_seq, view.last_seq) == (2, 0, 1)
    assert view.error is not None and "Invalid checksum" in view.error


# -- a node that holds no replica -------------------------------------------------------------


class NotAvailable(FakeClient):
    """A node that serves no read of the stream: its subscribe answers ``STREAM_NOT_AVAILABLE``."""

    async def subscribe(self, stream: str, subscription_id: int, spec: Any, **kw: Any) -> None:
        raise rexc.StreamNotAvailable("stream not available")

    async def close(self) -> None:
        return None


class NoAnswer(NotAvailable):
    """A node that does not answer the subscribe at all (seen on RabbitMQ 4.3 from a node that
    joined again after its replica was removed)."""

    async def subscribe(self, stream: str, subscription_id: int, spec: Any, **kw: Any) -> None:
        await asyncio.Event().wait()


def _visit_n3(
    tmp_path: Path, replicas: set[str] | None | Exception, client: type[FakeClient] = NotAvailable
) -> tuple[Any, list[str], Any]:
    """The drain's visit of n3, whose subscribe is refused, with the broker naming ``replicas``."""
    rec = Recorder(tmp_path / "h.jsonl")
    asked: list[str] = []

    async def queue_replicas(node: str, queue: str) -> set[str] | None:
        asked.append(node)
        if isinstance(replicas, Exception):
            raise replicas
        return replicas

    endpoints = {n: Endpoint(n, "127.0.0.1", 1) for n in ("n1", "n2", "n3")}
    driver = StreamDriver(
        endpoints, rec, workload=WorkloadSection(consumers=2), queue_replicas=queue_replicas
    )

    async def connect(node: str) -> _Conn:
        fake = client(stored=None)
        fake._tasks = {}  # type: ignore[attr-defined]
        return _Conn(node, fake, asyncio.Event())  # type: ignore[arg-type]

    driver.connect = connect  # type: ignore[method-assign]
    drain = driver.drain_reader("d1", "chaos-1")
    got = asyncio.run(drain.visit("n3", lambda: 60.0))
    rec.close()
    return got, asked, drain.node_views["n3"]


def test_a_node_the_broker_names_no_replica_on_holds_no_copy_to_drain(tmp_path: Path) -> None:
    """n3 left the cluster (the stream coordinator removed its replica) and joined again empty: the
    stream's members are n1 and n2. The drain leaves n3 out instead of asking it for a copy until
    its time runs out (which graded the run UNAVAILABLE: n3's copy "never came back")."""
    got, asked, view = _visit_n3(tmp_path, {"n1", "n2"})
    assert asked == ["n1"]  # another node first: the one that joined again may not answer
    assert isinstance(got, NoCopy)
    assert got.why == (
        "StreamNotAvailable: stream not available; the broker names no replica of the stream here "
        "(its replicas: n1, n2)"
    )
    assert view.error is None


@pytest.mark.parametrize(
    "replicas",
    [{"n1", "n2", "n3"}, None, ClusterError("n3: rabbitmqctl -q eval … exited 69")],
    ids=["a replica that does not answer", "the broker cannot tell", "the ask failed"],
)
def test_a_replica_that_does_not_answer_is_still_waited_for(
    tmp_path: Path, replicas: set[str] | None | Exception
) -> None:
    got, asked, view = _visit_n3(tmp_path, replicas)
    assert got is False
    assert view.error is not None and view.error.startswith("StreamNotAvailable: stream not available")
    if isinstance(replicas, Exception):  # every node asked, each failure said
        assert asked == ["n1", "n2", "n3"] and view.error.count("exited 69") == 3


def test_a_node_that_does_not_answer_the_subscribe_and_holds_no_replica_holds_no_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same node may not answer the subscribe at all: what it said is the subscribe's own
    time-out, not the drain's, and the broker's members decide as for a refusal."""
    monkeypatch.setattr(stream_client, "OP_TIMEOUT", 0.01)
    got, asked, _view = _visit_n3(tmp_path, {"n1", "n2"}, NoAnswer)
    assert asked == ["n1"] and isinstance(got, NoCopy)
    assert got.why.startswith("no answer within 0.01s; the broker names no replica of the stream here")
    got, _asked, view = _visit_n3(tmp_path, {"n1", "n2", "n3"}, NoAnswer)
    assert got is False and view.error == "no answer within 0.01s"
