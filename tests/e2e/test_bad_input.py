"""Bad input that needs a reachable Docker engine to get as far as it does."""

from __future__ import annotations

import socket
import subprocess

import pytest

from tests.e2e.conftest import REPO, labelled

pytestmark = pytest.mark.docker


def test_a_client_port_in_use_is_one_line_and_starts_nothing(tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.Popen(
            ["brokerchaos", "run", "scenarios/smoke.yaml", "--ports", str(port)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={"BROKERCHAOS_STORE": str(tmp_path), "PATH": __import__("os").environ["PATH"]},
        )
        _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("brokerchaos: port ") and "in use" in lines[0], err
    assert "Traceback" not in err
    # Nothing of this harness process's on the engine (other tests' runs may be under way on it).
    assert labelled(owner_pid=proc.pid) == {"containers": [], "networks": [], "volumes": []}
    assert not any(tmp_path.iterdir()), "no run directory is created for a run that cannot start"
