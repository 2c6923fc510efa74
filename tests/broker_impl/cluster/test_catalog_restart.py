"""A node that joins again (resuming after ``pause_minority``, its table kept; or losing an autoheal, its
table forgotten) serves only once a peer's records are applied, and what it applies again from the records
keeps working (a delayed exchange keeps its bindings).

Until the awaited peer's records are applied, its queues are what they were
before: a copy it mastered while cut off is still a master here. In
``scenarios/reference-delayed.yaml`` (seeds 16 and 17) n2 resumed after its
isolation, served at once, and its schedule routed due delayed messages into
that stale copy in the 50 ms before the majority's records replaced it: 66
and 67 confirmed delayed messages lost. Joining again means ``joining`` is set
(``ClusterNode.client_refusal``: clients turned away, the schedule holds due
messages) from the restart until those records are applied.

The catalog here is the real one on a real broker (in-process, no cluster);
its links are a recorder.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pamqp import commands

from broker_impl.cluster.catalog import Catalog
from broker_impl.cluster.metadata import Table, key
from tests.broker_impl.conftest import InProcessNode
from tests.polling import until_async


class _Transport:
    peers = ["n1", "n3"]

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def up_peers(self) -> list[str]:
        return list(self.peers)

    def send(self, peer: str, msg: dict[str, Any], blob: bytes = b"") -> bool:
        self.sent.append((peer, msg))
        return True


def _records(me: str, vhost: str) -> dict[str, Any]:
    """A peer's ``meta`` message holding one vhost record."""
    t = Table(me)
    return {"t": "meta", "entries": t.encode({key("vhost", vhost): t.set(key("vhost", vhost), {})})}


async def _scenario(node: InProcessNode, winner: str) -> list[tuple[str, bool, bool]]:
    """Join again awaiting ``winner`` ("*": any peer, as a node resuming after pause_minority, its table kept;
    a peer: as autoheal's loser, its table forgotten); records come from n3 first, then from n1. What
    ``joining`` was."""
    cat = Catalog("n2", _Transport(), node.broker, None, {})  # type: ignore[arg-type]  # no queue records here
    applying = asyncio.get_running_loop().create_task(cat.apply_loop())
    seen: list[tuple[str, bool, bool]] = []
    cat.received("n1", _records("n1", "/"))  # the start: the first peer's records end the join
    await until_async(lambda: not cat.joining, "n2 serving after its start", every=0.005)
    if winner == "*":
        cat.rejoin()  # resuming after pause_minority
    else:
        cat.restart(winner)  # losing an autoheal to n1
    seen.append(("restart", cat.joining, "v3" in node.broker.vhosts))
    cat.received("n3", _records("n3", "v3"))
    seen.append(("n3's records merged", cat.joining, "v3" in node.broker.vhosts))
    if winner != "*":
        await until_async(lambda: "v3" in node.broker.vhosts, "n3's records applied", every=0.005)
        seen.append(("n3's records applied", cat.joining, True))
        cat.received("n1", _records("n1", "v1"))
    await until_async(lambda: not cat.joining, "n2 serving again", every=0.005)
    seen.append(
        ("serving", cat.joining, "v3" in node.broker.vhosts and ("v1" in node.broker.vhosts or winner == "*"))
    )
    applying.cancel()
    await asyncio.gather(applying, return_exceptions=True)
    return seen


def test_after_a_restart_of_the_table_the_node_serves_only_once_the_records_are_applied(
    node: InProcessNode,
) -> None:
    seen = node.call(_scenario(node, "*"))
    assert seen[0] == ("restart", True, False), seen  # before the fix: serving with its stale queues
    assert seen[1] == ("n3's records merged", True, False), seen  # merged, not applied yet
    assert seen[-1] == ("serving", False, True), seen


def test_after_losing_an_autoheal_only_the_winners_records_end_the_join(node: InProcessNode) -> None:
    seen = node.call(_scenario(node, "n1"))
    assert [s[1] for s in seen[:3]] == [True, True, True], seen  # n3's records do not end it
    assert seen[-1] == ("serving", False, True), seen


async def _start_with_a_second_peer_adding_nothing(node: InProcessNode) -> tuple[bool, bool]:
    """At a start: n3's records merged (not applied yet), then n1's, the same ones (nothing new)."""
    cat = Catalog("n2", _Transport(), node.broker, None, {})  # type: ignore[arg-type]
    records = _records("n3", "v3")
    cat.received("n3", records)
    cat.received("n1", records)
    serving_before_applied = not cat.joining and "v3" not in node.broker.vhosts
    applying = asyncio.get_running_loop().create_task(cat.apply_loop())
    await until_async(lambda: not cat.joining, "n2 serving", every=0.005)
    applied_when_serving = "v3" in node.broker.vhosts
    applying.cancel()
    await asyncio.gather(applying, return_exceptions=True)
    return serving_before_applied, applied_when_serving


def test_a_peers_records_that_add_nothing_do_not_end_the_join_before_earlier_ones_are_applied(
    node: InProcessNode,
) -> None:
    """``scenarios/reference-delayed.yaml`` seed 15: n2 restarted after its kill, n3's records (n3 the
    queue's master now) were merged, n1's added nothing and n2 served at once; its schedule routed 14
    recovered delayed messages into its own stale copy in the 28 ms before n3's records dropped it."""
    serving_before_applied, applied_when_serving = node.call(_start_with_a_second_peer_adding_nothing(node))
    assert not serving_before_applied
    assert applied_when_serving


async def _reapplied_delayed_exchange(node: InProcessNode) -> list[str]:
    vh = node.broker.vhosts["/"]
    args = {"x-delayed-type": "direct"}
    vh.declare_exchange("dx", "x-delayed-message", durable=True, arguments=args)
    q = await vh.declare_queue("dq", owner=None, durable=True)
    vh.bind(q, "dx", "k", {})
    cat = Catalog("n2", _Transport(), node.broker, None, {})  # type: ignore[arg-type]
    # the exchange's record applied again (a table restarted after pause_minority or autoheal merges every record)
    record = {"type": "x-delayed-message", "durable": True, "auto_delete": False, "internal": False}
    await cat._apply(["exchange", "/", "dx"], {**record, "arguments": args})
    await cat._apply(["binding", "/", "dx", "dq", "k", "{}"], {"arguments": {}})
    props = commands.Basic.Properties(headers={"x-delay": 1000})
    return [x.name for x in vh.route(vh.exchanges["dx"], "k", props)]


def test_a_delayed_exchange_whose_record_is_applied_again_keeps_routing_to_its_queues(
    node: InProcessNode,
) -> None:
    """``scenarios/reference-delayed.yaml`` seed 16: n3 resumed after its isolation, took the majority's
    records, and from then on every delayed message of its schedule found no queue (66 confirmed ones
    dropped): the new exchange object took the old one's binding table, its underlying router kept an
    empty one of its own."""
    assert node.call(_reapplied_delayed_exchange(node)) == ["dq"]
