"""A half-open pair of links starts over.

Each node sends on the link it dialled and hears its peer on the link the peer dialled. When
n1's link to n2 was accepted by a proxy that keeps dropping it (a proxy that kept an old toxic on
a connection it accepted while its toxics changed), n1 hears n2 and counts it up while n2 hears
nothing and never counts n1 up, and nothing on either side noticed: the pair stayed so after
the cut was healed for new connections. n2 now closes its own link after ``down_after`` silent
ticks; n1 sees it close, counts n2 down, closes its stuck link and dials a new one, which the
healed proxy forwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from broker_impl.cluster.transport import Transport
from tests.broker_impl.cluster.conftest import LinkProxy
from tests.ports import free_port

TICK = 0.05
GIVE_UP_TICKS = 2400  # a hang guard only: the pair recovers within a few ticks


def _transport(me: str, port: int, peer: str, peer_port: int) -> Transport:
    return Transport(
        me,
        ("127.0.0.1", port),
        {peer: ("127.0.0.1", peer_port)},
        tick=TICK,
        down_after=3,
        on_message=lambda *_: None,
        on_up=lambda _peer: None,
        on_down=lambda _peer: None,
    )


async def _until(condition: Callable[[], bool]) -> bool:
    for _ in range(GIVE_UP_TICKS):
        if condition():
            return True
        await asyncio.sleep(TICK)
    return False


async def _half_open_then_healed() -> tuple[bool, bool, bool]:
    p1, p2 = free_port(), free_port()
    relay = LinkProxy(("127.0.0.1", p2))
    relay.swallow = True
    n1 = _transport("n1", p1, "n2", relay.port)  # n1 -> n2 through the relay
    n2 = _transport("n2", p2, "n1", p1)  # n2 -> n1 direct
    await n1.start()
    await n2.start()
    try:
        half_open = await _until(lambda: n1.is_up("n2"))
        n2_up_while_cut = n2.is_up("n1")  # n2 cannot hear n1 while the proxy swallows its link
        relay.swallow = False  # new connections pass; the one accepted before stays swallowed
        healed = await _until(lambda: n2.is_up("n1") and n1.is_up("n2"))
        return half_open, n2_up_while_cut, healed
    finally:
        await n1.stop()
        await n2.stop()
        relay.close()


def test_a_half_open_pair_of_links_starts_over_once_the_cut_is_healed() -> None:
    half_open, n2_up_while_cut, healed = asyncio.run(_half_open_then_healed())
    assert half_open and not n2_up_while_cut
    assert healed, "n2 never heard n1 again: n1 kept the link the relay swallows"
