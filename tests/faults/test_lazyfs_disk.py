"""Disk fault rules in a real lazyfs mount: EIO, ENOSPC, slow fsync and a lying fsync, as a program sees them."""

from __future__ import annotations

import errno
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from faults.lazyfs import LazyMount, fuse_available
from tests.polling import until

REASON = fuse_available()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"needs FUSE: {REASON}")]


@pytest.fixture
def lazy() -> Iterator[LazyMount]:
    with (
        tempfile.TemporaryDirectory(prefix="lzd") as tmp,
        LazyMount(f"{tmp}/b", f"{tmp}/m", f"{tmp}/c.sock") as lz,
    ):
        yield lz


def rule(lz: LazyMount, **spec: Any) -> dict[str, Any]:
    reply = lz.command("fault add " + json.dumps(spec))
    assert reply["ok"], reply
    return reply


def clear(lz: LazyMount, rule_id: str) -> dict[str, Any]:
    reply = lz.command(f"fault clear {rule_id}")
    assert reply["ok"] and len(reply["cleared"]) == 1, reply
    return dict(reply["cleared"][0])


def open_write(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


def test_eio_on_the_chosen_files_and_operations_only(lazy: LazyMount) -> None:
    m = lazy.mountpoint
    good, bad = open_write(f"{m}/good.log"), open_write(f"{m}/seg-1.log")
    os.write(bad, b"before")
    dfd = os.open(m, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)  # both names are durable
    os.close(dfd)
    rule(lazy, id="r1", kind="eio", glob="seg-*", ops=["write", "fsync"])
    with pytest.raises(OSError) as e:
        os.write(bad, b"x")
    assert e.value.errno == errno.EIO
    with pytest.raises(OSError) as e:
        os.fsync(bad)
    assert e.value.errno == errno.EIO
    assert os.pread(bad, 6, 0) == b"before"  # reads were not in ops
    os.write(good, b"fine")
    os.fsync(good)
    done = clear(lazy, "r1")
    assert done["hits"] == 2 and done["paths"] == ["/seg-1.log"] and done["first_hit"]
    # The failed fsync persisted nothing: a power cut drops the unsynced write.
    assert lazy.command("crash")["dropped_data"][0]["path"] == "/seg-1.log"
    os.close(good)
    os.close(bad)
    rd = os.open(f"{m}/good.log", os.O_RDONLY)
    rule(lazy, id="r2", kind="eio", glob="good.log", ops=["read"])
    with pytest.raises(OSError) as e:
        os.pread(rd, 4, 0)
    assert e.value.errno == errno.EIO
    clear(lazy, "r2")
    assert os.pread(rd, 4, 0) == b"fine"
    os.close(rd)


def test_disk_full_after_a_budget_and_df_shows_it(lazy: LazyMount) -> None:
    m = lazy.mountpoint
    fd = open_write(f"{m}/log")
    rule(lazy, id="full", kind="enospc", after_bytes=1000)
    st = os.statvfs(m)
    assert st.f_bavail * st.f_bsize <= 1000
    os.write(fd, b"a" * 600)
    with pytest.raises(OSError) as e:
        os.write(fd, b"b" * 600)
    assert e.value.errno == errno.ENOSPC
    os.write(fd, b"c" * 400)  # exactly what is left
    done = clear(lazy, "full")
    assert done["written_before_full"] == 1000 and done["hits"] == 1
    os.write(fd, b"d" * 5000)
    rule(lazy, id="quiet", kind="enospc", after_bytes=0, df=False)
    st = os.statvfs(m)
    assert st.f_bavail * st.f_bsize > 1000  # df does not show it, the write still fails
    with pytest.raises(OSError) as e:
        os.write(fd, b"e")
    assert e.value.errno == errno.ENOSPC
    os.close(fd)


def test_slow_fsync_waits_and_a_lying_fsync_loses_the_data_at_power_loss(lazy: LazyMount) -> None:
    m = lazy.mountpoint
    fd = open_write(f"{m}/log")
    dfd = os.open(m, os.O_RDONLY | os.O_DIRECTORY)
    os.write(fd, b"synced\n")
    os.fsync(fd)
    os.fsync(dfd)
    rule(lazy, id="slow", kind="slow-fsync", glob="log", delay_ms=300)
    t = time.monotonic()
    os.fsync(fd)
    assert time.monotonic() - t >= 0.3
    assert clear(lazy, "slow")["hits"] == 1

    rule(lazy, id="lie", kind="fsync-lie")
    os.write(fd, b"acknowledged\n")
    os.fsync(fd)  # reports success
    status = lazy.command("status")
    assert status["unsynced_bytes"] == len(b"acknowledged\n")
    assert lazy.command("fault list")["rules"][0]["unsynced_bytes_lied_about"] == len(b"acknowledged\n")
    lazy.command("crash")
    os.close(fd)
    os.close(dfd)
    with open(f"{m}/log", "rb") as f:
        assert f.read() == b"synced\n"
    # Rules outlive a power cut, as a bad disk does.
    assert [r["id"] for r in lazy.command("fault list")["rules"]] == ["lie"]


def test_bad_rules_are_refused(lazy: LazyMount) -> None:
    for line, why in (
        ('fault add {"id": "x", "kind": "melt"}', "rule kind"),
        ('fault add {"kind": "eio"}', "needs an id"),
        ('fault add {"id": "x", "kind": "eio", "ops": ["chmod"]}', "rule ops"),
        ("fault add nope", "fault add"),
        ("fault", "usage"),
    ):
        reply = lazy.command(line)
        assert not reply["ok"] and why in reply["error"], reply
    rule(lazy, id="x", kind="eio")
    assert "already active" in lazy.command('fault add {"id": "x", "kind": "eio"}')["error"]


def test_other_requests_go_on_while_a_slow_fsync_is_held_and_a_power_cut_fails_it(lazy: LazyMount) -> None:
    m = lazy.mountpoint
    fd, other = open_write(f"{m}/log"), open_write(f"{m}/other")
    dfd = os.open(m, os.O_RDONLY | os.O_DIRECTORY)
    os.write(fd, b"synced\n")
    os.fsync(fd)
    os.fsync(dfd)
    os.write(fd, b"covered\n")
    rule(lazy, id="slow", kind="slow-fsync", glob="log", delay_ms=60_000)
    result: list[BaseException | None] = []

    def fsync() -> None:
        try:
            os.fsync(fd)
            result.append(None)
        except OSError as e:
            result.append(e)

    t = threading.Thread(target=fsync)
    t.start()
    until(lambda: lazy.command("status")["fsyncs_in_flight"], "the fsync to be held")
    # Held for a minute unless cleared: everything below returns while it still waits.
    os.write(other, b"meanwhile\n")
    assert os.pread(fd, 7, 0) == b"synced\n"
    assert os.stat(f"{m}/log").st_size == len(b"synced\ncovered\n")
    os.mkdir(f"{m}/d")
    os.rename(f"{m}/d", f"{m}/e")
    assert not result and t.is_alive()
    # The power is cut while it is held: it fails, and persists nothing of what it covered.
    assert [f["path"] for f in lazy.command("halt")["fsyncs_failed"]] == ["/log"]
    t.join()
    assert isinstance(result[0], OSError) and result[0].errno == errno.EIO
    report = lazy.command("crash")
    assert {f["path"] for f in report["dropped_data"]} == {"/log", "/other"}
    clear(lazy, "slow")
    for x in (fd, other, dfd):
        os.close(x)
    with open(f"{m}/log", "rb") as f:
        assert f.read() == b"synced\n"
    assert sorted(os.listdir(m)) == ["log", "other"]
