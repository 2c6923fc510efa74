"""RabbitMQ's ``credit_flow`` for the reader -> channel -> queue -> store chain.

Each stage is an ``Actor``. A sender spends one credit per message it sends a
receiver; at zero it is *blocked by* that receiver (it may still send: what
matters is that the reader stops reading the socket). A receiver counts down
``more_after`` per message it has processed and then grants that much credit
back, unless it is itself blocked, in which case the grant waits until it
unblocks. That deferral is what carries back-pressure from a slow store all
the way to the publisher's TCP window.

Everything runs on one event loop, so a grant is a direct call; there are no
locks and no message passing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CreditSpec:
    """``{InitialCredit, MoreCreditAfter}``."""

    initial: int = 400
    more_after: int = 200

    def __post_init__(self) -> None:
        if not 0 <= self.more_after <= self.initial:
            raise ValueError(
                f"credit spec needs 0 <= more_after <= initial, got {self.initial}/{self.more_after}"
            )


DEFAULT_LINK = CreditSpec(400, 200)
DEFAULT_STORE_LINK = CreditSpec(4000, 800)

FLOW_STATE_WINDOW = 1.0  # seconds a process reports "flow" after being blocked


class Actor:
    """One process of the chain. Subclasses call ``flow_send``/``flow_ack`` and may override ``on_flow_unblocked``.

    ``enabled`` False turns every call into a no-op (the benchmark switch).
    """

    def __init__(self, enabled: bool = True, label: str = "") -> None:
        self.flow_enabled = enabled
        self.flow_label = label
        self._credit_from: dict[Actor, int] = {}  # sender side: credit left per receiver
        self._credit_to: dict[Actor, int] = {}  # receiver side: countdown per sender
        self._blocked_by: set[Actor] = set()
        self._deferred: dict[Actor, int] = {}
        self._blocked_at: float | None = None
        self._senders: set[Actor] = set()  # who holds credit from us (to unblock them if we die)

    # -- sender side ------------------------------------------------------
    def flow_send(self, to: Actor, spec: CreditSpec) -> None:
        """Account for one message sent to ``to``; block on it when credit runs out."""
        if not self.flow_enabled:
            return
        c = self._credit_from.get(to, spec.initial)
        to._senders.add(self)
        if c <= 1:
            self._block(to)
            self._credit_from[to] = 0 if c == 1 else c - 1
        else:
            self._credit_from[to] = c - 1

    def _block(self, by: Actor) -> None:
        if not self._blocked_by:
            self._blocked_at = time.monotonic()
        self._blocked_by.add(by)

    def handle_bump(self, frm: Actor, quantity: int) -> None:
        """Credit granted by a receiver; unblock when it rises above zero."""
        if frm not in self._credit_from:
            return
        c = self._credit_from[frm] + quantity
        self._credit_from[frm] = c
        if c > 0 and frm in self._blocked_by:
            self._unblock(frm)

    def _unblock(self, frm: Actor) -> None:
        self._blocked_by.discard(frm)
        self._blocked_at = time.monotonic()  # "flow" lingers for a second after unblocking
        if not self._blocked_by:
            deferred, self._deferred = self._deferred, {}
            for to, qty in deferred.items():
                to.handle_bump(self, qty)
            self.on_flow_unblocked()

    # -- receiver side ----------------------------------------------------
    def flow_ack(self, frm: Actor, spec: CreditSpec) -> None:
        """One message from ``frm`` processed; grant ``more_after`` credit every ``more_after`` messages."""
        if not self.flow_enabled or spec.more_after == 0:
            return
        c = self._credit_to.get(frm, spec.more_after)
        if c <= 1:
            self._grant(frm, spec.more_after)
            self._credit_to[frm] = spec.more_after
        else:
            self._credit_to[frm] = c - 1

    def _grant(self, to: Actor, quantity: int) -> None:
        if self._blocked_by:
            self._deferred[to] = self._deferred.get(to, 0) + quantity
        else:
            to.handle_bump(self, quantity)

    # -- lifecycle ----------------------------------------------------------
    def flow_peer_down(self, peer: Actor) -> None:
        """Forget a dead peer; if it was blocking us, that block is gone."""
        self._credit_from.pop(peer, None)
        self._credit_to.pop(peer, None)
        self._deferred.pop(peer, None)
        self._senders.discard(peer)
        if peer in self._blocked_by:
            self._unblock(peer)

    def flow_terminate(self) -> None:
        """This actor is going away: release everyone it was blocking and everyone it sent to."""
        for s in list(self._senders):
            s.flow_peer_down(self)
        for r in list(self._credit_from):
            r._senders.discard(self)
            r._credit_to.pop(self, None)
            r._deferred.pop(self, None)
        self._senders.clear()
        self._credit_from.clear()
        self._credit_to.clear()
        self._deferred.clear()
        self._blocked_by.clear()

    # -- state ----------------------------------------------------------------
    @property
    def flow_blocked(self) -> bool:
        return bool(self._blocked_by)

    def flow_state(self, now: Callable[[], float] = time.monotonic) -> str:
        """``flow`` if blocked now or within the last second, else ``running``."""
        if self._blocked_by:
            return "flow"
        if self._blocked_at is not None and now() - self._blocked_at < FLOW_STATE_WINDOW:
            return "flow"
        return "running"

    def on_flow_unblocked(self) -> None:
        """Hook: the last block cleared (the reader resumes reading here)."""
