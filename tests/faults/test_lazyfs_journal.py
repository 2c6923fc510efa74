"""When names become durable, mounted: strictly with their directory's fsync, or with a journal commit
(ext4-ordered, xfs; ``journal`` is ext4-ordered's old name). The models unmounted:
``test_lazyfs_models.py``."""

from __future__ import annotations

import os
import tempfile

import pytest

from faults.lazyfs import LazyMount, fuse_available

REASON = fuse_available()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"needs FUSE: {REASON}")]


def _scenario(names: str) -> dict[str, bytes | None]:
    """mkdir + create + write + fsync(file) with no directory fsync; a second file never fsynced."""
    with (
        tempfile.TemporaryDirectory(prefix="lzj") as tmp,
        LazyMount(f"{tmp}/b", f"{tmp}/m", f"{tmp}/c.sock", names=names) as lz,
    ):
        m = lz.mountpoint
        os.mkdir(f"{m}/sub")
        other = os.open(f"{m}/sub/other", os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(other, b"never fsynced")
        fd = os.open(f"{m}/sub/wal", os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"record")
        os.fsync(fd)
        os.close(fd)
        os.close(other)
        assert lz.command("crash")["ok"]
        out: dict[str, bytes | None] = {}
        for name in ("sub/wal", "sub/other"):
            try:
                with open(f"{m}/{name}", "rb") as f:
                    out[name] = f.read()
            except FileNotFoundError:
                out[name] = None
        return out


def test_strict_names_need_the_directory_fsync() -> None:
    assert _scenario("strict") == {"sub/wal": None, "sub/other": None}


@pytest.mark.parametrize("model", ["journal", "ext4-ordered", "xfs"])
def test_a_journal_commits_every_name_with_a_new_files_fsync(model: str) -> None:
    # The fsynced file is whole; the other one's name came with the commit, its data did not.
    assert _scenario(model) == {"sub/wal": b"record", "sub/other": b""}


@pytest.mark.parametrize(
    ("names", "expected"), [("strict", b"old"), ("journal", b"new"), ("ext4-ordered", b"new"), ("xfs", b"")]
)
def test_replace_by_rename_without_fsync(names: str, expected: bytes) -> None:
    """write tmp, rename over the old file, no fsync of either; another file's fsync commits the names.

    ext4 writes the renamed file first (auto_da_alloc), so it is never empty; xfs does not."""
    with (
        tempfile.TemporaryDirectory(prefix="lzr") as tmp,
        LazyMount(f"{tmp}/b", f"{tmp}/m", f"{tmp}/c.sock", names=names) as lz,
    ):
        m = lz.mountpoint
        with open(f"{m}/schema", "wb") as f:
            f.write(b"old")
        lz.command("flush")
        with open(f"{m}/schema.tmp", "wb") as f:
            f.write(b"new")
        os.rename(f"{m}/schema.tmp", f"{m}/schema")
        fd = os.open(f"{m}/wal", os.O_WRONLY | os.O_CREAT, 0o644)
        os.fsync(fd)
        os.close(fd)
        assert lz.command("crash")["ok"]
        with open(f"{m}/schema", "rb") as f:
            assert f.read() == expected


@pytest.mark.parametrize("how", ["open", "create"])
def test_o_trunc_truncates(how: str) -> None:
    """libfuse3 hands O_TRUNC to open/create (atomic_o_trunc): a rewrite must not keep a stale tail."""
    with (
        tempfile.TemporaryDirectory(prefix="lzt") as tmp,
        LazyMount(f"{tmp}/b", f"{tmp}/m", f"{tmp}/c.sock", names="journal") as lz,
    ):
        path = f"{lz.mountpoint}/nodes"
        with open(path, "wb") as f:
            f.write(b"[n1,n2,n3].\n")
        lz.command("flush")
        flags = os.O_WRONLY | os.O_TRUNC | (os.O_CREAT if how == "create" else 0)
        fd = os.open(path, flags, 0o644)
        os.write(fd, b"[n1,n3].\n")
        os.fsync(fd)
        os.close(fd)
        assert lz.command("crash")["ok"]
        with open(path, "rb") as f:
            assert f.read() == b"[n1,n3].\n"
