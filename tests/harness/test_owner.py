"""Which runs `brokerchaos down` may remove: only those whose harness process is gone."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from harness.cluster import (
    OWNER_BOOT_LABEL,
    OWNER_HOST_LABEL,
    OWNER_PID_LABEL,
    OWNER_PIDNS_LABEL,
    OWNER_START_LABEL,
    Owner,
    owner_state,
    process_start,
)
from harness.store import RunDir

linux = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")


@linux
def test_this_process_is_alive() -> None:
    here = Owner.current()
    assert here.pid == os.getpid() and here.start and here.boot_id and here.pidns
    assert owner_state(here.labels(), here) == "alive"


@linux
def test_a_process_that_exited_is_gone() -> None:
    here = Owner.current()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    start = process_start(child.pid)
    assert start
    labels = replace(here, pid=child.pid, start=start).labels()
    assert owner_state(labels, here) == "alive"
    assert child.stdin is not None
    child.stdin.close()
    child.wait()
    assert process_start(child.pid) is None
    assert owner_state(labels, here) == "gone"


@linux
def test_a_recycled_pid_is_not_the_owner() -> None:
    """The pid is alive but belongs to a process started at another time."""
    here = Owner.current()
    labels = replace(here, start=str(int(here.start) - 1)).labels()
    assert owner_state(labels, here) == "gone"


def test_a_reboot_means_every_owner_of_that_boot_is_gone() -> None:
    here = Owner(host="h", boot_id="boot-2", pidns="pid:[1]", pid=10, start="5")
    labels = replace(here, boot_id="boot-1").labels()
    assert owner_state(labels, here, start_of=lambda pid: "5") == "gone"


def test_another_host_or_pid_namespace_is_left_alone() -> None:
    here = Owner(host="h", boot_id="b", pidns="pid:[1]", pid=10, start="5")
    nobody = lambda pid: None  # noqa: E731 - no such pid here: still not ours to judge
    assert owner_state(replace(here, host="other").labels(), here, start_of=nobody) == "elsewhere"
    assert (
        owner_state(replace(here, boot_id="x", host="other").labels(), here, start_of=nobody) == "elsewhere"
    )
    assert owner_state(replace(here, pidns="pid:[2]").labels(), here, start_of=nobody) == "elsewhere"


def test_resources_without_owner_labels_are_not_judged() -> None:
    here = Owner(host="h", boot_id="b", pidns="n", pid=10, start="5")
    assert owner_state({"brokerchaos.project": "brokerchaos", "brokerchaos.run": "bc-1"}, here) == "unowned"
    assert owner_state({OWNER_PID_LABEL: "not-a-pid", OWNER_HOST_LABEL: "h"}, here) == "unowned"


def test_the_pid_decides_when_everything_else_matches() -> None:
    here = Owner(host="h", boot_id="b", pidns="n", pid=10, start="5")
    labels = {
        OWNER_HOST_LABEL: "h",
        OWNER_BOOT_LABEL: "b",
        OWNER_PIDNS_LABEL: "n",
        OWNER_PID_LABEL: "77",
        OWNER_START_LABEL: "123",
    }
    assert owner_state(labels, here, start_of={77: "123"}.get) == "alive"
    assert owner_state(labels, here, start_of={77: "124"}.get) == "gone"
    assert owner_state(labels, here, start_of=lambda pid: None) == "gone"
    # Without a start time to compare (no /proc), a live pid counts as the owner: never remove by mistake.
    assert owner_state(labels, here, start_of={77: ""}.get) == "alive"


def test_concurrent_runs_of_one_scenario_get_their_own_directories(tmp_path: Path) -> None:
    made: list[Path] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def create() -> None:
        barrier.wait()
        try:
            made.append(RunDir.create(tmp_path, "smoke").path)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(set(made)) == 8 and all(p.is_dir() for p in made)
    assert (tmp_path / "latest").resolve() in made
    assert not list(tmp_path.glob(".latest*"))
