"""Two runs on one Docker engine, and a `brokerchaos down` between them, disturb nothing.

Both runs share one run store (their directories must not collide), get their own
names, networks and host ports, and finish durable. A `down` issued while they run
removes only what belongs to a harness that has exited (a planted orphan) and leaves
both runs' containers in place.
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from harness.cluster import OWNER_PID_LABEL, PROJECT_LABEL, ROLE_LABEL, RUN_LABEL, Owner, process_start
from tests.polling import until

from .conftest import REPO, start_cli

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _client():
    import docker

    return docker.from_env()


def _plant_orphan() -> str:
    """A network and a volume labelled by a harness process that has since exited."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    start = process_start(child.pid)
    assert child.stdin is not None and start
    child.stdin.close()
    child.wait()
    run_id = f"bc-orphan{secrets.token_hex(3)}"
    labels = {
        PROJECT_LABEL: "brokerchaos",
        RUN_LABEL: run_id,
        **replace(Owner.current(), pid=child.pid, start=start).labels(),
    }
    client = _client()
    client.networks.create(run_id, driver="bridge", labels=labels)
    client.volumes.create(f"{run_id}-n1-data", labels=labels)
    return run_id


def _containers_of(pid: int) -> dict[str, str]:
    """name -> run id of every container the harness process pid created."""
    found = _client().containers.list(all=True, filters={"label": [f"{OWNER_PID_LABEL}={pid}"]})
    return {c.name: c.labels[RUN_LABEL] for c in found}


def _brokers_started(pid: int) -> bool:
    found = _client().containers.list(filters={"label": [f"{OWNER_PID_LABEL}={pid}", f"{ROLE_LABEL}=broker"]})
    return bool(found)


def _ended(procs: list[subprocess.Popen[str]]) -> str | None:
    """Why the two runs can no longer both be running: one of them ended (with its output)."""
    for p in procs:
        if p.poll() is not None:
            out, err = p.communicate()
            return f"a run ended before both were running (exit {p.returncode}):\n{out}\n{err}"
    return None


def test_two_runs_at_once_and_a_down_between_them(tmp_path: Path) -> None:
    orphan = _plant_orphan()
    procs = [
        start_cli(
            tmp_path / "store",
            *("run", "scenarios/smoke.yaml", "--duration", "8", "--seed", str(seed), "--checker", "python"),
        )
        for seed in (11, 12)
    ]
    try:
        until(
            lambda: all(_brokers_started(p.pid) for p in procs),
            "both runs to start their brokers",
            every=0.5,
            gone=lambda: _ended(procs),
        )
        before = {p.pid: _containers_of(p.pid) for p in procs}
        assert set(before[procs[0].pid].values()).isdisjoint(before[procs[1].pid].values())

        down = subprocess.run(["brokerchaos", "down"], capture_output=True, text=True, timeout=300, cwd=REPO)
        assert down.returncode == 0, down.stderr
        assert re.search(rf"of \d+ run\(s\) whose harness has exited \(.*{orphan}.*\)", down.stdout), (
            down.stdout
        )
        for p in procs:
            run_id = next(iter(before[p.pid].values()))
            assert f"left alone: {run_id}: harness still running" in down.stdout, down.stdout
            assert set(_containers_of(p.pid)) == set(before[p.pid]), "down removed a running run's containers"
        assert not _client().networks.list(names=[orphan])
        assert not [v for v in _client().volumes.list() if v.name.startswith(orphan)]

        outputs = [p.communicate(timeout=900) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.communicate(timeout=120)
    run_dirs = []
    for p, (out, err), seed in zip(procs, outputs, (11, 12), strict=True):
        assert p.returncode == 0, f"exit {p.returncode}\n{out[-3000:]}\n{err[-3000:]}"
        assert f"smoke (seed {seed}): durable" in out
        run_dirs.append(re.search(r"run directory\s+(\S+)", out).group(1))  # type: ignore[union-attr]
        assert _containers_of(p.pid) == {}, "the run did not tear down what it created"
    assert len(set(run_dirs)) == 2 and all((Path(d) / "results.json").is_file() for d in run_dirs)
