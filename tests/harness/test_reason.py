"""``reason``: the one line the history's ``error`` column keeps of an exception."""

from __future__ import annotations

from harness.errors import ClusterError
from harness.spec.client import REASON_CHARS, reason
from harness.spec.errors import one_line


def test_a_short_message_is_kept_whole() -> None:
    assert reason(ClusterError("n1: rabbitmqctl stop_app exited 2: nodedown")) == (
        "ClusterError: n1: rabbitmqctl stop_app exited 2: nodedown"
    )
    assert reason(TimeoutError()) == "TimeoutError"


def test_a_long_message_keeps_what_failed_and_why() -> None:
    """What failed leads and why ends: a cut at a fixed width kept neither the timeout nor the exit."""
    exc = ClusterError(
        "n1: " + "rabbitmqctl -q eval case rabbit_amqqueue:info(Q, [messages_ready]) " * 5 + "exited 69"
    )
    got = reason(exc)
    assert got.startswith("ClusterError: n1: rabbitmqctl -q eval")
    assert got.endswith("exited 69")
    assert len(got) == len("ClusterError: ") + REASON_CHARS


def test_every_line_is_kept_on_one() -> None:
    assert reason(ValueError("first\n\n  second\tthird\n")) == "ValueError: first second third"


def test_one_line_shortens_in_the_middle() -> None:
    assert one_line("a" * 10 + "b" * 10, 9) == "aaa … bbb"
    assert one_line(" a\n b ", 9) == "a b"
