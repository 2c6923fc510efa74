"""Bad input that needs a reachable Docker engine to get as far as it does."""

from __future__ import annotations

import socket
import subprocess

import pytest

from tests.e2e.conftest import REPO, labelled

pytestmark = pytest.mark.docker


def test_a_client_port_in_use_is_one_line_and_starts_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    before = labelled()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run(["brokerchaos", "run", "scenarios/smoke.yaml", "--ports", str(port)], cwd=REPO,
                              capture_output=True, text=True, timeout=120,
                              env={"BROKERCHAOS_STORE": str(tmp_path), "PATH": __import__("os").environ["PATH"]})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("brokerchaos: port ") and "in use" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert labelled() == before
    assert not any(tmp_path.iterdir()), "no run directory is created for a run that cannot start"
