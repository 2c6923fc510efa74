"""Partition handling, as RabbitMQ's modes (``[cluster] partition_handling``).

* ``ignore``: both sides go on; on heal the metadata merge keeps one master
  per queue (the later record) and the other copy is dropped with its messages.
* ``pause_minority``: a node that sees at most half the cluster stops serving
  as a paused RabbitMQ node does: its AMQP listener closes, its client
  connections are closed, it promotes nothing and writes no metadata, and its
  GM members record no deaths; when a majority is back it merges its records
  with its peers' as a restarted node does (by generation, then stamp: a queue
  promoted meanwhile drops the copy here) and opens its listener again. It does
  not forget its records: the majority may be nodes that were all paused, each
  with the records of its own pause, and the promotion is in one of them. The count is of the recorded
  members (``membership``), not of the peers seen to go down: a node that
  starts while it cannot see a majority is paused from its start, as a RabbitMQ
  node is (it waits for its peers at boot), and when a majority shows up it
  joins as any starting node does (its persisted records merged with theirs,
  clients refused until a peer's records are in), so a node killed inside its
  minority and restarted there never serves alone.

  A partial partition (n1 and n3 lose each other, n2 still sees both) leaves
  each end a majority: n3 would promote its mirrors of n1's queues while n1
  goes on confirming as their master, and the heal keeps one copy. As
  RabbitMQ's node monitor does, a node that sees a peer go down asks the peers
  it still sees whether they see it (``check_partial``, with the incarnation it
  saw go down, so a restarted peer is not taken for the same one). One that
  still counts it up asks it for an answer first (``probe``), as RabbitMQ's
  check makes a call to it: a peer that is silent, not yet counted down
  everywhere, answers nothing. When the answer comes it tells the asker
  (``partial``), and the asker logs "partial partition detected" and pauses.
  Both ends pause (within a round trip, before the tick a mirror waits before
  promoting), and the node that sees both serves on, the paused ends' queues
  not failed over.

  RabbitMQ then waits until the *entire* cluster is back. A partition whose
  links are cut one at a time is partial while it forms: n1 losing n3 a moment
  before n2 does pauses n1, and when n2 loses n3 too the majority n1+n2 stays
  unavailable until n3 returns (a queue mastered on n3 was never promoted; a
  test hung 20 minutes on it). So a node paused for a partial partition asks
  again every tick, for each member it does not see, every peer it sees
  (``check_partial``); each answers ``partial`` (it still reaches that member)
  or ``not_partial`` (it does not count it up, or stopped counting it up while
  probing it). There is no timeout: a silent peer answers when its own ticks
  run out. When a whole round comes back ``not_partial`` the partition is
  clean, and the node resumes if it sees a majority (every member it does not
  see is unseen by its side as well, so that member is in a minority there).
* ``autoheal``: on heal each pair of sides compares client counts; the side
  with fewer clients (ties: the side without the smallest node name) closes its
  connections and takes the winner's records, dropping its conflicting copies.
  A node whose start-up join gave up waiting and served without some members
  counts them as on the other side of a partition (``serving_alone``): when one
  comes back the two sides compare as after any partition.

Confirms under ``pause_minority`` (``confirms_held``): a partition is seen one
peer at a time (a closed link at once, a silent one only when its ticks run
out), so after a peer is lost the peers still counted as up may be gone too. A
master whose mirrors were all on the lost side has a group of one and would
confirm alone until the node pauses, and the majority's promoted mirror drops
those messages at the heal (75 lost in 0.4 s once). From a loss on, the node
sends no publisher confirm until a majority of the members (itself included)
has been heard from since the loss; if that never comes it pauses, its client
connections close, and what it held was never confirmed. A peer heard from
after the loss answers within a tick, so a node in a majority holds its
confirms for at most about a tick. Confirms also wait until every peer asked
about the loss (``check_partial``) has answered: in a partial partition the
peer heard from still reaches the lost node, and a master that took hearing
from it for a majority confirmed 64 messages in the 20 ms before it paused for
the partial partition. An answer comes within two round trips, or for a silent
node when the asked peer's own ticks run out. Publishes forwarded to a master
here by its peers are confirmed under the same rule (``remote.MasterSide``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker_impl.cluster.catalog import Catalog
from broker_impl.cluster.config import ClusterConfig
from broker_impl.cluster.gm_link import GmHub
from broker_impl.cluster.transport import Transport

if TYPE_CHECKING:
    from broker_impl.cluster.host import ClusterHost

log = logging.getLogger("broker_impl.cluster")


class Partitions:
    """Whether this node is paused, and what it does when a link to a peer comes back."""

    def __init__(
        self,
        cfg: ClusterConfig,
        transport: Transport,
        broker: ClusterHost,
        catalog: Catalog,
        gm: GmHub,
        resumed: Callable[[], None],
    ) -> None:
        self.broker = broker
        self._resumed = resumed  # told after a resume (queues whose master is still gone may promote here)
        self.me = cfg.node
        self.cfg = cfg
        self.transport = transport
        self.catalog = catalog
        self.gm = gm
        self.paused = False
        # how many times this node paused (a confirm taken before a pause is not given after it)
        self.pauses = 0
        self._was_down: set[str] = set()
        self._clients: dict[str, int] = {}  # peer -> its client connections, as it last said
        self._heal_side: dict[str, list[str]] = {}
        self._since_start = True  # no majority seen since this node started (see ``start``)
        self._lost_at: float | None = None  # the last peer loss not yet followed by a majority heard from
        self._await_all = False  # paused for a partial partition: resumes only when every member is visible
        self._probing: dict[
            str, set[str]
        ] = {}  # peer probed -> the peers that saw it go down (``check_partial``)
        self._asked: set[tuple[str, str]] = set()  # (peer, member) asked about and not answered this round
        self._round_partial = False  # a peer answered ``partial`` this round
        self._round_started = False  # a round of questions went out since the pause

    def clients_said(self, peer: str, n: int) -> None:
        self._clients[peer] = n

    def peer_up(self, peer: str) -> None:
        self.check_majority()
        if peer in self._was_down:
            self._was_down.discard(peer)
            if self.cfg.partition_handling == "autoheal":
                side = self._heal_side[peer] = self._side(
                    peer
                )  # the sides as they were when this link healed
                self.transport.send(peer, {"t": "heal", "side": side, "clients": self._side_clients(side)})

    def peer_down(self, peer: str) -> None:
        self.check_majority()
        self._was_down.add(peer)
        self._lost_at = time.monotonic()
        for asker in sorted(self._probing.pop(peer, set())):
            self.transport.send(asker, {"t": "not_partial", "node": peer})
        self._answered(peer, None)  # a peer lost while asked answers nothing; the round goes on without it
        if self.cfg.partition_handling == "pause_minority" and not self.paused:
            self._ask(peer)

    def check_partial(self, asker: str, node: str, incarnation: str) -> None:
        """``asker`` saw ``node`` go down: if this node still counts the same incarnation of it up, probe it."""
        if self.transport.is_up(node) and self.transport.incarnation_of(node) == incarnation:
            self._probing.setdefault(node, set()).add(asker)
            self.transport.send(node, {"t": "probe"})
        else:
            self.transport.send(asker, {"t": "not_partial", "node": node})

    def probed(self, node: str) -> None:
        """``node`` answered a probe: it is there, so each peer that saw it go down is partitioned from it."""
        for asker in sorted(self._probing.pop(node, set())):
            self.transport.send(asker, {"t": "partial", "node": node})

    def partial(self, proxy: str, node: str) -> None:
        """``proxy`` still sees ``node``, which this node saw go down: a partial partition (module doc)."""
        self._answered(proxy, node, partial=True)
        if self.cfg.partition_handling != "pause_minority" or self.paused or self.transport.is_up(node):
            return
        log.error(
            "cluster: partial partition detected: %s seen down here, %s still sees it; "
            "pausing until every member is visible",
            node,
            proxy,
        )
        self._await_all = True
        self.check_majority()

    def not_partial(self, peer: str, node: str) -> None:
        """``peer`` does not reach ``node``: one answer of this round (module doc)."""
        self._answered(peer, node)

    def tick(self) -> None:
        """Paused for a partial partition: once the last round is answered, ask again (module doc)."""
        if not (self.paused and self._await_all) or self._asked:
            return
        if not self._round_partial and self._round_started:
            log.warning("cluster: the partition is no longer partial; pausing only if in a minority")
            self._await_all = False
            self._round_started = False
            self.check_majority()
            return
        self._round_partial = False
        self._round_started = True
        for node in [p for p in self.transport.peers if not self.transport.is_up(p)]:
            self._ask(node)

    def _ask(self, node: str) -> None:
        """Ask every peer seen whether it still reaches ``node`` (the incarnation seen here); each answers."""
        ask = {"t": "check_partial", "node": node, "inc": self.transport.incarnation_of(node)}
        for other in self.transport.up_peers():
            self._asked.add((other, node))
            self.transport.send(other, ask)

    def _answered(self, peer: str, node: str | None, *, partial: bool = False) -> None:
        """An answer about ``node`` from ``peer`` (``None``: every question to ``peer``, which was lost)."""
        self._asked = {(p, n) for p, n in self._asked if p != peer or (node is not None and n != node)}
        self._round_partial = self._round_partial or partial

    def confirms_held(self) -> bool:
        """Under pause_minority: whether publisher confirms wait (paused, or a majority not heard from since the
        last peer was lost; see the module doc)."""
        if self.cfg.partition_handling != "pause_minority":
            return False
        if self.paused or self._asked:
            return True  # paused, or a peer asked whether it still reaches a lost one has not answered
        if self._lost_at is None:
            return False
        heard = 1 + len(self.transport.heard_since(self._lost_at))
        if heard * 2 <= 1 + len(self.transport.peers):
            return True
        self._lost_at = None
        return False

    def start(self) -> None:
        """Before any peer is seen: decide from the recorded members, as at any other time.

        Up/down events alone never pause a node that starts without its peers (a
        peer never seen up is never seen going down), and such a node served alone
        and lost what it confirmed at the heal (``scenarios/reference-restart-in-minority.yaml``).
        """
        self.check_majority()

    def serving_alone(self) -> None:
        """The start-up join gave up waiting for a peer: the members not seen are on the other side of a
        partition from now on, so autoheal compares the sides when one comes back."""
        self._was_down.update(p for p in self.transport.peers if not self.transport.is_up(p))

    def check_majority(self) -> None:
        if self.cfg.partition_handling != "pause_minority":
            return
        total = 1 + len(self.transport.peers)  # the recorded members (a forgotten node no longer counts)
        seen = 1 + len(self.transport.up_peers())
        minority = seen * 2 <= total
        held = minority or (self._await_all and seen < total)
        if held and not self.paused:
            self._pause(seen, total)
        elif not held and self.paused:
            self._resume(seen, total)
        if not minority:
            self._since_start = False

    def _pause(self, seen: int, total: int) -> None:
        # As a stopped RabbitMQ node: no clients, no promotions, no metadata writes. The
        # majority promotes mirrors of the queues mastered here meanwhile.
        self.paused = True
        self.pauses += 1
        self.catalog.await_winner = "*"
        self.gm.pause()
        log.warning(
            "cluster: %s %d of %d nodes visible%s; pausing (pause_minority): client connections closed",
            "only" if seen * 2 <= total else "a partial partition,",
            seen,
            total,
            " at start" if self._since_start else "",
        )
        for conn in list(self.broker.connections):
            conn.force_close("node paused: minority partition")
        if self.broker.listener_hook is not None:
            self.broker.listener_hook(False)

    def _resume(self, seen: int, total: int) -> None:
        self.paused = False
        self._await_all = False
        self._asked.clear()
        self._round_started = self._round_partial = False
        if not self.transport.peers:
            # Every other member was forgotten here (``forget_cluster_node``, as RabbitMQ's --offline
            # recovery of a node whose peers are gone for good): the node is the cluster, with no
            # majority's records to wait for.
            self.catalog.joined("the only member left")
            log.warning("cluster: the only member left; resuming")
        elif self._since_start:
            # Paused since its start: it joins as a starting node does. Its records are the ones it
            # persisted (it wrote none while paused); clients wait until a peer's records are merged.
            log.warning("cluster: %d of %d nodes visible; joining the cluster", seen, total)
        else:
            # Rejoin as a restarted node does: its records (a paused node stamps none) merged with the
            # peers' by their generations, then their stamps, so a queue promoted meanwhile drops the
            # copy here (what only this copy held is lost, as in RabbitMQ). Forgetting them and waiting
            # for "the majority's records" lost a promotion when the majority was two nodes that had
            # both been paused: each waited for the other's table, found it empty, and every record was
            # stamped afresh with no generation (``scenarios/reference-paused-pair-resume.yaml``).
            self.catalog.rejoin()
            log.warning(
                "cluster: %d of %d nodes visible again; resuming, its records merged with its peers'",
                seen,
                total,
            )
        if self.broker.listener_hook is not None:
            self.broker.listener_hook(True)
        self._resumed()

    def _side(self, returning: str) -> list[str]:
        """The nodes on this side of a partition that just healed towards ``returning``."""
        return sorted({self.me, *(p for p in self.transport.up_peers() if p != returning)})

    def _side_clients(self, side: list[str]) -> int:
        return sum(len(self.broker.connections) if n == self.me else self._clients.get(n, 0) for n in side)

    def heal(self, peer: str, their_side: list[str], their_clients: int) -> None:
        """RabbitMQ's autoheal: the side with fewer clients (ties: the side without the smallest name) restarts.

        Restarting here means: close client connections and forget the metadata
        table, so the winner's records replace ours key by key; a queue mastered on
        both sides keeps the winner's master and our copy is dropped (its messages
        are lost, as in RabbitMQ), and mirrors restart empty under it.
        """
        if self.cfg.partition_handling != "autoheal":
            return
        my_side = self._heal_side.pop(peer, None) or self._side(peer)
        if set(my_side) & set(their_side):
            return  # healed already through a node both sides see: that pair decided
        mine = my_side
        my_clients = self._side_clients(mine)
        lose = (my_clients, min(their_side)) < (their_clients, min(mine))
        if not lose:
            log.warning(
                "autoheal: this side %s (%d clients) wins over %s (%d clients)",
                mine,
                my_clients,
                their_side,
                their_clients,
            )
            self.catalog.skip_next_from(peer)
            return
        log.warning(
            "autoheal: this side %s (%d clients) loses to %s (%d clients); restarting queues from the winner",
            mine,
            my_clients,
            their_side,
            their_clients,
        )
        for conn in list(self.broker.connections):
            conn.force_close("autoheal: node restarting after a partition")
        self.catalog.restart(peer)
