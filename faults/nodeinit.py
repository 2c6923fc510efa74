"""The init of a node container: `python -m faults.nodeinit [options] -- CMD ARGS...`.

It owns the broker as a child in its own process group, so that a fault can kill, stop or
freeze exactly the broker (and whatever it forked) while the container, its network namespace
and the lazy filesystem -- the node's "page cache" -- live on. Faults arrive as JSON lines on a
unix socket (`python -m faults.nodectl CMD` inside the container). Each reply says what was
done, to which pids, with which signal, when, and for power loss what the filesystem dropped.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from faults.lazyfs.model import NAMES
from faults.lazyfs.mount import LazyMount, MountError
from faults.node.wire import ControlError, LineServer, now_iso

NODE_SOCKET = "/run/brokerchaos/node.sock"
LAZYFS_SOCKET = "/run/brokerchaos/lazyfs.sock"
#: Where a power cut leaves a copy of the unsynced writes it drops (the latest cut's only), beside
#: the control socket: ``/run/brokerchaos/unsynced`` in a node container.
UNSYNCED_DIR = "unsynced"
PR_SET_CHILD_SUBREAPER = 36


class CommandError(Exception):
    """A control command that cannot be carried out; the reply says why."""


def _processes() -> dict[int, tuple[int, int, bytes]]:
    """pid -> (ppid, pgid, state) for every live process, from /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != b"Z":
            out[int(entry)] = (int(fields[1]), int(fields[2]), fields[0])
    return out


def group_pids(pgid: int) -> list[int]:
    """Pids whose process group is `pgid` (read from /proc, so it works for grandchildren too)."""
    return sorted(pid for pid, (_, g, _) in _processes().items() if g == pgid)


def in_container_init() -> bool:
    """True only when PID 1 is a container's init (tini, docker-init) and it is our parent.

    Then everything reparented to PID 1 or to us, other than the processes we keep, was
    started by the broker. Anywhere else (a host, a test) PID 1's children are the whole
    system and must never be touched.
    """
    if os.getppid() != 1:
        return False
    try:
        with open("/proc/1/comm") as f:
            return f.read().strip() in ("tini", "docker-init", "tini-static")
    except OSError:
        return False


def broker_pids(leader: int, keep: set[int]) -> list[int]:
    """Every process of the broker: the leader's process group and all descendants of its
    members, plus anything orphaned onto the init (a daemonised helper such as epmd).

    The group alone is not enough: a broker started through ``su`` or ``runuser`` (Debian's
    rabbitmq-server) runs its VM in a process group of its own, which a group kill misses.
    ``keep`` (the init, lazyfs and PID 1) and everything a ``docker exec`` started (parent 0)
    are never included, and orphans are only adopted inside a container (``in_container_init``).
    """
    procs = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    roots = {pid for pid, (_, g, _) in procs.items() if g == leader}
    if leader in procs:
        roots.add(leader)
    if in_container_init():  # orphans reparented to tini or to us can only be the broker's
        for parent in keep:
            roots.update(c for c in children.get(parent, []) if c not in keep)
    found: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in found or pid in keep:
            continue
        found.add(pid)
        stack.extend(children.get(pid, []))
    return sorted(found)


