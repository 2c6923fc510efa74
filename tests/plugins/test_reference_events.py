"""The reference plugin's log events match what ``broker_impl`` really logs: the store's group
commits, flush timeouts and transaction recovery, read back through the plugin's ``events`` from
the broker's own log format (no Docker)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from broker_impl.store import open_store
from plugins.reference import ReferenceBroker

CFG = {
    "segment_bytes": 4096,
    "checkpoint_interval_ms": 60_000,
    "retention_interval_ms": 60_000,
    "flush_timeout_ms": 50,
}
FORMAT = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")  # broker_impl.__main__'s


def logged(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(FORMAT.format(r) for r in caplog.records)


def test_group_commit_and_flush_timeout_lines_are_events(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def go() -> None:
        store = await open_store(tmp_path, CFG)
        ends = []
        for i in range(4):
            off, size, _ = store.append("q", b"m%d" % i)
            ends.append(off + size)
        await asyncio.gather(*(store.wait_durable(e) for e in ends))  # one fsync releases the four
        await store._flush_lock.acquire()  # then a disk that does not come back
        off, size, _ = store.append("q", b"stuck")
        with pytest.raises(Exception, match="flush timeout"):
            await store.wait_durable(off + size)
        store._flush_lock.release()
        await store.close()

    with caplog.at_level(logging.INFO, logger="broker_impl"):
        asyncio.run(go())
    events = ReferenceBroker().events("n1", {"logs/brokerchaos/n1.log": logged(caplog)})
    names = [e.name for e in events]
    assert "group-commit-batch" in names and "flush-timeout" in names, logged(caplog)
    assert max(int(e.detail["waiters"]) for e in events if e.name == "group-commit-batch") >= 1
    assert all(e.wall_time is not None for e in events)


def test_recovery_after_a_crash_reports_what_it_did_with_transactions(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def crash() -> None:
        store = await open_store(tmp_path, CFG)
        store.prepare("q", 7, b"half")  # a prepared record, never committed
        off, size, _ = store.append_batch("q", [b"a", b"b"])
        await store.wait_durable(off + size)
        # no close: the next open sees an abnormal shutdown

    async def reopen() -> None:
        store = await open_store(tmp_path, CFG)
        await store.close()

    asyncio.run(crash())
    with caplog.at_level(logging.INFO, logger="broker_impl"):
        asyncio.run(reopen())
    events = ReferenceBroker().events("n1", {"logs/brokerchaos/n1.log": logged(caplog)})
    tx = [e for e in events if e.name == "tx-recovery"]
    assert tx and tx[0].detail == {"prepared": "1", "committed": "1"}, logged(caplog)
