"""credit_flow semantics on actors, without sockets."""

from __future__ import annotations

import pytest

from broker_impl.flow import Actor, CreditSpec


class Probe(Actor):
    def __init__(self, enabled: bool = True) -> None:
        super().__init__(enabled)
        self.unblocked = 0

    def on_flow_unblocked(self) -> None:
        self.unblocked += 1


def test_spec_validation() -> None:
    with pytest.raises(ValueError):
        CreditSpec(10, 11)
    with pytest.raises(ValueError):
        CreditSpec(10, -1)
    CreditSpec(10, 10)
    CreditSpec(10, 0)


def test_sender_blocks_at_zero_and_receiver_grants_after_more_after() -> None:
    spec = CreditSpec(4, 2)
    a, b = Probe(), Probe()
    for _ in range(3):
        a.flow_send(b, spec)
    assert not a.flow_blocked
    a.flow_send(b, spec)
    assert a.flow_blocked and a.flow_state() == "flow"
    b.flow_ack(a, spec)
    assert a.flow_blocked  # one processed: countdown 2 -> 1, no grant yet
    b.flow_ack(a, spec)
    assert not a.flow_blocked and a.unblocked == 1


def test_blocked_receiver_defers_grant_until_it_unblocks() -> None:
    spec = CreditSpec(2, 1)
    reader, chan, queue = Probe(), Probe(), Probe()
    chan.flow_send(queue, spec)
    chan.flow_send(queue, spec)
    assert chan.flow_blocked
    reader.flow_send(chan, spec)
    reader.flow_send(chan, spec)
    assert reader.flow_blocked
    chan.flow_ack(reader, spec)  # channel processed one but is blocked: grant deferred
    assert reader.flow_blocked
    queue.flow_ack(chan, spec)  # queue grants channel -> channel unblocks -> deferred grant goes out
    assert not chan.flow_blocked and not reader.flow_blocked


def test_peer_death_unblocks_senders() -> None:
    spec = CreditSpec(1, 1)
    a, b = Probe(), Probe()
    a.flow_send(b, spec)
    assert a.flow_blocked
    b.flow_terminate()
    assert not a.flow_blocked and a.unblocked == 1


def test_disabled_never_blocks() -> None:
    spec = CreditSpec(1, 1)
    a, b = Probe(enabled=False), Probe(enabled=False)
    for _ in range(100):
        a.flow_send(b, spec)
    assert not a.flow_blocked and a.flow_state() == "running"


def test_flow_state_lingers_one_second() -> None:
    spec = CreditSpec(1, 1)
    a, b = Probe(), Probe()
    a.flow_send(b, spec)
    b.flow_ack(a, spec)
    assert not a.flow_blocked
    t0 = a._blocked_at
    assert t0 is not None
    assert a.flow_state(lambda: t0 + 0.5) == "flow"
    assert a.flow_state(lambda: t0 + 1.5) == "running"
