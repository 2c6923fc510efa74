"""The helpers plugins use in ``form_cluster``, run against real commands on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness import ClusterError, NotYet, poll, run_or_fail, wait_until_running


class LocalNode:
    """A NodeHandle whose commands run here instead of in a container."""

    name = "n1"

    def exec(self, cmd: Sequence[str], timeout: float = 30.0) -> tuple[int, str]:
        p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout + p.stderr


def status_cmd(state: Path) -> list[str]:
    """Each call lists one more running node (n1, then n1 n2, ...), as a cluster forming would."""
    code = (
        "import json, pathlib, sys; p = pathlib.Path(sys.argv[1]); n = int(p.read_text() or 0) + 1; "
        "p.write_text(str(n)); print(json.dumps({'running': [f'rabbit@n{i}' for i in range(1, n + 1)]}))"
    )
    return [sys.executable, "-c", code, str(state)]


def running(out: str) -> set[str]:
    return {m.rpartition("@")[2] for m in json.loads(out)["running"]}


def test_waits_until_every_node_is_running(tmp_path: Path) -> None:
    state = tmp_path / "calls"
    state.write_text("0")
    wait_until_running(LocalNode(), status_cmd(state), {"n1", "n2", "n3"}, running, timeout=30, interval=0.01)
    assert state.read_text() == "3"


def test_gives_up_with_the_last_output(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", 'print(\'{"running": ["rabbit@n1"]}\')']
    with pytest.raises(ClusterError, match=r"cluster did not form in 0s \(want \['n1', 'n2'\]\).*rabbit@n1"):
        wait_until_running(LocalNode(), cmd, {"n1", "n2"}, running, timeout=0.2, interval=0.05)


def test_output_that_is_not_a_status_is_retried_not_raised(tmp_path: Path) -> None:
    state = tmp_path / "calls"
    state.write_text("0")
    code = (
        "import pathlib, sys; p = pathlib.Path(sys.argv[1]); n = int(p.read_text()) + 1; p.write_text(str(n)); "
        "print('starting...' if n < 2 else '{\"running\": [\"n1\"]}')"
    )
    wait_until_running(
        LocalNode(), [sys.executable, "-c", code, str(state)], {"n1"}, running, timeout=30, interval=0.01
    )
    assert state.read_text() == "2"


def test_run_or_fail_names_the_node_and_command() -> None:
    assert run_or_fail(LocalNode(), [sys.executable, "-c", "print('ok')"]).strip() == "ok"
    with pytest.raises(ClusterError, match=r"^n1: .* failed: boom"):
        run_or_fail(LocalNode(), [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"])


def test_poll_returns_the_first_result_and_retries_while_not_yet() -> None:
    calls: list[int] = []

    def attempt() -> str | NotYet:
        calls.append(1)
        return "formed" if len(calls) == 3 else NotYet(f"{len(calls)} of 3")

    assert poll(attempt, timeout=30, failure="never", interval=0.01) == "formed"
    assert len(calls) == 3


def test_poll_gives_up_with_the_failure_and_the_last_reason() -> None:
    calls: list[int] = []

    def attempt() -> None | NotYet:
        calls.append(1)
        return NotYet(f"attempt {len(calls)}")

    with pytest.raises(ClusterError) as info:
        poll(attempt, timeout=-1, failure="the meta group did not form", interval=0.01)  # already past
    assert str(info.value) == "the meta group did not form: attempt 1"
    assert len(calls) == 1


def test_poll_lets_an_attempt_s_error_through() -> None:
    def attempt() -> None | NotYet:
        raise ClusterError("n2: unreachable")

    with pytest.raises(ClusterError, match="^n2: unreachable$"):
        poll(attempt, timeout=30, failure="never", interval=0.01)
