"""The lazy filesystem's state: a volatile view held in memory over a durable backing directory.

Everything a program does through the mount changes only the volatile view (the "page cache").
The backing directory is the "disk": it changes only when something is persisted (fsync of a
file, fsync of a directory, the `flush` command, a clean unmount). `crash` throws the volatile
view away and re-reads the disk, which is what a machine sees after a power cut.

Durable objects are tracked by the backing inode number and held through open descriptors, so
that renaming a directory on the disk does not invalidate what we know about its contents.
Objects that are still needed but have lost their last durable name (a durable file renamed to
a name that is not durable yet) are parked in a state directory at the backing root, which is
hidden from the view and emptied at every load: on the disk they are orphans, and a power cut
loses them, as a real filesystem's orphan cleanup would.
"""

from __future__ import annotations

import bisect
import errno
import json
import os
import random
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from faults.lazyfs.diskfaults import DiskFaults
from faults.node.wire import now_iso

STATE_DIR = ".lazyfs-state"
#: The filesystem models: when a name change becomes durable, and what a journal commit carries
#: (``docs/explanation/filesystem-models.md``). ``strict`` is POSIX's letter; ``ext4-ordered`` and
#: ``xfs`` commit name changes with a journal (log) commit that a file's fsync also forces.
MODELS = ("strict", "ext4-ordered", "xfs")
#: Older spellings: ``journal`` was the ext4-ordered model before xfs was told apart from it.
ALIASES = {"journal": "ext4-ordered"}
NAMES = (*MODELS, *ALIASES)
#: Bytes of unsynced writes ``save_unsynced`` copies at most (per cut).
SAVE_CAP = 64 << 20
UTIME_NOW = -1  # utimensat's special values, once the FUSE glue has decoded them
UTIME_OMIT = -2


def model_name(name: str) -> str:
    """The model ``name`` stands for (an alias resolved); ValueError for an unknown one."""
    model = ALIASES.get(name, name)
    if model not in MODELS:
        raise ValueError(f"filesystem model {name!r}: use one of {', '.join(MODELS)}")
    return model


def _err(code: int, what: str = "") -> OSError:
    return OSError(code, os.strerror(code) + (f": {what}" if what else ""))


def _ranges(ops: list[tuple[int, int]]) -> list[list[int]]:
    """Merge contiguous (offset, length) writes so that a report of a commit log stays short."""
    out: list[list[int]] = []
    for off, n in ops:
        if n == 0:
            continue
        if out and out[-1][0] + out[-1][1] == off:
            out[-1][1] += n
        else:
            out.append([off, n])
    return out


class Node:
    __slots__ = (
        "ino", "mode", "uid", "gid", "atime", "mtime", "ctime", "links", "bino", "meta_dirty", "logged",
    )  # fmt: skip

    def __init__(self, ino: int, mode: int, uid: int, gid: int) -> None:
        now = time.time_ns()
        self.ino = ino
        self.mode = mode
        self.uid = uid
        self.gid = gid
        self.atime = self.mtime = self.ctime = now
        self.links = 0  # names in the volatile view
        self.bino: int | None = None  # inode number of the durable object in the backing dir
        self.meta_dirty = False
        #: The journal sequence of this object's latest change (``LazyState._log``); the xfs model's
        #: fsync forces the log only while this is above what the log has committed (a pinned inode).
        self.logged = 0

    def touch(self) -> None:
        self.mtime = self.ctime = time.time_ns()


class Dir(Node):
    __slots__ = ("entries", "dfd", "dparent", "dname", "ns_version", "ns_synced")

    def __init__(self, ino: int, mode: int, uid: int, gid: int) -> None:
        super().__init__(ino, mode, uid, gid)
        self.entries: dict[str, Node] = {}
        self.dfd: int | None = None
        self.dparent: Dir | None = None  # None with a dname: parked in the state dir
        self.dname: str | None = None
        #: Counts the changes of ``entries``; ``ns_synced`` is the newest count made durable, so an
        #: fsync that took its snapshot earlier never writes an older list of names over a newer one.
        self.ns_version = 0
        self.ns_synced = 0

    @property
    def ns_dirty(self) -> bool:
        return self.ns_version != self.ns_synced


class Symlink(Node):
    __slots__ = ("target",)

    def __init__(self, ino: int, mode: int, uid: int, gid: int, target: str) -> None:
        super().__init__(ino, mode, uid, gid)
        self.target = target


