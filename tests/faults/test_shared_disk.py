"""A power cut of a shared disk with real node inits over one real lazy filesystem (no Docker):
a disk init mounts it with no broker, two node inits run brokers that write into that one
mount, and ``power-loss`` aimed at one node kills both and drops the one disk's unsynced writes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from faults.lazyfs import fuse_available
from faults.power import PowerLossCoordinated
from faults.process import PowerLoss
from harness.spec import FaultContext
from tests.faults.local_nodes import LocalCluster, LocalNode
from tests.faults.test_nodeinit import ENV, Init, child, wait_for


def ticking(name: str) -> str:
    """A broker stand-in that syncs its boot line, then appends ``tick NAME i`` lines, never synced."""
    return child(
        b"boot\n",
        f"""i = 0
while True:
    os.write(fd, b"tick {name} %d\\n" % i)
    i += 1
    time.sleep(0.01)""",
    )


class Disk:
    """A shared volume's disk: a node init with the lazy filesystem and no broker (``--no-start``)."""

    def __init__(self, tmp: str) -> None:
        self.mount = f"{tmp}/data"
        self.sock = f"{tmp}/disk.sock"
        args = [sys.executable, "-m", "faults.nodeinit", "--data-dir", self.mount, "--control", self.sock]
        args += ["--lazyfs", "--backing", f"{tmp}/backing", "--lazyfs-control", f"{tmp}/lazy.sock"]
        args += ["--no-start", "--", "true"]
        self.proc = subprocess.Popen(args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        wait_for(lambda: os.path.exists(self.sock), "the disk's init listening")

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.communicate(timeout=60)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[LocalCluster, Path]]:
    """n1 and n2 on one shared disk (each node's ``data`` a link to the disk's mount), both ticking
    into its ``log`` (each reads the other's writes: one mount, one page cache); the log's path."""
    reason = fuse_available()
    if reason:
        pytest.skip(f"needs FUSE: {reason}")
    (tmp_path / "disk").mkdir()
    disk = Disk(str(tmp_path / "disk"))
    inits: dict[str, Init] = {}
    try:
        for n in ("n1", "n2"):
            (tmp_path / n).mkdir()
            (tmp_path / n / "data").symlink_to(disk.mount)
            inits[n] = Init(str(tmp_path / n), lazyfs=False, child=ticking(n))
        cluster = LocalCluster(inits, lazyfs=True)
        shared = SimpleNamespace(name="store", path=disk.mount, container="disk", nodes=("n1", "n2"))
        cluster.topology.disks_of = lambda node: (shared,) if node in shared.nodes else ()
        handle: Any = SimpleNamespace(sock=disk.sock)  # all LocalNode reads of an Init
        cluster.disks = {"store": LocalNode("shared-store", handle)}  # type: ignore[attr-defined]
        log = Path(disk.mount, "log")
        wait_for(
            lambda: b"tick n1 3" in log.read_bytes() and b"tick n2 3" in log.read_bytes(), "both ticking"
        )
        yield cluster, log
    finally:
        for init in inits.values():
            init.terminate()
        disk.terminate()


def test_a_power_cut_of_one_node_on_a_shared_disk_takes_both_down_and_drops_what_both_wrote(
    pair: tuple[LocalCluster, Path],
) -> None:
    cluster, log = pair
    fault = PowerLoss(FaultContext(cluster), {"node": "n1"}, "f1")
    done: dict[str, Any] = fault.apply()
    shared = done["shared"]
    assert sorted(shared["nodes"]) == ["n1", "n2"]  # the named node and the other node of its disk
    for n in ("n1", "n2"):
        kill = shared["nodes"][n]["nodectl"]
        assert kill["action"] == "crash" and kill["gone"] and kill["cue"]["late_ms"] >= 0
        assert cluster.nodes[n].init.ctl("status")["state"] == "stopped"
    cut = shared["disks"]["store"]["nodectl"]
    assert cut["action"] == "disk-cut" and cut["lazyfs"]["command"] == "crash"
    assert cut["lazyfs"]["dropped_bytes"] > 0
    # What survives is what the last sync covered: both boots; no tick of either node after them.
    kept = log.read_bytes()
    assert kept.count(b"boot\n") == 2 and kept.endswith(b"boot\n")
    evidence = fault.evidence(done)
    assert evidence.effect is True and "dropped" in evidence.summary
    assert set(evidence.facts["process"]) == {"n1", "n2"}

    healed = fault.heal()
    assert healed["ready"] and sorted(healed["shared_nodes"]) == ["n1", "n2"]
    for n in ("n1", "n2"):
        assert cluster.nodes[n].init.ctl("status")["state"] == "running"


def test_a_coordinated_cut_naming_one_node_of_a_shared_disk_takes_its_other_node_down_too(
    pair: tuple[LocalCluster, Path],
) -> None:
    cluster, log = pair
    fault = PowerLossCoordinated(FaultContext(cluster), {"nodes": ["n2"], "torn": False, "lead": 1.0}, "f1")
    done: dict[str, Any] = fault.apply()
    assert sorted(done["nodes"]) == ["n1", "n2"] and fault.down == ["n1", "n2"]
    assert done["shared"]["disks"]["store"]["nodectl"]["lazyfs"]["dropped_bytes"] > 0
    assert fault.evidence(done).effect is True
    assert sorted(fault.heal()["nodes"]) == ["n1", "n2"]
    for n in ("n1", "n2"):
        assert cluster.nodes[n].init.ctl("status")["state"] == "running"
