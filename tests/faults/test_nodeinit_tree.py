"""Which processes a crash kills: the broker's whole tree, and nothing else.

A broker started through ``su``/``runuser`` (Debian's rabbitmq-server) moves its VM
into a process group of its own; a group kill misses it and the "crash" kills only
the wrapper. Outside a container, nothing but the broker's descendants may ever be
selected: PID 1's children there are the whole machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

from faults.nodeinit import broker_pids, in_container_init

SPAWN_ESCAPER = r"""
import subprocess, sys, time
# A grandchild in a new session and process group, like a VM started through su.
p = subprocess.Popen(["sleep", "60"], start_new_session=True)
print(p.pid, flush=True)
time.sleep(60)
"""


def test_the_tree_includes_a_grandchild_in_another_process_group() -> None:
    leader = subprocess.Popen(
        [sys.executable, "-c", SPAWN_ESCAPER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    bystander = subprocess.Popen(["sleep", "60"])
    escaper = 0
    try:
        assert leader.stdout is not None
        escaper = int(leader.stdout.readline())
        assert os.getpgid(escaper) != leader.pid  # a group kill would miss it
        pids = broker_pids(leader.pid, {1, os.getpid()})
        assert leader.pid in pids and escaper in pids
        assert bystander.pid not in pids
    finally:
        for p in (leader, bystander):
            p.kill()
        if escaper:  # by its pid: a pattern would also kill other people's sleeps
            with contextlib.suppress(ProcessLookupError):
                os.kill(escaper, signal.SIGKILL)


def test_outside_a_container_nothing_but_descendants_is_selected() -> None:
    assert not in_container_init()
    assert broker_pids(999_999_999, {1, os.getpid()}) == []
    init_children = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == 1]
    assert init_children, "the machine has daemons under PID 1"
    shell = subprocess.Popen(["sleep", "5"], start_new_session=True)
    try:  # Popen returns once sleep has been exec'd in its new session: nothing to wait for
        selected = set(broker_pids(shell.pid, {1, os.getpid()}))
        assert selected == {shell.pid}
        assert not selected & set(init_children)
    finally:
        shell.kill()


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except OSError:
        return -1