class File(Node):
    """File data = durable bytes below `floor`, overlaid by dirty extents, zero elsewhere, cut at `size`.

    `log` keeps the unsynced operations in the order they happened, so that a torn write can
    persist an exact prefix of them, and an fsync exactly the operations that came before it began.
    `log_base` counts the operations persisted before ``log[0]``: ``log_base + len(log)`` numbers
    every operation the file has had, which is what an fsync remembers when it starts.
    """

    __slots__ = (
        "fd", "size", "dsize", "floor", "starts", "bufs", "log", "log_base", "dirty_bytes", "parked", "opens",
    )  # fmt: skip

    def __init__(self, ino: int, mode: int, uid: int, gid: int) -> None:
        super().__init__(ino, mode, uid, gid)
        self.fd: int | None = None
        self.size = 0
        self.dsize = 0
        self.floor = 0
        self.starts: list[int] = []
        self.bufs: list[bytearray] = []
        self.log: list[tuple[str, int, bytes | None]] = []
        self.log_base = 0
        self.dirty_bytes = 0
        self.parked = False
        self.opens = 0

    @property
    def dirty(self) -> bool:
        return bool(self.log)

    def write(self, data: bytes, off: int) -> None:
        end = off + len(data)
        starts, bufs = self.starts, self.bufs
        self.log.append(("w", off, data))
        self.dirty_bytes += len(data)
        if end > self.size:
            self.size = end
        if starts and starts[-1] + len(bufs[-1]) == off:  # the append of a log
            bufs[-1] += data
            return
        i = bisect.bisect_right(starts, off) - 1
        lo = i if i >= 0 and starts[i] + len(bufs[i]) >= off else i + 1
        hi = bisect.bisect_right(starts, end)
        if lo == hi:
            starts.insert(lo, off)
            bufs.insert(lo, bytearray(data))
            return
        s0 = starts[lo]
        if hi - lo == 1 and s0 <= off and end <= s0 + len(bufs[lo]):
            bufs[lo][off - s0 : end - s0] = data
            return
        nstart = min(s0, off)
        nend = max(end, starts[hi - 1] + len(bufs[hi - 1]))
        buf = bytearray(nend - nstart)
        for k in range(lo, hi):
            buf[starts[k] - nstart : starts[k] - nstart + len(bufs[k])] = bufs[k]
        buf[off - nstart : end - nstart] = data
        starts[lo:hi] = [nstart]
        bufs[lo:hi] = [buf]

    def truncate(self, length: int) -> None:
        self.log.append(("t", length, None))
        if length < self.size:
            self.floor = min(self.floor, length)
            k = bisect.bisect_left(self.starts, length)
            del self.starts[k:]
            del self.bufs[k:]
            if self.starts and self.starts[-1] + len(self.bufs[-1]) > length:
                del self.bufs[-1][length - self.starts[-1] :]
        self.size = length

    def read(self, size: int, off: int) -> bytes:
        end = min(off + size, self.size)
        if off >= end:
            return b""
        starts, bufs = self.starts, self.bufs
        dend = min(self.floor, end)
        if not starts and self.fd is not None and dend == end:
            return os.pread(self.fd, end - off, off)
        out = bytearray(end - off)
        if self.fd is not None and off < dend:
            chunk = os.pread(self.fd, dend - off, off)
            out[: len(chunk)] = chunk
        i = max(bisect.bisect_right(starts, off) - 1, 0)
        while i < len(starts) and starts[i] < end:
            s, b = starts[i], bufs[i]
            e = s + len(b)
            if e > off:
                a, z = max(s, off), min(e, end)
                out[a - off : z - off] = memoryview(b)[a - s : z - s]
            i += 1
        return bytes(out)

    def persist(self) -> None:
        """Write the whole volatile content to the durable object; the caller made sure it exists."""
        fd = self.fd
        assert fd is not None
        if self.floor < self.dsize:
            os.ftruncate(fd, self.floor)
        for s, b in zip(self.starts, self.bufs, strict=True):
            os.pwrite(fd, b, s)
        if os.fstat(fd).st_size != self.size:
            os.ftruncate(fd, self.size)
        self.clean()

    def persist_ops(self, n: int) -> None:
        """Persist the first ``n`` unsynced operations only (what an fsync covered; later ones stay dirty).

        The overlay is left as it is: it still gives the view, and the bytes it holds for the
        persisted operations are the same ones now on the disk, so `read` and a later `persist`
        stay right. Only the log, the count of unsynced bytes and the durable size move on.
        """
        fd = self.fd
        assert fd is not None and 0 < n < len(self.log)
        for kind, off, data in self.log[:n]:
            if kind == "t":
                os.ftruncate(fd, off)
            else:
                assert data is not None
                os.pwrite(fd, data, off)
                self.dirty_bytes -= len(data)
        del self.log[:n]
        self.log_base += n
        self.dsize = os.fstat(fd).st_size

    def persist_prefix(self, keep: int) -> dict[str, Any]:
        """Apply the first `keep` unsynced bytes, in write order, to the durable object (a torn write)."""
        fd = self.fd
        assert fd is not None
        kept: list[tuple[int, int]] = []
        dropped: list[tuple[int, int]] = []
        tkept: list[int] = []
        tdropped: list[int] = []
        budget = keep
        everything = keep >= self.dirty_bytes
        stopped = False
        for kind, off, data in self.log:
            if kind == "t":
                if not stopped and (budget > 0 or everything):
                    os.ftruncate(fd, off)
                    tkept.append(off)
                else:
                    tdropped.append(off)
                continue
            assert data is not None
            n = len(data)
            take = 0 if stopped else min(n, budget)
            if take:
                os.pwrite(fd, data[:take], off)
                kept.append((off, take))
                budget -= take
            if take < n:
                dropped.append((off + take, n - take))
                stopped = True
        return {
            "kept": _ranges(kept),
            "dropped": _ranges(dropped),
            "truncates_kept": tkept,
            "truncates_dropped": tdropped,
            "kept_bytes": keep if not everything else self.dirty_bytes,
        }

    def clean(self) -> None:
        self.log_base += len(self.log)
        self.dsize = self.floor = self.size
        self.starts = []
        self.bufs = []
        self.log = []
        self.dirty_bytes = 0

    def unsynced(self) -> dict[str, Any]:
        writes = [(off, len(data)) for kind, off, data in self.log if kind == "w" and data is not None]
        return {
            "unsynced_bytes": self.dirty_bytes,
            "writes": _ranges(writes),
            "truncates": [off for kind, off, _ in self.log if kind == "t"],
        }


@dataclass
class Cover:
    """What one fsync persists when it completes, taken when it starts."""

    power: int  # the power generation it started in: after a cut it persists nothing
    file: File | None = None
    upto: int = 0  # the file's operations numbered below this (``File.log_base``)
    dirs: list[tuple[Dir, int, dict[str, Node]]] = field(default_factory=list)  # (dir, ns_version, names)
    names: int | None = None  # journal models: the name-change count this commit covers
    log: int | None = None  # journal models: the journal sequence this commit covers


