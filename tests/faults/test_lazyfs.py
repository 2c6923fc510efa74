"""lazyfs mounted for real (FUSE on the host): what a power cut keeps, byte for byte."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_impl.store.durable import fsync_dir as _fsync_dir
from faults.lazyfs import LazyMount, fuse_available, is_mounted

REASON = fuse_available()
pytestmark = [
    pytest.mark.skipif(REASON is not None, reason=f"needs FUSE: {REASON}"),
]


@pytest.fixture
def lazy() -> Iterator[LazyMount]:
    # Unix socket paths are limited to 108 bytes: pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="lzt") as tmp:
        lz = LazyMount(f"{tmp}/backing", f"{tmp}/mnt", f"{tmp}/ctl.sock")
        with lz:
            yield lz
        assert not is_mounted(lz.mountpoint), "lazyfs left its mount behind"


def _write(path: str, data: bytes, *, sync: bool, append: bool = False) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


# A separate program, so that the kernel, not this test process, owns the writes.
WRITER = r"""
import os, sys
root, seed = sys.argv[1], int(sys.argv[2])
import random
rng = random.Random(seed)
for name in ("a.log", "b.log"):
    fd = os.open(os.path.join(root, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for i in range(20):
        os.write(fd, rng.randbytes(rng.randint(1, 3000)))
        if i == 9:
            os.fsync(fd)
    os.close(fd)
dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY); os.fsync(dfd); os.close(dfd)
"""


def _run_writer(root: str, seed: int) -> dict[str, bytes]:
    subprocess.run([sys.executable, "-c", WRITER, root, str(seed)], check=True)
    return {n: Path(root, n).read_bytes() for n in ("a.log", "b.log")}


def _synced_part(seed: int) -> dict[str, bytes]:
    """What the writer had fsynced: its first ten records of each file."""
    rng = random.Random(seed)
    out = {}
    for name in ("a.log", "b.log"):
        recs = [rng.randbytes(rng.randint(1, 3000)) for _ in range(20)]
        out[name] = b"".join(recs[:10])
    return out


def test_crash_drops_exactly_the_unsynced_writes(lazy: LazyMount) -> None:
    m = lazy.mountpoint
    seen = _run_writer(m, 1)
    synced = _synced_part(1)
    status = lazy.command("status")
    assert {f["path"]: f["unsynced_bytes"] for f in status["files"]} == {
        f"/{n}": len(seen[n]) - len(synced[n]) for n in seen
    }
    report = lazy.command("crash")
    assert report["ok"] and report["dropped_bytes"] == status["unsynced_bytes"]
    for name in seen:
        assert Path(m, name).read_bytes() == synced[name]
        assert Path(lazy.backing, name).read_bytes() == synced[name]
        dropped = next(f for f in report["dropped_data"] if f["path"] == f"/{name}")
        assert dropped["writes"] == [[len(synced[name]), len(seen[name]) - len(synced[name])]]


def test_torn_keeps_a_seeded_prefix_the_same_for_the_same_seed(lazy: LazyMount) -> None:
    m = lazy.mountpoint
    outcomes = []
    for _ in range(2):
        for n in ("a.log", "b.log"):
            if os.path.exists(f"{m}/{n}"):
                os.unlink(f"{m}/{n}")
        _fsync_dir(Path(m))
        seen = _run_writer(m, 2)
        synced = _synced_part(2)
        report = lazy.command("torn 1234")
        kept = {t["path"]: t["kept_bytes"] for t in report["torn"]}
        contents = {}
        for name in seen:
            got = Path(m, name).read_bytes()
            assert got.startswith(synced[name]) and seen[name].startswith(got)
            assert len(got) == len(synced[name]) + kept[f"/{name}"]
            assert Path(lazy.backing, name).read_bytes() == got
            contents[name] = got
        outcomes.append(contents)
    assert outcomes[0] == outcomes[1]


def test_file_fsync_without_directory_fsync_loses_a_new_file(lazy: LazyMount) -> None:
    m = lazy.mountpoint
    _write(f"{m}/data-only", b"synced data", sync=True)  # fsync(file) only
    _write(f"{m}/name-only", b"unsynced data", sync=False)
    _fsync_dir(Path(m))  # both names durable; only data-only's bytes
    _write(f"{m}/orphan", b"fsynced but never named", sync=True)
    lazy.command("crash")
    assert sorted(os.listdir(m)) == ["data-only", "name-only"]
    assert Path(m, "data-only").read_bytes() == b"synced data"
    assert Path(m, "name-only").read_bytes() == b""  # the name survived, the data did not


def test_atomic_replace_pattern_survives_and_is_all_or_nothing(lazy: LazyMount) -> None:
    m = lazy.mountpoint
    _write(f"{m}/config", b"version 1", sync=True)
    _fsync_dir(Path(m))
    _write(f"{m}/config.tmp", b"version 2", sync=True)
    os.rename(f"{m}/config.tmp", f"{m}/config")
    lazy.command("crash")  # rename never made durable: the old version, whole
    assert os.listdir(m) == ["config"]
    assert Path(m, "config").read_bytes() == b"version 1"

    _write(f"{m}/config.tmp", b"version 2", sync=True)
    os.rename(f"{m}/config.tmp", f"{m}/config")
    _fsync_dir(Path(m))
    lazy.command("crash")
    assert os.listdir(m) == ["config"]
    assert Path(m, "config").read_bytes() == b"version 2"


def test_flush_persists_everything_and_tree_operations_work(lazy: LazyMount) -> None:
    m = lazy.mountpoint
    os.makedirs(f"{m}/d1/d2")
    _write(f"{m}/d1/d2/f", b"x" * 70000, sync=False)
    os.symlink("top/d2/f", f"{m}/ln")
    os.link(f"{m}/d1/d2/f", f"{m}/hard")
    os.rename(f"{m}/d1", f"{m}/top")
    with open(f"{m}/top/d2/f", "r+b") as f:
        f.seek(65536)
        f.write(b"y" * 10)
        f.truncate(65546)
    assert lazy.command("flush")["ok"]
    assert lazy.command("status")["unsynced_bytes"] == 0
    lazy.command("crash")
    assert sorted(os.listdir(m)) == ["hard", "ln", "top"]
    assert Path(m, "ln").read_bytes() == b"x" * 65536 + b"y" * 10
    assert os.stat(f"{m}/hard").st_ino == os.stat(f"{m}/top/d2/f").st_ino
    assert os.stat(f"{lazy.backing}/hard").st_nlink == 2


def test_bad_arguments_end_in_one_line(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "faults.lazyfs",
            "--backing",
            str(tmp_path / "nope"),
            "--mount",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "does not exist" in r.stderr
    (tmp_path / "b").mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "faults.lazyfs", "--backing", str(tmp_path / "b"), "--mount", str(tmp_path)]
        + ["--max-threads", "0"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stderr == "lazyfs: --max-threads must be at least 1\n"
    r = subprocess.run(
        [sys.executable, "-m", "faults.lazyfs.ctl", str(tmp_path / "none.sock"), "status"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and r.stderr.startswith("lazyfs.ctl: cannot reach")


@pytest.mark.parametrize(("journal", "sync"), [("DELETE", "EXTRA"), ("WAL", "FULL")])
def test_sqlite_keeps_every_durable_commit(lazy: LazyMount, journal: str, sync: str) -> None:
    """A real program's durability contract holds: commits made durable survive, later ones do not."""
    import sqlite3

    db = f"{lazy.mountpoint}/t.db"
    c = sqlite3.connect(db)
    c.execute(f"pragma journal_mode={journal}")
    c.execute(f"pragma synchronous={sync}")
    c.execute("create table t(x)")
    for i in range(30):
        c.execute("insert into t values (?)", (i,))
        c.commit()
    c.execute("pragma synchronous=OFF")
    for i in range(30, 60):
        c.execute("insert into t values (?)", (i,))
        c.commit()
    c.close()
    assert lazy.command("crash")["dropped_bytes"] > 0
    c = sqlite3.connect(db)
    try:
        assert c.execute("pragma integrity_check").fetchone() == ("ok",)
        assert c.execute("select count(*), max(x) from t").fetchone() == (30, 29)
    finally:
        c.close()
