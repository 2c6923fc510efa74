"""A failed fsync is fatal for the data it covered (what PostgreSQL learned in 2018, "fsyncgate").

Linux reports a writeback error to one fsync and may then mark the failed pages
clean: a later fsync succeeds although the bytes never reached the disk. So a
store that retries, or lets a later successful fsync cover the failed range,
confirms messages that are not on disk. The store must fail what the fsync
covered and refuse to go on until the node restarts and recovers from what the
disk really holds.
"""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from broker_impl.backing_queue import StoreError
from broker_impl.store import open_store


class FailingFsync:
    """``os.fdatasync``/``os.fsync`` that raise EIO for the next ``fail`` calls, then pass through."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fail = 0
        self.calls = 0
        real_datasync, real_fsync = os.fdatasync, os.fsync

        def wrap(real):
            def call(fd: int) -> None:
                self.calls += 1
                if self.fail:
                    self.fail -= 1
                    raise OSError(errno.EIO, os.strerror(errno.EIO))
                real(fd)

            return call

        monkeypatch.setattr(os, "fdatasync", wrap(real_datasync))
        monkeypatch.setattr(os, "fsync", wrap(real_fsync))


def test_a_failed_fsync_is_never_covered_by_a_later_successful_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures: list[StoreError] = []

    async def go() -> None:
        store = await open_store(tmp_path, {"flush": "sync", "checkpoint_interval_ms": 60_000})
        store.on_failure = failures.append
        fs = FailingFsync(monkeypatch)
        off_a, size_a, _ = store.append("q", b"message A")
        fs.fail = 1
        with pytest.raises(StoreError):
            await store.wait_durable(off_a + size_a)  # the confirm of A is a nack
        assert store.log.flushed < off_a + size_a
        # The disk is fine again. Today's mistake: B's fsync succeeds and marks A durable too.
        with pytest.raises(StoreError):
            off_b, size_b, _ = store.append("q", b"message B")
            await store.wait_durable(off_b + size_b)
        assert store.log.flushed < off_a + size_a, "a later fsync marked the failed range durable"
        with pytest.raises(StoreError):
            await store.flush()
        await store.close()  # a failed store does not shut down cleanly: recovery must rescan the log

    asyncio.run(go())
    assert len(failures) == 1 and "fsync" in str(failures[0])
    assert (tmp_path / "abort").exists()

    async def reopen() -> None:
        store = await open_store(tmp_path, {"flush": "sync"})
        assert not store.recovery_report.clean
        off, size, _ = store.append("q", b"after restart")
        await store.wait_durable(off + size)  # a restarted store serves again
        await store.close()

    asyncio.run(reopen())


def test_a_failed_checkpoint_fsync_is_fatal_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Consume-queue and ack-log fsyncs: a failure must not be followed by a checkpoint that claims them."""

    async def go() -> None:
        store = await open_store(tmp_path, {"flush": "sync", "checkpoint_interval_ms": 60_000})
        off, size, index = store.append("q", b"m")
        await store.wait_durable(off + size)
        store.ack("q", [index])
        fs = FailingFsync(monkeypatch)
        fs.fail = 1
        with pytest.raises(StoreError):
            await store.write_checkpoint()
        before = store.checkpoint
        with pytest.raises(StoreError):
            await store.write_checkpoint()
        assert store.checkpoint == before
        await store.close()

    asyncio.run(go())
    assert (tmp_path / "abort").exists()


def test_the_node_nacks_what_the_failed_fsync_covered_and_stops_itself(
    node_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pika against a node whose disk fails one fsync: a nack, then the node asks to be restarted."""
    import pika
    import pika.exceptions

    node = node_factory(store={"flush": "sync"})
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("fsync-q", durable=True)
    persistent = pika.BasicProperties(delivery_mode=2)
    ch.basic_publish("", "fsync-q", b"before", persistent)  # confirmed: the disk is fine
    fs = FailingFsync(monkeypatch)
    fs.fail = 1
    with pytest.raises((pika.exceptions.NackError, pika.exceptions.AMQPError)):
        ch.basic_publish("", "fsync-q", b"during", persistent)
    assert node.server.failure is not None and "fsync" in node.server.failure
    try:
        ch.basic_publish("", "fsync-q", b"after", persistent)  # the disk works again: still refused
    except (pika.exceptions.NackError, pika.exceptions.AMQPError):
        pass
    else:
        pytest.fail("a publish was confirmed by a store whose fsync had failed")
    if conn.is_open:
        conn.close()


def test_a_queue_dropped_while_a_checkpoint_syncs_does_not_fail_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mirror's copy dropped at a heal closes its queue's files while the checkpoint's fsyncs run
    in the pool: the checkpoint syncs what it claimed and the store goes on (an fsync of the closed
    descriptor failed with EBADF, and the node stopped)."""
    import threading

    syncing, dropped = threading.Event(), threading.Event()
    real = os.fdatasync

    def slow(fd: int) -> None:
        syncing.set()
        dropped.wait()
        real(fd)

    async def go() -> None:
        store = await open_store(tmp_path, {"flush": "sync", "checkpoint_interval_ms": 60_000})
        off, size, index = store.append("q", b"m")
        await store.wait_durable(off + size)
        store.ack("q", [index])
        monkeypatch.setattr(os, "fdatasync", slow)
        checkpoint = asyncio.ensure_future(store.write_checkpoint())
        while not syncing.is_set():
            await asyncio.sleep(0.01)
        store.delete_queue("q")  # closes the queue's descriptors on the loop, mid-checkpoint
        dropped.set()
        await checkpoint
        assert store.failed is None
        monkeypatch.setattr(os, "fdatasync", real)
        off, size, _ = store.append("other", b"n")
        await store.wait_durable(off + size)
        await store.close()

    asyncio.run(go())
    assert not (tmp_path / "abort").exists()
