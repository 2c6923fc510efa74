"""Frames sent in one turn of the event loop leave together: real links on loopback, order and closes kept."""

from __future__ import annotations

import asyncio
from typing import Any

from broker_impl.cluster.transport import Transport
from tests.broker_impl.cluster.conftest import free_port
from tests.polling import until_async


async def _pair(got: list[tuple[str, dict[str, Any], bytes]]) -> tuple[Transport, Transport]:
    ports = {"n1": free_port(), "n2": free_port()}
    up: dict[str, asyncio.Event] = {"n1": asyncio.Event(), "n2": asyncio.Event()}

    def make(me: str) -> Transport:
        other = "n2" if me == "n1" else "n1"
        return Transport(
            me,
            ("127.0.0.1", ports[me]),
            {other: ("127.0.0.1", ports[other])},
            tick=0.2,
            on_message=lambda peer, h, blob: got.append((peer, h, blob)),
            on_up=lambda _peer: up[me].set(),
            on_down=lambda _peer: None,
        )

    a, b = make("n1"), make("n2")
    await a.start()
    await b.start()
    await asyncio.gather(up["n1"].wait(), up["n2"].wait())
    return a, b


def test_a_burst_sent_in_one_turn_arrives_whole_and_in_order() -> None:
    async def main() -> list[tuple[str, dict[str, Any], bytes]]:
        got: list[tuple[str, dict[str, Any], bytes]] = []
        a, b = await _pair(got)
        try:
            for i in range(500):
                assert a.send("n2", {"t": "x", "i": i}, bytes([i % 256]) * (i % 7))
            await until_async(lambda: len(got) == 500, "the 500 frames", every=0.01)
            return got
        finally:
            await a.stop()
            await b.stop()

    got = asyncio.run(main())
    assert [(p, h["i"], blob) for p, h, blob in got] == [
        ("n1", i, bytes([i % 256]) * (i % 7)) for i in range(500)
    ]


def test_frames_sent_just_before_the_link_closes_still_go_out() -> None:
    async def main() -> list[int]:
        got: list[tuple[str, dict[str, Any], bytes]] = []
        a, b = await _pair(got)
        try:
            for i in range(50):
                a.send("n2", {"t": "x", "i": i})
            await a.stop()  # in the same turn: nothing has been written yet
            await until_async(lambda: len(got) == 50, "the 50 frames", every=0.01)
            return [h["i"] for _p, h, _b in got]
        finally:
            await b.stop()

    assert asyncio.run(main()) == list(range(50))
