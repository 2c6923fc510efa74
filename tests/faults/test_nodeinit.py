"""The node init for real: a child broker stand-in writing through lazyfs, faults through nodectl."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from faults.lazyfs import fuse_available, is_mounted
from faults.lazyfs.mount import PROJECT_ROOT
from tests.polling import until

ENV = {**os.environ, "PYTHONPATH": PROJECT_ROOT}


def child(boot: bytes, then: str) -> str:
    """A broker stand-in: writes ``boot`` to its log and fsyncs it (data and name), says it is
    up, then runs ``then`` (``fd`` is the log)."""
    return rf"""
import os, sys, time
d = sys.argv[1]
fd = os.open(os.path.join(d, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.write(fd, {boot!r})
os.fsync(fd)
dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY); os.fsync(dfd); os.close(dfd)
print("broker up", flush=True)
{then}
"""


# Fsyncs its log once at boot, then appends ticks that are never fsynced.
CHILD = child(
    b"boot\n",
    """i = 0
while True:
    os.write(fd, b"tick %d\\n" % i)
    i += 1
    time.sleep(0.01)""",
)


class Init:
    def __init__(self, tmp: str, lazyfs: bool, child: str = CHILD) -> None:
        self.tmp = tmp
        self.data = f"{tmp}/data"
        self.sock = f"{tmp}/node.sock"
        self.log_file = f"{tmp}/broker.log"
        args = [sys.executable, "-m", "faults.nodeinit", "--data-dir", self.data, "--control", self.sock]
        args += ["--log-file", self.log_file, "--stop-timeout", "2"]
        if lazyfs:
            args += ["--lazyfs", "--backing", f"{tmp}/backing", "--lazyfs-control", f"{tmp}/lazy.sock"]
        args += ["--", sys.executable, "-c", child, self.data]
        self.proc = subprocess.Popen(args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        wait_for(lambda: os.path.exists(self.sock) and self.ctl("status")["state"] == "running", "init ready")

    def ctl(self, *args: str) -> dict[str, Any]:
        r = subprocess.run(
            [sys.executable, "-m", "faults.nodectl", "--socket", self.sock, *args],
            env=ENV,
            capture_output=True,
            text=True,
            timeout=60,
        )
        reply: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
        assert (r.returncode == 0) == bool(reply.get("ok")), r
        return reply

    def log(self) -> bytes:
        return Path(self.data, "log").read_bytes()

    def terminate(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=60)
        return self.proc.returncode, out.decode()


def wait_for(cond: Callable[[], bool], what: str) -> None:
    """Poll ``cond`` until it holds (no deadline: tests/polling.py); a file not there yet is "not yet"."""
    until(cond, what, ignore=(OSError, ValueError, IndexError))


def _proc_state(pid: int) -> str:
    """The kernel's one-letter state of a process (R running, S sleeping, T stopped, Z zombie)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not: it runs no code)."""
    try:
        return _proc_state(pid) != "Z"
    except FileNotFoundError:
        return False


def settled(read: Callable[[], bytes], what: str) -> bytes:
    """The value once two reads 0.2 s apart agree: writes already in flight (through FUSE) land
    first. No deadline (tests/polling.py): ``what`` names the wait in a hang guard's stack."""
    prev = read()
    while True:
        time.sleep(0.2)
        now = read()
        if now == prev:
            return now
        prev = now


def _init(lazyfs: bool) -> Iterator[Init]:
    with tempfile.TemporaryDirectory(prefix="nit") as tmp:
        init = Init(tmp, lazyfs)
        try:
            yield init
        finally:
            try:
                init.terminate()
            finally:
                if init.proc.poll() is None:
                    init.proc.kill()
                    init.proc.wait()
                wait_for(lambda: not is_mounted(init.data), "the mount to go away")


@pytest.fixture
def lazy_init() -> Iterator[Init]:
    reason = fuse_available()
    if reason:
        pytest.skip(f"needs FUSE: {reason}")
    yield from _init(True)


@pytest.fixture
def plain_init() -> Iterator[Init]:
    yield from _init(False)


def test_crash_keeps_unsynced_data_power_loss_drops_it(lazy_init: Init) -> None:
    n = lazy_init
    wait_for(lambda: n.log().count(b"tick") >= 3, "ticks")
    before = n.log()
    pid = n.ctl("status")["pid"]
    crash = n.ctl("crash")
    assert crash["signal"] == "SIGKILL" and pid in crash["pids"] and crash["gone"]
    after = settled(n.log, "the log after the crash")
    assert after.startswith(before) and after.count(b"tick") >= before.count(b"tick")  # page cache survived
    # Nothing writes any more: the broker is gone and the init, its node stopped, does not restart it.
    assert not _alive(pid) and n.ctl("status")["state"] == "stopped"
    assert n.log() == after

    assert n.ctl("start")["pid"] != pid
    wait_for(
        lambda: n.log().count(b"boot") == 2 and n.log().rsplit(b"boot", 1)[1].count(b"tick") >= 3, "reboot"
    )
    snapshot = n.log()
    loss = n.ctl("power-loss")
    assert loss["ok"] and loss["lazyfs"]["command"] == "crash"
    assert loss["fsyncs_cut"] == []  # the disk was halted between the kill and the crash; no fsync was held
    lost = n.log()
    # Everything up to the second boot's fsync survives; the ticks after it are gone.
    assert lost.endswith(b"boot\n") and lost.count(b"boot") == 2 and snapshot.startswith(lost)
    dropped = {f["path"]: f for f in loss["lazyfs"]["dropped_data"]}
    assert dropped["/log"]["writes"][0][0] == len(lost)
    assert loss["lazyfs"]["dropped_bytes"] >= len(snapshot) - len(lost)

    n.ctl("start")
    status = n.ctl("status")
    assert status["state"] == "running" and status["restarts"] == 2


def test_pause_resume_torn_restart_and_sigterm(lazy_init: Init) -> None:
    n = lazy_init
    wait_for(lambda: n.log().count(b"tick") >= 3, "ticks")
    pid = n.ctl("status")["pid"]
    assert n.ctl("pause")["signal"] == "SIGSTOP"
    assert n.ctl("status")["state"] == "paused"
    # Stopped by the kernel (state T), the broker can issue no write; the ones it issued have landed.
    wait_for(lambda: _proc_state(pid) == "T", "the broker stopped by SIGSTOP")
    frozen = settled(n.log, "the paused broker's log")
    assert _proc_state(pid) == "T" and n.log() == frozen
    assert n.ctl("resume")["signal"] == "SIGCONT"
    wait_for(lambda: len(n.log()) > len(frozen), "progress after resume")

    torn = n.ctl("power-loss", "--torn", "9", "--restart-after", "0.3")
    assert torn["restart_after"] == 0.3 and torn["lazyfs"]["seed"] == "9"
    kept = torn["lazyfs"]["torn"][0]
    assert kept["path"] == "/log" and 0 <= kept["kept_bytes"] <= kept["unsynced_bytes"]
    wait_for(lambda: n.ctl("status")["state"] == "running", "restart after power loss")
    wait_for(lambda: n.log().count(b"boot") == 2, "the restarted broker booted")

    code, out = n.terminate()
    assert code == 0
    assert "broker up" in out and "shut down" in out
    assert "broker up" in Path(n.log_file).read_text()
    assert not is_mounted(n.data)
    assert Path(n.tmp, "backing", "log").read_bytes().count(b"boot") == 2  # a clean unmount wrote back


def test_power_loss_is_refused_without_lazyfs(plain_init: Init) -> None:
    n = plain_init
    reply = n.ctl("power-loss")
    assert not reply["ok"] and "--lazyfs" in reply["error"]
    assert n.ctl("status")["state"] == "running"  # refused means nothing was done
    stop = n.ctl("stop")
    assert [s["signal"] for s in stop["steps"]] == ["SIGTERM"]
    assert n.ctl("status")["state"] == "stopped"
    code, _ = n.terminate()
    assert code == 0


def test_nodectl_without_a_node_says_so_in_one_line(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "faults.nodectl", "--socket", str(tmp_path / "none.sock"), "status"],
        env=ENV,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and r.stdout.count("\n") == 1
    assert "cannot reach control socket" in json.loads(r.stdout)["error"]
