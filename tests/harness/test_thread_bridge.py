"""``ThreadBridge``: a thread-based client library's calls and callbacks inside the event loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from harness.spec import HeldTotal, ThreadBridge, depth_empty, depth_value


class Library:
    """What a thread-based client looks like: blocking calls, callbacks on its receiver thread."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.on_receipt = lambda key: None
        self.on_error = lambda key, why: None
        self.on_message = lambda body: None
        self.on_disconnected = lambda: None

    def send(self, key: str, refuse: bool = False) -> None:
        self.sent.append(key)
        threading.Thread(target=self._reply, args=(key, refuse)).start()

    def _reply(self, key: str, refuse: bool) -> None:
        if refuse:
            self.on_error(key, "refused")
        else:
            self.on_receipt(key)
        self.on_message(f"body-of-{key}")

    def block(self, until: threading.Event) -> str:
        until.wait()
        return "unblocked"


def test_receipts_errors_and_deliveries_cross_from_the_library_thread() -> None:
    async def main() -> tuple[object, str, list[str]]:
        bridge = ThreadBridge()
        lib = Library()
        deliveries = bridge.queue()
        lib.on_receipt = lambda key: bridge.resolve(key, f"receipt {key}")
        lib.on_error = lambda key, why: bridge.fail(key, RuntimeError(why))
        lib.on_message = deliveries.put
        ok = bridge.expect("r1")
        await bridge.call(lib.send, "r1", timeout=5)
        refused = bridge.expect("r2")
        await bridge.call(lib.send, "r2", True, timeout=5)
        with pytest.raises(RuntimeError, match="refused"):
            await refused
        got = [await deliveries.get(5), await deliveries.get(5)]
        return await ok, lib.sent[0], sorted(got)

    assert asyncio.run(main()) == ("receipt r1", "r1", ["body-of-r1", "body-of-r2"])


def test_a_lost_connection_fails_every_awaited_reply_and_late_replies_are_dropped() -> None:
    async def main() -> None:
        bridge = ThreadBridge()
        a, b = bridge.expect("a"), bridge.expect("b")
        threading.Thread(target=bridge.fail_all, args=(ConnectionError("gone"),)).start()
        for fut in (a, b):
            with pytest.raises(ConnectionError):
                await fut
        bridge.resolve("a", "late")  # nobody waits for it any more: dropped, no error
        c = bridge.expect("c")
        bridge.forget("c")
        bridge.resolve("c", "late")
        await asyncio.sleep(0)
        assert not c.done()

    asyncio.run(main())


def test_a_blocking_call_is_bounded_and_the_loop_runs_meanwhile() -> None:
    async def main() -> int:
        bridge = ThreadBridge()
        release = threading.Event()
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while not release.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        with pytest.raises(TimeoutError):
            await bridge.call(Library().block, release, timeout=0.2)
        release.set()
        await task
        return ticks

    assert asyncio.run(main()) > 1


def test_an_empty_queue_times_out() -> None:
    async def main() -> None:
        q = ThreadBridge().queue()
        assert q.empty()
        with pytest.raises(TimeoutError):
            await q.get(0.05)
        q.put("x")
        assert await q.get(5) == "x"

    asyncio.run(main())


def test_a_held_total_is_recorded_without_a_split_and_is_empty_at_zero() -> None:
    assert depth_value(HeldTotal(7)) == {"ready": None, "unacked": None, "held": 7}
    assert depth_value((3, 4)) == {"ready": 3, "unacked": 4}
    assert depth_empty(HeldTotal(0)) and not depth_empty(HeldTotal(1))
    assert depth_empty((0, 0)) and not depth_empty((0, 1)) and not depth_empty((1, 0))
