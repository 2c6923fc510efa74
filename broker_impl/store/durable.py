"""Making names durable, not just data.

An fsync of a file persists its bytes but not its directory entry: a file
created (or renamed) and fsync'ed can still vanish on power loss until its
parent directory is fsync'ed too (POSIX leaves it to the filesystem; the lazy
filesystem's ``strict`` model, which the reference broker's power-loss runs use,
loses it). Every file and directory the store creates or removes goes through
here. Both are rare (a segment roll, a new queue, retention), so the extra
directory fsync stays off the hot path.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: Path) -> None:
    """``mkdir -p`` that fsyncs the parent of every directory it creates."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            continue
        fsync_dir(d.parent)


def open_created(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` with O_CREAT; a file that did not exist gets its name made durable."""
    existed = path.exists()
    fd = os.open(path, flags | os.O_CREAT, mode)
    if not existed:
        fsync_dir(path.parent)
    return fd


def remove(path: Path) -> None:
    """Unlink ``path`` so that it stays gone after a power cut: a removal is a name change too, and
    an old segment that came back would be scanned and indexed again."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    fsync_dir(path.parent)


def remove_tree(path: Path) -> None:
    """``rm -r`` whose result survives a power cut: a deleted queue's files must not come back."""
    shutil.rmtree(path, ignore_errors=True)
    fsync_dir(path.parent)


def replace(src: Path, dst: Path) -> None:
    """Atomic rename whose result survives power loss (the source must already be fsync'ed)."""
    os.replace(src, dst)
    fsync_dir(dst.parent)


def write_file(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` so that a crash, even a power cut, leaves the old or the new
    file: write, fsync, rename into place, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    replace(tmp, path)
