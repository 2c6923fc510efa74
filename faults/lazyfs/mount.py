"""Run lazyfs as a child process and make sure no mount outlives its owner."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from faults.node.wire import ControlError, request, wait_for_socket

PR_SET_PDEATHSIG = 1
PROJECT_ROOT = str(Path(__file__).resolve().parents[2])


class MountError(Exception):
    """lazyfs could not be mounted or unmounted."""


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def is_mounted(path: str) -> bool:
    """True if a FUSE filesystem is the top mount at `path` in /proc/mounts (a dead FUSE daemon's
    mount counts too). Another mount there does not count: a shared volume's disk mounts lazyfs
    over a bind mount (``harness.cluster.SHARED_MOUNT``), which must never be unmounted for it."""
    real = os.path.realpath(path)
    with open("/proc/mounts") as f:
        types = [line.split()[2] for line in f if line.strip() and _unescape(line.split()[1]) == real]
    return bool(types) and types[-1].startswith("fuse")


def fuse_available() -> str | None:
    """None if FUSE mounts can work here, else the reason they cannot."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian package fuse3)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not readable and writable by this user"
    return None


def force_unmount(path: str) -> None:
    """Lazy-unmount a mount whose daemon is gone (otherwise the path says 'Transport endpoint is not connected')."""
    if is_mounted(path):
        subprocess.run(["fusermount3", "-u", "-z", path], check=False, capture_output=True)


def _term_with_parent() -> None:
    """In the child before exec: SIGTERM (a clean unmount) if the owner dies without stopping us."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class LazyMount:
    """A lazyfs process owned by the caller: `with LazyMount(b, m, sock) as lz: lz.command("crash")`."""

    def __init__(
        self,
        backing: str,
        mountpoint: str,
        control: str,
        *,
        threads: bool = True,
        max_threads: int | None = None,
        sync_backing: bool = False,
        names: str = "strict",
        flush_on_unmount: bool = True,
        output: IO[Any] | int | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.backing = backing
        self.mountpoint = mountpoint
        self.control = control
        self.args = [
            sys.executable, "-m", "faults.lazyfs",
            "--backing", backing, "--mount", mountpoint, "--control", control, "--foreground",
        ]  # fmt: skip
        if not threads:
            self.args.append("--single-thread")
        if max_threads is not None:
            self.args += ["--max-threads", str(max_threads)]
        if sync_backing:
            self.args.append("--sync-backing")
        if names != "strict":
            self.args += ["--names", names]
        if not flush_on_unmount:
            self.args.append("--no-flush-on-unmount")
        self.output = output
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15.0) -> LazyMount:
        if is_mounted(self.mountpoint):
            raise MountError(f"{self.mountpoint} is already a mount point; unmount it first")
        os.makedirs(self.backing, exist_ok=True)
        os.makedirs(self.mountpoint, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (PROJECT_ROOT, env.get("PYTHONPATH")) if p)
        # Own session: signals aimed at a broker's process group never reach the filesystem.
        self.proc = subprocess.Popen(
            self.args,
            env=env,
            stdout=self.output,
            stderr=self.output,
            start_new_session=True,
            preexec_fn=_term_with_parent if self.die_with_parent else None,
        )
        proc = self.proc
        try:
            wait_for_socket(self.control, timeout, alive=lambda: proc.poll() is None)
            deadline = time.monotonic() + timeout
            while not is_mounted(self.mountpoint):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise MountError(f"lazyfs did not mount {self.mountpoint} (exit status {proc.poll()})")
                time.sleep(0.02)
        except (ControlError, MountError) as e:
            self.stop()
            raise MountError(f"lazyfs failed to start: {e}") from None
        return self

    def command(self, line: str, timeout: float = 60.0) -> dict[str, Any]:
        return request(self.control, line, timeout=timeout)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM makes libfuse leave its loop and unmount; anything left is lazily unmounted."""
        proc, self.proc = self.proc, None
        code = None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            code = proc.returncode
        force_unmount(self.mountpoint)
        return code

    def __enter__(self) -> LazyMount:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
