"""FUSE glue: maps libfuse3 callbacks onto LazyState and runs the control socket next to the mount."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import threading
import warnings
from typing import Any

import mfusepy

from faults.lazyfs.model import UTIME_NOW, UTIME_OMIT, LazyState
from faults.node.wire import LineServer

log = logging.getLogger("faults.lazyfs")


class LazyOps(mfusepy.Operations):
    """Paths may be None: with `nopath` libfuse hands us the handle only, which saves a path walk per write."""

    use_ns = True
    flag_nopath = True
    flag_nullpath_ok = True

    def __init__(self, state: LazyState, control: str | None, flush_on_unmount: bool = True) -> None:
        self.state = state
        self.control = control
        self.flush_on_unmount = flush_on_unmount
        self.server: LineServer | None = None
        self.mounted = False

    # Threads must start after libfuse has daemonized, hence here and not in __init__.
    def init(self, path: str) -> None:
        self.mounted = True
        if self.control:
            self.server = LineServer(self.control, self.command).start()

    def destroy(self, path: str) -> None:
        if self.server is not None:
            self.server.close()
        if self.flush_on_unmount and not self.state.status()["halted"]:
            self.state.flush()  # a clean unmount writes everything back, as umount(8) does
        self.state.close()

    def command(self, line: str) -> dict[str, Any]:
        return run_command(self.state, line)

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        return self.state.getattr(path, fh)

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        return self.state.readdir(path, fh)

    def opendir(self, path: str) -> int:
        return self.state.opendir(path)

    def releasedir(self, path: str, fh: int) -> int:
        self.state.releasedir(fh)
        return 0

    def open(self, path: str, flags: int) -> int:
        # libfuse3 asks the kernel for atomic O_TRUNC: the truncation arrives here, not as a setattr.
        return self.state.open(path, truncate=bool(flags & os.O_TRUNC))

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        uid, gid, _ = mfusepy.fuse_get_context()
        return self.state.create(path, mode, uid, gid, truncate=bool(flags & os.O_TRUNC))

    def release(self, path: str, fh: int) -> int:
        self.state.release(fh)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0  # close(2) is not a durability point

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return self.state.read(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        return self.state.write(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        self.state.truncate(path, length, fh)
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self.state.fsync(path, fh)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        self.state.fsync(path, fh)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        uid, gid, _ = mfusepy.fuse_get_context()
        self.state.mkdir(path, mode, uid, gid)
        return 0

    def rmdir(self, path: str) -> int:
        self.state.rmdir(path)
        return 0

    def unlink(self, path: str) -> int:
        self.state.unlink(path)
        return 0

    def rename(self, old: str, new: str) -> int:
        self.state.rename(old, new)
        return 0

    def link(self, target: str, source: str) -> int:
        self.state.link(target, source)
        return 0

    def symlink(self, target: str, source: str) -> int:
        uid, gid, _ = mfusepy.fuse_get_context()
        self.state.symlink(target, source, uid, gid)
        return 0

    def readlink(self, path: str) -> str:
        return self.state.readlink(path)

    def chmod(self, path: str, mode: int, fh: int | None = None) -> int:
        self.state.chmod(path, mode, fh)
        return 0

    def chown(self, path: str, uid: int, gid: int, fh: int | None = None) -> int:
        self.state.chown(path, uid, gid, fh)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None, fh: int | None = None) -> int:
        self.state.utimens(path, times, fh)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        return self.state.statfs()


def run_command(state: LazyState, line: str) -> dict[str, Any]:
    """The control protocol: `status`, `flush` (alias `checkpoint`), `halt`, `crash`, `torn SEED`, `ping`,
    and `fault add JSON` / `fault clear [ID]` / `fault list` for disk fault rules (``diskfaults``)."""
    from faults.node.wire import now_iso

    parts = line.split()
    cmd, args = (parts[0].lower(), parts[1:]) if parts else ("", [])
    started = now_iso()
    if cmd == "ping":
        body: dict[str, Any] = {}
    elif cmd == "status":
        body = state.status()
    elif cmd in ("flush", "checkpoint", "sync"):
        try:
            body = state.flush()
        except OSError as e:
            return {"ok": False, "error": f"flush: {e.strerror}"}
    elif cmd == "halt":
        body = state.halt()
    elif cmd == "crash":
        body = state.crash()
    elif cmd == "save":
        if len(args) != 1:
            return {"ok": False, "error": "usage: save DIR"}
        try:
            body = state.save_unsynced(args[0])
        except OSError as e:
            return {"ok": False, "error": f"save: {e.strerror}"}
    elif cmd == "fault":
        return _fault_command(state, line, started)
    elif cmd == "torn":
        if len(args) != 1:
            return {"ok": False, "error": "usage: torn SEED"}
        body = state.torn(args[0])
        body["seed"] = args[0]
    else:
        return {
            "ok": False,
            "error": f"unknown command {cmd!r} (status, flush, halt, save DIR, crash, torn SEED, fault, ping)",
        }
    return {"ok": True, "command": cmd, "started": started, "finished": now_iso(), **body}


def _fault_command(state: LazyState, line: str, started: str) -> dict[str, Any]:
    from faults.node.wire import now_iso

    parts = line.split(None, 2)
    sub = parts[1].lower() if len(parts) > 1 else ""
    try:
        with state.lock:
            if sub == "add" and len(parts) == 3:
                body: dict[str, Any] = {"rule": state.disk.add(json.loads(parts[2]))}
            elif sub == "clear":
                body = {"cleared": state.disk.clear(parts[2].strip() if len(parts) == 3 else None)}
                state.wake()  # fsyncs held by a cleared slow-fsync rule complete now
            elif sub == "list":
                body = {"rules": state.disk.list()}
            else:
                return {"ok": False, "error": "usage: fault add JSON | fault clear [ID] | fault list"}
    except (ValueError, TypeError) as e:
        return {"ok": False, "error": f"fault {sub}: {e}"}
    return {"ok": True, "command": f"fault {sub}", "started": started, "finished": now_iso(), **body}


_pinned = threading.local()


def _ts(ts: Any) -> int:
    if ts.tv_nsec == (1 << 30) - 1:
        return UTIME_NOW
    if ts.tv_nsec == (1 << 30) - 2:
        return UTIME_OMIT
    return int(ts.tv_sec * 10**9 + ts.tv_nsec)


class _Fuse(mfusepy.FUSE):
    """mfusepy drops the file handle on truncate/chmod/chown/utimens; with `nopath` we need it."""

    def _wrapper(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        # libfuse's pool threads are not Python's: a callback on one gets a Python thread state
        # made for the call and freed after it, which made every request several times slower.
        # One extra, never-released PyGILState_Ensure keeps the thread's state for its lifetime.
        if not getattr(_pinned, "done", False):
            ctypes.pythonapi.PyGILState_Ensure()
            _pinned.done = True
        return super()._wrapper(func, *args, **kwargs)

    def _fh(self, fip: Any) -> int | None:
        return fip.contents.fh if fip else None

    def _path(self, path: bytes | None) -> str | None:
        return None if path is None else path.decode(self.encoding, self.errors)

    def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
        return self.operations.truncate(self._path(path), length, self._fh(fip))

    def chmod_fuse_3(self, path: bytes | None, mode: int, fip: Any) -> int:
        return self.operations.chmod(self._path(path), mode, self._fh(fip))

    def chown_fuse_3(self, path: bytes | None, uid: int, gid: int, fip: Any) -> int:
        if mfusepy.c_uid_t(uid + 1).value == 0:
            uid = -1
        if mfusepy.c_gid_t(gid + 1).value == 0:
            gid = -1
        return self.operations.chown(self._path(path), uid, gid, self._fh(fip))

    def utimens_fuse_3(self, path: bytes | None, buf: Any, fip: Any) -> int:
        times = None
        if buf:
            times = (_ts(buf.contents.actime), _ts(buf.contents.modtime))
        return self.operations.utimens(self._path(path), times, self._fh(fip))


def serve(
    backing: str,
    mountpoint: str,
    control: str | None,
    *,
    foreground: bool = True,
    threads: bool = True,
    max_threads: int | None = None,
    sync_backing: bool = False,
    names: str = "strict",
    flush_on_unmount: bool = True,
    debug: bool = False,
) -> None:
    """Mount and block until unmounted (SIGTERM/SIGINT or `fusermount3 -u` end it cleanly).

    With ``threads`` (the default) libfuse serves requests from a pool of threads, as a kernel
    serves system calls: a held fsync does not stop the requests behind it. The model's lock
    keeps its state whole; ``threads=False`` is the old one-request-at-a-time loop. ``max_threads``
    caps the pool (libfuse's default is 10): each held fsync occupies one thread, so the cap must
    exceed the fsyncs a program holds at once, or its other requests wait again.
    """
    state = LazyState(backing, sync_backing=sync_backing, names=names)
    ops = LazyOps(state, control, flush_on_unmount)
    opts: dict[str, Any] = {
        "fsname": "lazyfs",
        "subtype": "lazyfs",
        "default_permissions": True,
        # No kernel caching of names or attributes: after a crash the view must change at once.
        "attr_timeout": 0,
        "entry_timeout": 0,
        "negative_timeout": 0,
        "hard_remove": True,
        "use_ino": True,  # hard links share an inode number, as programs expect
        "nopath": True,
    }
    if threads and max_threads:
        opts["max_threads"] = max_threads
    if os.geteuid() == 0:
        opts["allow_other"] = True  # brokers often run as their own user inside the container
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            _Fuse(ops, mountpoint, foreground=foreground, nothreads=not threads, debug=debug, **opts)
        except RuntimeError:
            # libfuse reports a loop ended by SIGTERM as an error; after a mount that is a normal exit.
            if not ops.mounted:
                raise