class Node:
    """The broker child and its faults. One lock: commands never interleave."""

    def __init__(
        self,
        command: list[str],
        *,
        lazy: LazyMount | None = None,
        log_file: str | None = None,
        stop_timeout: float = 30.0,
        out: IO[bytes] | None = None,
        unsynced_dir: str = "/run/brokerchaos/" + UNSYNCED_DIR,
    ) -> None:
        self.command = command
        self.lazy = lazy
        self.stop_timeout = stop_timeout
        self.out = out if out is not None else sys.stdout.buffer
        self.log = open(log_file, "ab") if log_file else None  # noqa: SIM115 - lives as long as the node
        self.lock = threading.RLock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.state = "stopped"
        self.starts = 0
        self.last_exit: dict[str, Any] | None = None
        self.timer: threading.Timer | None = None
        self.closing = False
        self.out_lock = threading.Lock()
        self.unsynced_dir = unsynced_dir

    # ------------------------------------------------------------ child lifecycle
    def _emit(self, data: bytes) -> None:
        with self.out_lock:
            self.out.write(data)
            self.out.flush()
            if self.log is not None:
                self.log.write(data)
                self.log.flush()

    def _pump(self, stream: IO[bytes]) -> None:
        fd = stream.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            self._emit(chunk)
        stream.close()

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def start(self) -> dict[str, Any]:
        with self.lock:
            self._cancel_timer()
            if self.state != "stopped":
                assert self.proc is not None
                return {"action": "start", "already": self.state, "pid": self.proc.pid}
            self.proc = subprocess.Popen(
                self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
            )
            assert self.proc.stdout is not None
            threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()
            self.starts += 1
            self.state = "running"
            return {"action": "start", "pid": self.proc.pid, "pgid": self.proc.pid, "at": now_iso()}

    def _restart_later(self, delay: float | None) -> dict[str, Any]:
        if delay is None:
            return {"restart": "on start"}
        self.timer = threading.Timer(delay, self._timed_start)
        self.timer.daemon = True
        self.timer.start()
        return {"restart_after": delay}

    def _timed_start(self) -> None:
        with self.lock:
            if self.timer is None or self.closing:
                return
            self.timer = None
            reply = self.start()
        self._emit(f"[nodeinit] restarted broker: {json.dumps(reply)}\n".encode())

    def reaped(self, pid: int, status: int) -> None:
        """Called by the reaper for every child that ends; only the broker's leader changes the state.

        Lock-free on purpose: a command holding the lock may be waiting for exactly this exit.
        """
        proc = self.proc
        if proc is None or pid != proc.pid:
            return
        proc.returncode = os.waitstatus_to_exitcode(status)
        self.last_exit = {"pid": pid, "code": proc.returncode, "at": now_iso()}
        if self.state in ("running", "paused"):
            self.state = "stopped"
            self._emit(f"[nodeinit] broker exited on its own: {json.dumps(self.last_exit)}\n".encode())

    def _keep(self) -> set[int]:
        keep = {1, os.getpid()}
        if self.lazy is not None and self.lazy.pid:
            keep.add(self.lazy.pid)
        return keep

    def _signal_group(self, sig: signal.Signals) -> dict[str, Any]:
        """Signal every process of the broker (see ``broker_pids``), not only its group."""
        assert self.proc is not None
        pgid = self.proc.pid
        pids = broker_pids(pgid, self._keep())
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return {"signal": sig.name, "pgid": pgid, "pids": pids, "at": now_iso()}

    def _wait_gone(self, timeout: float) -> bool:
        assert self.proc is not None
        pgid = self.proc.pid
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = broker_pids(pgid, self._keep())
            if self.proc.returncode is not None and not left:
                return True
            for pid in left:  # forked while we were killing
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)
        return False

    def _kill(self, then: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
        """SIGKILL the broker and wait until it is gone; ``then`` runs between the two (its reply is kept)."""
        if self.state == "stopped":
            return {"signal": None, "note": "broker was not running"}
        done = self._signal_group(signal.SIGKILL)
        self.state = "stopped"
        if then is not None:
            done.update(then())
        gone = self._wait_gone(10.0)
        done.update(gone=gone, gone_at=now_iso())
        return done

    def crash(self, restart_after: float | None = None) -> dict[str, Any]:
        with self.lock:
            self._cancel_timer()
            done = {"action": "crash", **self._kill()}
            done.update(self._restart_later(restart_after))
            return done

    def power_loss(
        self, torn: str | None = None, restart_after: float | None = None, at: float | None = None
    ) -> dict[str, Any]:
        """Cut power now, or at the wall-clock time ``at`` (UNIX seconds), so that several nodes
        told the same ``at`` die within a scheduler tick of each other (a rack losing power)."""
        cue = _wait_until(at) if at is not None else None
        with self.lock:
            if self.lazy is None:
                raise CommandError(
                    "power-loss needs the data directory on lazyfs (start nodeinit with --lazyfs); "
                    "without it this would only be a crash, since the page cache keeps unsynced writes"
                )
            self._cancel_timer()
            # The disk loses power with the CPU: a thread killed inside an fsync stays in the kernel
            # until lazyfs answers it, and an fsync that completed after the kill would persist data
            # a power cut must drop. `halt` fails the fsyncs in flight (the killed threads never see
            # it) before the wait for the broker's exit; `crash` then drops what was not persisted.
            halt = self._halt_disk
            done: dict[str, Any] = {"action": "power-loss", **self._kill(then=halt)}
            if cue is not None:
                done["cue"] = cue
            try:
                saved = self.lazy.command(f"save {self.unsynced_dir}")
                done["unsynced_saved"] = saved if saved.get("ok") else {"error": saved.get("error")}
                fs = self.lazy.command(f"torn {torn}" if torn is not None else "crash")
            except ControlError as e:
                raise CommandError(f"broker killed but lazyfs did not answer: {e}") from None
            if not fs.get("ok"):
                raise CommandError(f"broker killed but lazyfs refused: {fs.get('error')}")
            done["lazyfs"] = fs
            done.update(self._restart_later(restart_after))
            return done

    def _halt_disk(self) -> dict[str, Any]:
        assert self.lazy is not None
        try:
            reply = self.lazy.command("halt")
        except ControlError as e:
            raise CommandError(f"broker killed but lazyfs did not answer: {e}") from None
        if not reply.get("ok"):
            raise CommandError(f"broker killed but lazyfs refused to halt: {reply.get('error')}")
        return {"fsyncs_cut": reply["fsyncs_failed"]}

    def sync(self) -> dict[str, Any]:
        """Write everything back to the lazy filesystem's disk, like sync(1) (nothing to do without it)."""
        if self.lazy is None:
            return {"lazyfs": None}
        try:
            fs = self.lazy.command("flush")
        except ControlError as e:
            raise CommandError(f"lazyfs did not answer: {e}") from None
        return {
            "lazyfs": {
                "ok": fs.get("ok"),
                "persisted_bytes": (fs.get("persisted") or {}).get("unsynced_bytes"),
            }
        }

    def disk(self, line: str) -> dict[str, Any]:
        """Disk fault rules of the lazy filesystem (``add JSON``, ``clear [ID]``, ``list``), while the broker runs."""
        if self.lazy is None:
            raise CommandError("disk faults need the data directory on lazyfs (start nodeinit with --lazyfs)")
        try:
            fs = self.lazy.command(f"fault {line}")
        except ControlError as e:
            raise CommandError(f"lazyfs did not answer: {e}") from None
        if not fs.get("ok"):
            raise CommandError(f"lazyfs refused: {fs.get('error')}")
        return {"lazyfs": fs}

    def stop(self, timeout: float | None = None) -> dict[str, Any]:
        with self.lock:
            self._cancel_timer()
            if self.state == "stopped":
                return {"action": "stop", "note": "broker was not running"}
            timeout = self.stop_timeout if timeout is None else timeout
            steps = []
            if self.state == "paused":
                steps.append(self._signal_group(signal.SIGCONT))
            steps.append(self._signal_group(signal.SIGTERM))
            self.state = "stopping"
            if not self._wait_gone(timeout):
                steps.append(self._signal_group(signal.SIGKILL))
                self._wait_gone(10.0)
            self.state = "stopped"
            return {"action": "stop", "steps": steps, "exit": self.last_exit, "stopped_at": now_iso()}

    def pause(self) -> dict[str, Any]:
        return self._transition("pause", signal.SIGSTOP, "running", "paused")

    def resume(self) -> dict[str, Any]:
        return self._transition("resume", signal.SIGCONT, "paused", "running")

    def _transition(self, action: str, sig: signal.Signals, before: str, after: str) -> dict[str, Any]:
        """Signal the group to go from state ``before`` to ``after``; refused from any other state."""
        with self.lock:
            if self.state != before:
                raise CommandError(f"cannot {action}: broker is {self.state}")
            done = self._signal_group(sig)
            self.state = after
            return {"action": action, **done}

    def status(self) -> dict[str, Any]:
        with self.lock:
            running = self.proc is not None and self.state != "stopped"
            # Every live process of the broker whatever the state says, with its /proc state
            # (``T`` stopped, ``R``/``S``/``D`` running): what a fault's evidence reads.
            tree = broker_pids(self.proc.pid, self._keep()) if self.proc is not None else []
            procs = _processes()
            return {
                "state": self.state,
                "pid": self.proc.pid if running and self.proc else None,
                "pids": tree if running else [],
                "alive": {str(p): procs[p][2].decode() for p in tree if p in procs},
                "starts": self.starts,
                "restarts": max(self.starts - 1, 0),
                "restart_pending": self.timer is not None,
                "last_exit": self.last_exit,
                "lazyfs": None
                if self.lazy is None
                else {"pid": self.lazy.pid, "mount": self.lazy.mountpoint},
            }

    # ------------------------------------------------------------ control protocol
    def handle(self, line: str) -> dict[str, Any]:
        started = now_iso()
        try:
            req = json.loads(line) if line.startswith("{") else {"cmd": line.split()[0]}
            cmd = str(req.get("cmd", ""))
            if cmd == "ping":
                body: dict[str, Any] = {}
            elif cmd == "status":
                body = self.status()
            elif cmd == "start":
                body = self.start()
            elif cmd == "stop":
                body = self.stop(_opt_float(req, "timeout"))
            elif cmd == "crash":
                body = self.crash(_opt_float(req, "restart_after"))
            elif cmd == "power-loss":
                torn = req.get("torn")
                body = self.power_loss(
                    None if torn is None else str(torn),
                    _opt_float(req, "restart_after"),
                    _opt_float(req, "at"),
                )
            elif cmd == "sync":
                body = self.sync()
            elif cmd == "disk":
                body = self.disk(str(req.get("line", "")))
            elif cmd == "pause":
                body = self.pause()
            elif cmd == "resume":
                body = self.resume()
            else:
                raise CommandError(
                    f"unknown command {cmd!r} (status, start, stop, crash, power-loss, pause, resume, disk, sync)"
                )
        except (CommandError, ValueError) as e:
            return {"ok": False, "error": str(e), "started": started, "finished": now_iso()}
        return {"ok": True, "command": cmd, "started": started, "finished": now_iso(), **body}

    def shutdown(self) -> dict[str, Any]:
        """Init is going away: stop the broker gracefully, then unmount lazyfs (which writes back)."""
        with self.lock:
            self.closing = True
            done: dict[str, Any] = {"stop": self.stop()}
            if self.lazy is not None:
                done["lazyfs_exit"] = self.lazy.stop()
            if self.log is not None:
                self.log.close()
                self.log = None
            return done


def _opt_float(req: dict[str, Any], key: str) -> float | None:
    v = req.get(key)
    if v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        raise CommandError(f"{key} must be a number of seconds, not {v!r}") from None


def _wait_until(at: float) -> dict[str, Any]:
    """Sleep until the wall-clock time ``at``; say how late the wake-up was (an arrival after ``at``
    cuts at once, and its lateness shows how far apart the nodes died)."""
    left = at - time.time()
    while left > 0:
        time.sleep(min(left, 0.05))
        left = at - time.time()
    return {"at": at, "late_ms": round(-left * 1000, 3), "woke": now_iso()}


def _reaper(node: Node, lazy: LazyMount | None, stop: threading.Event) -> None:
    """Reap every child, including orphans handed to us as subreaper; Popen-owned ones via their Popen."""
    while not stop.is_set():
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None
        if info is None:
            stop.wait(0.02)
            continue
        pid = info.si_pid
        if lazy is not None and lazy.proc is not None and pid == lazy.proc.pid:
            if lazy.proc.poll() is None:
                stop.wait(0.02)  # someone is in Popen.wait() for it right now
            continue
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            continue
        node.reaped(pid, status)


def _set_subreaper() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: orphans go to PID 1 instead


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--" in args:
        i = args.index("--")
        opts, command = args[:i], args[i + 1 :]
    else:
        opts, command = args, []
    p = argparse.ArgumentParser(prog="python -m faults.nodeinit", usage="%(prog)s [options] -- CMD ARGS...")
    p.add_argument("--data-dir", help="the broker's data directory")
    p.add_argument("--lazyfs", action="store_true", help="mount lazyfs at --data-dir (power loss possible)")
    p.add_argument("--backing", help="lazyfs backing directory (default: DATA_DIR.backing)")
    p.add_argument(
        "--lazyfs-names",
        choices=NAMES,
        default="ext4-ordered",
        help="the lazy filesystem's model, when a file's name is durable: ext4-ordered (default: "
        "with any fsync), xfs (with an fsync of an object the log has not committed) or strict "
        "(only with an fsync of its directory)",
    )
    p.add_argument("--control", default=os.environ.get("BROKERCHAOS_NODE_SOCKET", NODE_SOCKET))
    p.add_argument("--lazyfs-control", default=LAZYFS_SOCKET)
    p.add_argument("--log-file", help="also append the broker's output here")
    p.add_argument("--stop-timeout", type=float, default=30.0, help="SIGTERM grace before SIGKILL")
    p.add_argument("--no-start", action="store_true", help="wait for a `start` command")
    a = p.parse_args(opts)
    if not command:
        p.error("no broker command given after --")
    if a.lazyfs and not a.data_dir:
        p.error("--lazyfs needs --data-dir")

    lazy = None
    if a.data_dir:
        os.makedirs(a.data_dir, exist_ok=True)
    if a.lazyfs:
        backing = a.backing or a.data_dir.rstrip("/") + ".backing"
        lazy = LazyMount(backing, a.data_dir, a.lazyfs_control, names=a.lazyfs_names, die_with_parent=True)
        try:
            lazy.start()
        except MountError as e:
            print(f"nodeinit: {e}", file=sys.stderr)
            return 1
    _set_subreaper()
    node = Node(
        command,
        lazy=lazy,
        log_file=a.log_file,
        stop_timeout=a.stop_timeout,
        unsynced_dir=os.path.join(os.path.dirname(os.path.abspath(a.control)), UNSYNCED_DIR),
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        server = LineServer(a.control, node.handle).start()
    except OSError as e:
        print(f"nodeinit: cannot listen on {a.control}: {e.strerror}", file=sys.stderr)
        if lazy is not None:
            lazy.stop()
        return 1
    reaper_stop = threading.Event()
    reaper = threading.Thread(target=_reaper, args=(node, lazy, reaper_stop), daemon=True)
    reaper.start()
    if not a.no_start:
        try:
            node.start()
        except OSError as e:
            print(f"nodeinit: cannot start {command[0]}: {e.strerror}", file=sys.stderr)
    while not stop.wait(0.5):
        pass
    server.close()
    done = node.shutdown()
    reaper_stop.set()
    node._emit(f"[nodeinit] shut down: {json.dumps(done)}\n".encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
