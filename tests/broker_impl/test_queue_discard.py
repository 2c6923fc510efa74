"""A queue copy thrown away refuses what it had not confirmed; a queue.delete confirms it.

A node discards its copy of a queue when a master elsewhere replaced it (the
losing side of a healed partition, a node that restarted as a stale master).
A publish still waiting for its confirm then is not stored anywhere that
survives: the publisher must get a nack. A client's queue.delete is what the
publisher asked for, and RabbitMQ confirms what was routed to the queue.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pamqp import commands

from broker_impl.message import Message
from tests.broker_impl.conftest import InProcessNode
from tests.polling import until_async


@pytest.mark.parametrize(("how", "confirmed"), [("discard", False), ("delete", True)])
def test_a_publish_waiting_for_its_confirm_when_the_queue_goes(
    node: InProcessNode, how: str, confirmed: bool
) -> None:
    async def scenario() -> list[bool]:
        q = await node.broker.vhosts["/"].declare_queue("pending", owner=None, durable=True)
        gate = asyncio.Event()
        store = q.bq.publish

        async def held(message: Message) -> Any:
            await (
                gate.wait()
            )  # the real backing queue, held where a mirror's confirm or an fsync holds a publish
            return await store(message)

        q.bq.publish = held
        got: list[bool] = []
        q.enqueue(Message("", "pending", commands.Basic.Properties(delivery_mode=2), b"m"), None, got.append)
        await until_async(lambda: q.writes_in_flight, "the publish's write under way")
        going = asyncio.ensure_future(getattr(q, how)())
        # Deleting runs without a pause up to its wait for the writes in flight: once the queue reads
        # as deleted, whatever it answers before that write finishes has been answered.
        await until_async(lambda: q.deleted, f"{how} waiting for the write")
        assert got == [], "answered before the write finished"
        gate.set()
        await going
        return got

    assert node.call(scenario()) == [confirmed]
