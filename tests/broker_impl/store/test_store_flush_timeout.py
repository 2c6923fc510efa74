"""Sync flush: every waiting publish gives up after flush_timeout_ms, however many wait and whenever they came."""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker_impl.backing_queue import StoreError
from broker_impl.store import open_store
from tests.polling import until_async

CFG = {
    "segment_bytes": 4096,
    "checkpoint_interval_ms": 60_000,
    "retention_interval_ms": 60_000,
    "flush_timeout_ms": 50,
}


def test_staggered_waiters_each_time_out_and_a_later_flush_serves_again(tmp_path: Path) -> None:
    async def go() -> list[str]:
        store = await open_store(tmp_path, CFG)
        await store._flush_lock.acquire()  # a disk that does not come back
        waits = []
        for i in range(3):
            off, size, _ = store.append("q", b"m%d" % i)
            waits.append(asyncio.ensure_future(store.wait_durable(off + size)))
            # A schedule, not a wait for a condition: each waiter starts 30 ms after the one before, while
            # the timer is armed for an earlier deadline (the one timer must serve every waiter).
            await asyncio.sleep(0.03)
        done = await asyncio.gather(*waits, return_exceptions=True)
        store._flush_lock.release()
        off, size, _ = store.append("q", b"after")
        await store.wait_durable(off + size)  # the disk is back: the next publish is confirmed
        await store.close()
        assert all(isinstance(e, StoreError) for e in done), done
        return [str(e) for e in done]

    errors = asyncio.run(go())
    assert len(errors) == 3 and all(e.startswith("flush timeout") for e in errors), errors


def test_a_wait_that_is_flushed_in_time_does_not_time_out_later(tmp_path: Path) -> None:
    # A real fsync must come in under the timeout here: a second, not 50 ms (a loaded disk takes that).
    cfg = {**CFG, "flush_timeout_ms": 1000}

    async def go() -> list[dict[str, object]]:
        failed: list[dict[str, object]] = []  # what the expiry timer's callback raised, if anything
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: failed.append(context))
        store = await open_store(tmp_path, cfg)
        off, size, _ = store.append("q", b"m")
        await store.wait_durable(off + size)
        # the expiry timer runs past this wait's deadline and finds nothing left to fail
        await until_async(lambda: store._timeout_timer is None, "the flush timer to run out")
        off, size, _ = store.append("q", b"n")
        await store.wait_durable(off + size)
        await store.close()
        return failed

    assert asyncio.run(go()) == []