class LazyState:
    """The whole filesystem; every public method takes the lock, so FUSE threads and the control thread mix safely."""

    def __init__(self, backing: str, sync_backing: bool = False, names: str = "strict") -> None:
        self.backing = os.path.abspath(backing)
        self.sync_backing = sync_backing
        #: The filesystem model (``MODELS``). ``strict``: a name is durable only when its directory
        #: is fsynced (POSIX's letter). ``ext4-ordered``: any fsync also commits every name change
        #: made so far (a jbd2 commit), and a file renamed over another is written first (ext4's
        #: ``auto_da_alloc``). ``xfs``: an fsync forces the log, committing every name change so
        #: far, only when the object has a change the log has not committed (a pinned inode); a
        #: rename over another file writes nothing first.
        self.names = model_name(names)
        self._names_committed = 0
        #: The journal sequence: bumped by every change a journal would log (names, sizes, data,
        #: metadata); ``_log_committed`` is the newest sequence a journal commit made durable.
        self._log_seq = 0
        self._log_committed = 0
        self.lock = threading.RLock()
        #: Held fsyncs (slow-fsync) wait on this with the lock released; a cleared rule or a power
        #: cut wakes them.
        self._wake = threading.Condition(self.lock)
        self._in_flight: dict[object, dict[str, Any]] = {}
        self._halted = False
        self._power = 0  # bumped by every load: an fsync from before a power cut persists nothing
        #: Bytes written through this filesystem since it was mounted, every one unsynced until an
        #: fsync: what says a broker ever held unsynced data here, whatever the instant of a cut.
        self.written_bytes = 0
        self.next_ino = 1
        self.next_fh = 1
        self.files: dict[int, File] = {}  # open file handles
        self.dirs: dict[int, Dir] = {}  # open directory handles
        self.by_bino: dict[int, Node] = {}
        self.root_fd = -1
        self.state_fd = -1
        self.root: Dir
        #: Disk fault rules (EIO, ENOSPC, slow or lying fsync); they outlive a crash, as a bad disk does.
        self.disk = DiskFaults()
        self._names_changed = 0
        self._path_cache: tuple[int, dict[int, str]] = (-1, {})
        with self.lock:
            self._load()

    # ---------------------------------------------------------------- loading
    def _ino(self) -> int:
        self.next_ino += 1
        return self.next_ino

    def _load(self) -> None:
        self._names_changed += 1
        self._power += 1
        self._halted = False
        self._wake.notify_all()
        self.root_fd = os.open(self.backing, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.mkdir(STATE_DIR, 0o700, dir_fd=self.root_fd)
        except FileExistsError:
            pass
        self.state_fd = os.open(STATE_DIR, os.O_RDONLY | os.O_DIRECTORY, dir_fd=self.root_fd)
        self._empty_dir(self.state_fd)  # parked objects have no durable name: orphans after a power cut
        st = os.fstat(self.root_fd)
        self.root = Dir(1, st.st_mode, st.st_uid, st.st_gid)
        self.root.dfd = self.root_fd
        self.root.bino = st.st_ino
        self.root.links = 1
        self.by_bino = {st.st_ino: self.root}
        self._load_dir(self.root)

    def _load_dir(self, d: Dir) -> None:
        assert d.dfd is not None
        for name in os.listdir(d.dfd):
            if d is self.root and name == STATE_DIR:
                continue
            st = os.stat(name, dir_fd=d.dfd, follow_symlinks=False)
            node = self.by_bino.get(st.st_ino) if stat.S_ISREG(st.st_mode) else None
            if node is None:
                node = self._load_node(d, name, st)
                if node is None:
                    continue
            d.entries[name] = node
            node.links += 1

    def _load_node(self, d: Dir, name: str, st: os.stat_result) -> Node | None:
        assert d.dfd is not None
        node: Node
        if stat.S_ISDIR(st.st_mode):
            sub = Dir(self._ino(), st.st_mode, st.st_uid, st.st_gid)
            sub.dfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=d.dfd)
            sub.dparent, sub.dname = d, name
            node = sub
        elif stat.S_ISREG(st.st_mode):
            f = File(self._ino(), st.st_mode, st.st_uid, st.st_gid)
            f.fd = os.open(name, os.O_RDWR, dir_fd=d.dfd)
            f.size = f.dsize = f.floor = st.st_size
            node = f
        elif stat.S_ISLNK(st.st_mode):
            node = Symlink(self._ino(), st.st_mode, st.st_uid, st.st_gid, os.readlink(name, dir_fd=d.dfd))
        else:
            return None  # sockets and fifos have no content to lose
        node.atime, node.mtime, node.ctime = st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns
        node.bino = st.st_ino
        self.by_bino[st.st_ino] = node
        if isinstance(node, Dir):
            self._load_dir(node)
        return node

    def _empty_dir(self, dfd: int) -> None:
        for name in os.listdir(dfd):
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=dfd)
                try:
                    self._empty_dir(sub)
                finally:
                    os.close(sub)
                os.rmdir(name, dir_fd=dfd)
            else:
                os.unlink(name, dir_fd=dfd)

    def _close_all(self) -> None:
        seen: set[int] = set()
        for node in list(self.by_bino.values()) + list(self.files.values()) + list(self.dirs.values()):
            fd = node.fd if isinstance(node, File) else node.dfd if isinstance(node, Dir) else None
            if fd is not None and fd not in seen and fd not in (self.root_fd,):
                seen.add(fd)
                os.close(fd)
        for node in self.walk_nodes():
            if isinstance(node, File) and node.fd is not None and node.fd not in seen:
                seen.add(node.fd)
                os.close(node.fd)
        os.close(self.state_fd)
        os.close(self.root_fd)
        self.files.clear()
        self.dirs.clear()
        self.by_bino.clear()

    def close(self) -> None:
        with self.lock:
            self._close_all()

    # ---------------------------------------------------------------- lookups
    def walk(self) -> Iterator[tuple[str, Node]]:
        """Every (path, node) of the volatile view, parents before children."""
        stack: list[tuple[str, Dir]] = [("/", self.root)]
        yield "/", self.root
        while stack:
            path, d = stack.pop()
            for name in sorted(d.entries):
                node = d.entries[name]
                p = path.rstrip("/") + "/" + name
                yield p, node
                if isinstance(node, Dir):
                    stack.append((p, node))

    def walk_nodes(self) -> Iterator[Node]:
        for _, node in self.walk():
            yield node

    def path_of(self, node: Node) -> str:
        """The view path of ``node`` for disk rules, cached until the namespace changes."""
        gen, paths = self._path_cache
        if gen != self._names_changed:
            paths = self._paths()
            self._path_cache = (self._names_changed, paths)
        return paths.get(node.ino, "<unlinked>")

    def _paths(self) -> dict[int, str]:
        out: dict[int, str] = {}
        for p, node in self.walk():
            out.setdefault(node.ino, p)
        return out

    def resolve(self, path: str) -> Node:
        node: Node = self.root
        for part in path.split("/"):
            if not part:
                continue
            if not isinstance(node, Dir):
                raise _err(errno.ENOTDIR, path)
            nxt = node.entries.get(part)
            if nxt is None:
                raise _err(errno.ENOENT, path)
            node = nxt
        return node

    def _parent(self, path: str) -> tuple[Dir, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        d = self.resolve(head)
        if not isinstance(d, Dir):
            raise _err(errno.ENOTDIR, path)
        if not name or (d is self.root and name == STATE_DIR):
            raise _err(errno.EPERM, path)
        return d, name

    def _node(self, path: str | None, fh: int | None) -> Node:
        if fh:
            node = self.files.get(fh) or self.dirs.get(fh)
            if node is not None:
                return node
            if path is None:
                raise _err(errno.EIO, "handle from before a crash")
        if path is None:
            raise _err(errno.EINVAL)
        return self.resolve(path)

    def _file(self, fh: int) -> File:
        """The file an open handle names; EIO for a handle from before a crash."""
        node = self.files.get(fh)
        if node is None:
            raise _err(errno.EIO, "handle from before a crash")
        return node

    # ---------------------------------------------------------------- FUSE operations
    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        with self.lock:
            node = self._node(path, fh)
            if isinstance(node, Dir):
                size = 4096
                nlink = 2 + sum(1 for n in node.entries.values() if isinstance(n, Dir))
            elif isinstance(node, File):
                size, nlink = node.size, node.links
            else:
                assert isinstance(node, Symlink)
                size, nlink = len(os.fsencode(node.target)), node.links
            return {
                "st_ino": node.ino,
                "st_mode": node.mode,
                "st_nlink": nlink,
                "st_uid": node.uid,
                "st_gid": node.gid,
                "st_size": size,
                "st_blocks": (size + 511) // 512,
                "st_blksize": 4096,
                "st_atime": node.atime,
                "st_mtime": node.mtime,
                "st_ctime": node.ctime,
            }

    def readdir(self, path: str | None, fh: int | None) -> list[tuple[str, dict[str, int], int]]:
        """Entries with their inode numbers: with use_ino, an entry without one is skipped by readdir(3)."""
        with self.lock:
            node = self._node(path, fh)
            if not isinstance(node, Dir):
                raise _err(errno.ENOTDIR)
            out = [
                (".", {"st_ino": node.ino, "st_mode": node.mode}, 0),
                ("..", {"st_ino": 1, "st_mode": node.mode}, 0),
            ]
            for name, child in node.entries.items():
                out.append((name, {"st_ino": child.ino, "st_mode": child.mode}, 0))
            return out

    def opendir(self, path: str) -> int:
        with self.lock:
            node = self.resolve(path)
            if not isinstance(node, Dir):
                raise _err(errno.ENOTDIR, path)
            return self._handle(self.dirs, node)

    def releasedir(self, fh: int) -> None:
        with self.lock:
            self.dirs.pop(fh, None)

    def _handle(self, table: dict[int, Any], node: Node) -> int:
        self.next_fh += 1
        table[self.next_fh] = node
        return self.next_fh

    def open(self, path: str, truncate: bool = False) -> int:
        with self.lock:
            node = self.resolve(path)
            if isinstance(node, Dir):
                raise _err(errno.EISDIR, path)
            if not isinstance(node, File):
                raise _err(errno.ELOOP, path)
            return self._open_file(node, truncate)

    def _open_file(self, node: File, truncate: bool) -> int:
        """A new handle on ``node``, emptied first for O_TRUNC (a logged change when it had data)."""
        if truncate and node.size:
            node.truncate(0)
            node.touch()
            self._log(node)
        node.opens += 1
        return self._handle(self.files, node)

    def release(self, fh: int) -> None:
        with self.lock:
            node = self.files.pop(fh, None)
            if node is not None:
                node.opens -= 1
                self._maybe_close(node)

    def _log(self, *nodes: Node) -> None:
        """A change a journal would log (a name, a size, data, metadata): the objects are pinned."""
        self._log_seq += 1
        for node in nodes:
            node.logged = self._log_seq

    def _add(self, d: Dir, name: str, node: Node) -> None:
        self._names_changed += 1
        self._log(d, node)
        d.entries[name] = node
        node.links += 1
        d.ns_version += 1
        d.touch()

    def _new_name(self, path: str) -> tuple[Dir, str]:
        d, name = self._parent(path)
        if name in d.entries:
            raise _err(errno.EEXIST, path)
        return d, name

    def _existing(self, path: str) -> tuple[Dir, str, Node]:
        d, name = self._parent(path)
        node = d.entries.get(name)
        if node is None:
            raise _err(errno.ENOENT, path)
        return d, name, node

    def create(self, path: str, mode: int, uid: int, gid: int, truncate: bool = False) -> int:
        with self.lock:
            d, name = self._parent(path)
            node = d.entries.get(name)
            if node is None:
                node = File(self._ino(), stat.S_IFREG | (mode & 0o7777), uid, gid)
                self._add(d, name, node)
            elif not isinstance(node, File):
                raise _err(errno.EISDIR, path)
            return self._open_file(node, truncate)

    def mkdir(self, path: str, mode: int, uid: int, gid: int) -> None:
        with self.lock:
            d, name = self._new_name(path)
            self._add(d, name, Dir(self._ino(), stat.S_IFDIR | (mode & 0o7777), uid, gid))

    def symlink(self, path: str, target: str, uid: int, gid: int) -> None:
        with self.lock:
            d, name = self._new_name(path)
            self._add(d, name, Symlink(self._ino(), stat.S_IFLNK | 0o777, uid, gid, target))

    def readlink(self, path: str) -> str:
        with self.lock:
            node = self.resolve(path)
            if not isinstance(node, Symlink):
                raise _err(errno.EINVAL, path)
            return node.target

    def link(self, path: str, existing: str) -> None:
        with self.lock:
            node = self.resolve(existing)
            if isinstance(node, Dir):
                raise _err(errno.EPERM, existing)
            d, name = self._new_name(path)
            self._add(d, name, node)
            node.ctime = time.time_ns()

    def _remove(self, d: Dir, name: str) -> Node:
        self._names_changed += 1
        node = d.entries.pop(name)
        self._log(d, node)
        node.links -= 1
        node.ctime = time.time_ns()
        d.ns_version += 1
        d.touch()
        return node

    def unlink(self, path: str) -> None:
        with self.lock:
            d, name, node = self._existing(path)
            if isinstance(node, Dir):
                raise _err(errno.EISDIR, path)
            self._remove(d, name)

    def rmdir(self, path: str) -> None:
        with self.lock:
            d, name, node = self._existing(path)
            if not isinstance(node, Dir):
                raise _err(errno.ENOTDIR, path)
            if node.entries:
                raise _err(errno.ENOTEMPTY, path)
            self._remove(d, name)

    def rename(self, old: str, new: str) -> None:
        with self.lock:
            sd, sname, node = self._existing(old)
            dd, dname = self._parent(new)
            if isinstance(node, Dir) and any(anc is node for anc in self._ancestors(dd)):
                raise _err(errno.EINVAL, new)
            target = dd.entries.get(dname)
            if target is node:
                return
            if target is not None:
                if isinstance(target, Dir):
                    if not isinstance(node, Dir):
                        raise _err(errno.EISDIR, new)
                    if target.entries:
                        raise _err(errno.ENOTEMPTY, new)
                elif isinstance(node, Dir):
                    raise _err(errno.ENOTDIR, new)
                if self.names == "ext4-ordered" and isinstance(node, File) and node.dirty:
                    # ext4's auto_da_alloc: a file renamed over another has its data written
                    # before the rename commits, so replace-by-rename never leaves an empty file.
                    self._persist_file(node)
                self._remove(dd, dname)
            self._remove(sd, sname)
            self._add(dd, dname, node)

    def _ancestors(self, d: Dir) -> Iterator[Dir]:
        """Walk up by searching, since nodes keep no parent pointer in the volatile view."""
        parents: dict[int, Dir] = {}
        for _, n in self.walk():
            if isinstance(n, Dir):
                for child in n.entries.values():
                    if isinstance(child, Dir):
                        parents[child.ino] = n
        cur: Dir | None = d
        while cur is not None:
            yield cur
            cur = parents.get(cur.ino)

    def read(self, fh: int, size: int, off: int) -> bytes:
        with self.lock:
            node = self._file(fh)
            if self.disk:
                self.disk.on_read(self.path_of(node))
            return node.read(size, off)

    def write(self, fh: int, data: bytes, off: int) -> int:
        with self.lock:
            node = self._file(fh)
            if self.disk:
                self.disk.on_write(self.path_of(node), len(data))
            node.write(data, off)
            self.written_bytes += len(data)
            node.mtime = node.ctime = time.time_ns()
            self._log(node)
            return len(data)

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> None:
        with self.lock:
            node = self._node(path, fh)
            if not isinstance(node, File):
                raise _err(errno.EISDIR)
            node.truncate(length)
            node.touch()
            self._log(node)

    def chmod(self, path: str | None, mode: int, fh: int | None = None) -> None:
        with self.lock:
            node = self._node(path, fh)
            node.mode = (node.mode & ~0o7777) | (mode & 0o7777)
            node.ctime = time.time_ns()
            node.meta_dirty = True
            self._log(node)

    def chown(self, path: str | None, uid: int, gid: int, fh: int | None = None) -> None:
        with self.lock:
            node = self._node(path, fh)
            if uid != -1:
                node.uid = uid
            if gid != -1:
                node.gid = gid
            node.ctime = time.time_ns()
            node.meta_dirty = True
            self._log(node)

    def utimens(self, path: str | None, times: tuple[int, int] | None, fh: int | None = None) -> None:
        with self.lock:
            node = self._node(path, fh)
            now = time.time_ns()
            atime, mtime = times if times is not None else (UTIME_NOW, UTIME_NOW)
            if atime != UTIME_OMIT:
                node.atime = now if atime == UTIME_NOW else atime
            if mtime != UTIME_OMIT:
                node.mtime = now if mtime == UTIME_NOW else mtime
            node.ctime = now
            node.meta_dirty = True
            self._log(node)

    def statfs(self) -> dict[str, int]:
        sv = os.statvfs(self.backing)
        out = {k: getattr(sv, k) for k in dir(sv) if k.startswith("f_") and k != "f_fsid"}
        with self.lock:
            free = self.disk.free_bytes()
        if free is not None:  # a disk-full rule: df sees only what it leaves
            out["f_bfree"] = out["f_bavail"] = min(out["f_bavail"], free // max(1, out["f_bsize"]))
        return out

    def _persist_names(self) -> None:
        for _, node in list(self.walk()):
            if isinstance(node, Dir):
                self._persist_dir(node)

    def _cover(self, node: Node) -> Cover:
        """What an fsync of ``node`` starting now must persist: the state at its start, not later."""
        cover = Cover(self._power)
        if isinstance(node, File):
            cover.file, cover.upto = node, node.log_base + len(node.log)
        dirs = [node] if isinstance(node, Dir) else []
        if self._forces_journal(node):
            cover.log = self._log_seq
            if self._names_committed != self._names_changed:
                # A journal commit: every directory's names as they are now.
                cover.names = self._names_changed
                dirs = [d for _, d in self.walk() if isinstance(d, Dir) and d is not node] + dirs
        cover.dirs = [(d, d.ns_version, dict(d.entries)) for d in dirs]
        return cover

    def _complete(self, cover: Cover) -> None:
        """Persist what an fsync covered; operations that came while it waited stay unsynced."""
        if cover.file is not None:
            self._persist_file(cover.file, upto=cover.upto)
        for d, version, entries in cover.dirs:
            self._persist_dir(d, entries, version)
        if cover.names is not None:
            self._names_committed = max(self._names_committed, cover.names)
        if cover.log is not None:
            self._log_committed = max(self._log_committed, cover.log)

    def _forces_journal(self, node: Node) -> bool:
        """Whether an fsync of ``node`` commits the journal, and with it every name change so far.

        ``strict`` has no journal. ``ext4-ordered``: always (a simplification: jbd2 commits only
        when the inode has a change in the running transaction, which every written file has).
        ``xfs``: only when the object has a change the log has not committed yet (``xfs_file_fsync``
        and ``xfs_dir_fsync`` force the log only for a pinned inode).
        """
        if self.names == "strict":
            return False
        return self.names == "ext4-ordered" or node.logged > self._log_committed

    def fsync(self, path: str | None, fh: int | None) -> None:
        """fsync/fdatasync of a file or a directory, as a kernel serves it: concurrently with everything else.

        The fsync covers what was done to the object before it started (its snapshot is taken
        at entry, under the lock). A slow-fsync rule then holds it, with the lock released, so
        that writes, reads and name operations of other requests go on; at the end it persists
        exactly its snapshot. A power cut while it waits (``halt``, ``crash``, ``torn``) ends it
        with EIO and it persists nothing.
        """
        with self.lock:
            node = self._node(path, fh)
            if self._halted:
                raise _err(errno.EIO, "the power is off")
            delay, lie, where = 0.0, False, ""
            rules: tuple[str, ...] = ()
            if self.disk:
                where = self.path_of(node)
                delay, lie, rules = self.disk.on_fsync(
                    where, node.dirty_bytes if isinstance(node, File) else 0
                )
            if lie:
                return  # reported done, nothing persisted: the writes stay unsynced
            cover = self._cover(node)
            if delay:
                self._hold(cover, where, delay, rules)
            self._complete(cover)

    def _hold(self, cover: Cover, where: str, delay: float, rules: tuple[str, ...]) -> None:
        """Wait with the lock released until the delay is over; a power cut meanwhile fails the fsync."""
        key = object()
        self._in_flight[key] = {"path": where, "since": now_iso(), "delay_ms": round(delay * 1000, 3)}
        deadline = time.monotonic() + delay
        try:
            while not self._halted and cover.power == self._power and self._held(rules, deadline):
                self._wake.wait(max(deadline - time.monotonic(), 0.001))
        finally:
            del self._in_flight[key]
        if self._halted or cover.power != self._power:
            raise _err(errno.EIO, "the power was cut while the fsync was in flight")

    def _held(self, rules: tuple[str, ...], deadline: float) -> bool:
        """Whether a held fsync still waits: until its delay is over or every rule that slowed it is cleared."""
        return time.monotonic() < deadline and any(r in self.disk.rules for r in rules)

    def wake(self) -> None:
        """Re-check every held fsync (a rule was cleared: the disk is no longer slow)."""
        with self.lock:
            self._wake.notify_all()

    def halt(self) -> dict[str, Any]:
        """The power goes off: no fsync persists any more, and the ones in flight end with EIO.

        Reads and writes still reach the volatile view (they are lost at the ``crash`` or
        ``torn`` that must follow, which also turns the power back on).
        """
        with self.lock:
            self._halted = True
            failed = [dict(v) for v in self._in_flight.values()]
            self._wake.notify_all()
            return {"fsyncs_failed": failed}

    # ---------------------------------------------------------------- persistence
    def _sync(self, fd: int) -> None:
        if self.sync_backing:
            os.fsync(fd)

    def _park_name(self, node: Node) -> str:
        return f"o{node.ino}"

    def _persist_file(self, f: File, upto: int | None = None) -> None:
        """Persist ``f`` (only its operations numbered below ``upto``, if given) and its metadata."""
        if f.fd is None:
            # No durable name yet: the data goes to a parked object; only a directory fsync names it.
            f.fd = os.open(
                self._park_name(f), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=self.state_fd
            )
            f.parked = True
            f.bino = os.fstat(f.fd).st_ino
            self.by_bino[f.bino] = f
            f.meta_dirty = True
        assert f.fd is not None
        if f.log:
            n = len(f.log) if upto is None else upto - f.log_base
            if n >= len(f.log):
                f.persist()
            elif n > 0:
                f.persist_ops(n)
        self._persist_meta(f, f.fd)
        os.utime(f.fd, ns=(f.atime, f.mtime))
        self._sync(f.fd)

    def _persist_meta(self, node: Node, fd: int) -> None:
        if node.meta_dirty:
            os.fchmod(fd, node.mode & 0o7777)
            os.fchown(fd, node.uid, node.gid)
            node.meta_dirty = False

    def _persist_dir(
        self, d: Dir, entries: dict[str, Node] | None = None, version: int | None = None
    ) -> None:
        """Make the directory's names durable: its current ones, or ``entries`` as they were at ``version``."""
        if entries is None or version is None:
            entries, version = d.entries, d.ns_version
        elif version < d.ns_synced:
            return  # a later fsync already made newer names durable
        if d.dfd is None:
            os.mkdir(self._park_name(d), d.mode & 0o7777, dir_fd=self.state_fd)
            self._adopt_dir(d, None, self._park_name(d))
        assert d.dfd is not None
        durable: dict[str, int] = {}
        for name in os.listdir(d.dfd):
            if d is self.root and name == STATE_DIR:
                continue
            durable[name] = os.stat(name, dir_fd=d.dfd, follow_symlinks=False).st_ino
        for name, bino in durable.items():
            node = entries.get(name)
            if node is None or node.bino != bino:
                self._detach(d, name, bino)
        for name, node in entries.items():
            if node.bino is None or durable.get(name) != node.bino:
                self._place(d, name, node)
        self._persist_meta(d, d.dfd)
        d.ns_synced = version
        self._sync(d.dfd)

    def _adopt_dir(self, d: Dir, parent: Dir | None, name: str) -> None:
        pfd = parent.dfd if parent is not None else self.state_fd
        d.dfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=pfd)
        d.bino = os.fstat(d.dfd).st_ino
        d.dparent, d.dname = parent, name
        self.by_bino[d.bino] = d
        d.meta_dirty = True

    def _detach(self, d: Dir, name: str, bino: int) -> None:
        """Remove a durable name; an object still alive in the view is parked rather than lost."""
        assert d.dfd is not None
        obj = self.by_bino.get(bino)
        st = os.stat(name, dir_fd=d.dfd, follow_symlinks=False)
        alive = obj is not None and obj.links > 0
        if stat.S_ISDIR(st.st_mode):
            if isinstance(obj, Dir) and alive:
                os.rename(name, self._park_name(obj), src_dir_fd=d.dfd, dst_dir_fd=self.state_fd)
                obj.dparent, obj.dname = None, self._park_name(obj)
                return
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=d.dfd)
            try:
                holder = Dir(0, 0, 0, 0)
                holder.dfd = sub
                for child in os.listdir(sub):
                    self._detach(holder, child, os.stat(child, dir_fd=sub, follow_symlinks=False).st_ino)
            finally:
                os.close(sub)
            os.rmdir(name, dir_fd=d.dfd)
            if isinstance(obj, Dir):
                if obj.dfd is not None:
                    os.close(obj.dfd)
                obj.dfd = None
                self._forget(obj)
            return
        if isinstance(obj, File) and alive and st.st_nlink == 1 and not obj.parked:
            os.link(name, self._park_name(obj), src_dir_fd=d.dfd, dst_dir_fd=self.state_fd)
            obj.parked = True
        os.unlink(name, dir_fd=d.dfd)
        if obj is not None and not (isinstance(obj, File) and (obj.parked or st.st_nlink > 1)):
            self._forget(obj)  # the backing inode is gone; its number may be reused

    def _forget(self, obj: Node) -> None:
        if obj.bino is not None and self.by_bino.get(obj.bino) is obj:
            del self.by_bino[obj.bino]
        obj.bino = None
        self._maybe_close(obj)

    def _maybe_close(self, obj: Node) -> None:
        """An unlinked file's descriptor lives as long as someone has the file open."""
        if (
            isinstance(obj, File)
            and obj.fd is not None
            and obj.bino is None
            and obj.links == 0
            and obj.opens == 0
        ):
            os.close(obj.fd)
            obj.fd = None

    def _place(self, d: Dir, name: str, node: Node) -> None:
        assert d.dfd is not None
        if isinstance(node, File):
            if node.fd is None:
                # The name becomes durable before any data of the file did: an empty file.
                node.fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, node.mode & 0o7777, dir_fd=d.dfd)
                node.bino = os.fstat(node.fd).st_ino
                self.by_bino[node.bino] = node
                node.meta_dirty = True
            else:
                os.link(f"/proc/self/fd/{node.fd}", name, dst_dir_fd=d.dfd, follow_symlinks=True)
                if node.parked:
                    os.unlink(self._park_name(node), dir_fd=self.state_fd)
                    node.parked = False
            self._persist_meta(node, node.fd)
        elif isinstance(node, Dir):
            if node.dfd is None:
                os.mkdir(name, node.mode & 0o7777, dir_fd=d.dfd)
                self._adopt_dir(node, d, name)
            else:
                assert node.dname is not None
                src = node.dparent.dfd if node.dparent is not None else self.state_fd
                os.rename(node.dname, name, src_dir_fd=src, dst_dir_fd=d.dfd)
                node.dparent, node.dname = d, name
            assert node.dfd is not None
            self._persist_meta(node, node.dfd)
        elif isinstance(node, Symlink):
            os.symlink(node.target, name, dir_fd=d.dfd)
            node.bino = os.stat(name, dir_fd=d.dfd, follow_symlinks=False).st_ino
            self.by_bino[node.bino] = node
            os.chown(name, node.uid, node.gid, dir_fd=d.dfd, follow_symlinks=False)

    # ---------------------------------------------------------------- control
    def status(self) -> dict[str, Any]:
        with self.lock:
            files = self._unsynced_files()
            dirs = [p for p, n in self.walk() if isinstance(n, Dir) and (n.ns_dirty or n.dfd is None)]
            return {
                "files": files,
                "dirs_with_unsynced_entries": sorted(dirs),
                "unsynced_bytes": sum(f["unsynced_bytes"] for f in files),
                "unsynced_files": len(files),
                "fsyncs_in_flight": [dict(v) for v in self._in_flight.values()],
                "halted": self._halted,
            }

    def _unsynced_files(self) -> list[dict[str, Any]]:
        """Each file with unsynced changes, by path (``<unlinked ino N>`` once no name leads to it),
        with what is unsynced in it."""
        paths = self._paths()
        files = [
            {"path": paths.get(f.ino, f"<unlinked ino {f.ino}>"), **f.unsynced()} for f in self._dirty_files()
        ]
        return sorted(files, key=lambda f: f["path"])

    def _dirty_files(self) -> list[File]:
        seen: dict[int, File] = {}
        for node in list(self.walk_nodes()) + list(self.files.values()):
            if isinstance(node, File) and node.dirty:
                seen[node.ino] = node
        return list(seen.values())

    def flush(self) -> dict[str, Any]:
        """Persist everything, like sync(1): file data first, then names from the root down."""
        with self.lock:
            if self._halted:
                raise _err(errno.EIO, "the power is off (halt): crash or torn turns it back on")
            before = self.status()
            for f in self._dirty_files():
                if f.links > 0:
                    self._persist_file(f)
            self._persist_names()
            self._names_committed = self._names_changed
            self._log_committed = self._log_seq
            return {"persisted": before}

    def _names(self) -> dict[str, tuple[str, int | None]]:
        out: dict[str, tuple[str, int | None]] = {}
        for p, node in self.walk():
            kind = "dir" if isinstance(node, Dir) else "file" if isinstance(node, File) else "symlink"
            out[p] = (kind, node.bino)
        return out

    def save_unsynced(self, directory: str) -> dict[str, Any]:
        """Copy every unsynced write (file, offset, bytes) to ``directory`` before a cut drops it:
        ``unsynced.bin`` holds the bytes, ``index.json`` where each write sits in it. What a broker
        plugin reads to say which messages the writes held (``SAVE_CAP`` bytes at most)."""
        with self.lock:
            paths = self._paths()
            os.makedirs(directory, exist_ok=True)
            index: list[dict[str, Any]] = []
            pos, truncated = 0, False
            with open(os.path.join(directory, "unsynced.bin"), "wb") as out:
                for f in sorted(self._dirty_files(), key=lambda f: paths.get(f.ino, "")):
                    path = paths.get(f.ino, f"<unlinked ino {f.ino}>")
                    for kind, off, data in f.log:
                        if kind != "w" or data is None:
                            continue
                        if pos + len(data) > SAVE_CAP:
                            truncated = True
                            break
                        out.write(data)
                        index.append({"path": path, "offset": off, "length": len(data), "at": pos})
                        pos += len(data)
            with open(os.path.join(directory, "index.json"), "w") as f_index:
                json.dump({"writes": index, "truncated": truncated}, f_index)
            return {"saved": directory, "saved_bytes": pos, "writes": len(index), "truncated": truncated}

    def crash(self) -> dict[str, Any]:
        """Drop every unsynced change; the view becomes what the backing directory holds."""
        with self.lock:
            dropped = self._unsynced_files()
            before = self._names()
            self._close_all()
            self._load()
            after = self._names()
            return {
                "dropped_data": dropped,
                "dropped_bytes": sum(f["unsynced_bytes"] for f in dropped),
                "names_lost": sorted(p for p, v in before.items() if after.get(p) != v),
                "names_restored": sorted(p for p, v in after.items() if before.get(p) != v),
                "written_bytes": self.written_bytes,
            }

    def torn(self, seed: int | str) -> dict[str, Any]:
        """Persist a seeded random prefix of each file's unsynced writes, then crash.

        Each file draws from its own generator seeded by (seed, path), so the prefix kept for a
        file does not depend on which other files happened to be dirty.
        """
        with self.lock:
            paths = self._paths()
            kept = []
            for f in sorted(self._dirty_files(), key=lambda f: paths.get(f.ino, "")):
                path = paths.get(f.ino, f"<unlinked ino {f.ino}>")
                rng = random.Random(f"{seed}:{path}")
                keep = rng.randint(0, f.dirty_bytes) if f.dirty_bytes else rng.randint(0, 1)
                if f.links == 0 or f.fd is None or f.parked:
                    continue  # no durable name: whatever we kept would be an orphan after the cut
                total = f.dirty_bytes
                res = f.persist_prefix(keep)
                f.clean()
                self._sync(f.fd)
                kept.append({"path": path, "unsynced_bytes": total, **res})
            report = self.crash()
            report["torn"] = kept
            report["kept_bytes"] = sum(k["kept_bytes"] for k in kept)
            report["dropped_bytes"] += sum(k["unsynced_bytes"] - k["kept_bytes"] for k in kept)
            return report
