"""The helpers plugins use in ``form_cluster``, run against real commands on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness import EXEC_TIMED_OUT, ClusterError, NotYet, poll, run_or_fail, wait_until_running


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
    with pytest.raises(ClusterError, match=r"^n1: .* exited 3: boom$"):
        run_or_fail(LocalNode(), [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"])


class Answers:
    """A NodeHandle that answers every command with one exit code and output."""

    name = "n1"

    def __init__(self, rc: int, out: str) -> None:
        self.rc, self.out = rc, out

    def exec(self, cmd: Sequence[str], timeout: float = 30.0) -> tuple[int, str]:
        return self.rc, self.out


EXPR = (
    'case rabbit_amqqueue:lookup(rabbit_misc:r(<<"/"/utf8>>, queue, <<"chaos-1"/utf8>>)) of {ok, Q} -> x end.'
)


def test_a_timeout_leads_the_error_and_a_long_argument_is_left_out() -> None:
    with pytest.raises(ClusterError) as info:
        run_or_fail(Answers(EXEC_TIMED_OUT, ""), ["rabbitmqctl", "-q", "eval", EXPR], timeout=40)
    assert str(info.value) == "n1: rabbitmqctl -q eval … timed out after 40 s"


def test_an_exit_gives_its_code_and_its_output_on_one_line() -> None:
    out = (
        "Error: unable to perform an operation on node 'rabbit@n1'.\n\nDIAGNOSTICS\n===========\n" + "x" * 400
    )
    with pytest.raises(ClusterError) as info:
        run_or_fail(Answers(69, out), ["rabbitmqctl", "-q", "eval", EXPR])
    said = str(info.value)
    assert said.startswith("n1: rabbitmqctl -q eval … exited 69: Error: unable to perform an operation")
    assert "\n" not in said and said.endswith("x" * 100)


def test_exec_timed_out_is_what_coreutils_timeout_exits() -> None:
    """The host runs every command under coreutils' ``timeout`` (``harness.cluster``)."""
    assert subprocess.run(["timeout", "0.1", "sleep", "30"]).returncode == EXEC_TIMED_OUT


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
