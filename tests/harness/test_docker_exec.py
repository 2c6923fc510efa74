"""A command's output read in full: the multiplexed stream's frames, and (with Docker) a command
that answers before the client has parsed the response's headers, where docker-py's ``exec_run``
loses what its buffered reader took in with them (docker/docker-py#3332)."""

from __future__ import annotations

import http.client
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.docker_exec import exec_output, payloads


def frame(kind: int, data: bytes) -> bytes:
    return struct.pack(">BxxxL", kind, len(data)) + data


def test_payloads_joins_stdout_and_stderr_frames_in_order() -> None:
    stream = frame(1, b"out 1\n") + frame(2, b"err\n") + frame(1, b"out 2\n")
    assert payloads(stream) == b"out 1\nerr\nout 2\n"


def test_payloads_of_an_empty_stream_and_of_a_frame_cut_short() -> None:
    assert payloads(b"") == b""
    assert payloads(frame(1, b"whole") + frame(1, b"cut short")[:-5]) == b"whole" + b"cut "


@pytest.fixture(scope="module")
def container() -> Iterator[Any]:
    from harness.cluster import PROJECT_LABEL, docker_client
    from harness.images import ImageBuilder

    client = docker_client()
    base = ImageBuilder(client).base()
    c = client.containers.run(
        base, ["sleep", "infinity"], detach=True, remove=True, labels={PROJECT_LABEL: "brokerchaos"}
    )
    try:
        yield c
    finally:
        c.remove(force=True)


@pytest.fixture
def headers_read_late(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault: the client is slow to parse each response's headers (half a second late), so
    the exec's output is already there beside them, the order a loaded machine gives now and
    then. What the test asserts holds at any delay; the delay only makes that order the usual one
    (with it, ``exec_run`` returned nothing for ``echo hello`` and 7,774 bytes short for the
    ``seq``)."""
    begin = http.client.HTTPResponse.begin

    def late(self: http.client.HTTPResponse) -> None:
        time.sleep(0.5)
        begin(self)

    monkeypatch.setattr(http.client.HTTPResponse, "begin", late)


@pytest.mark.docker
@pytest.mark.parametrize("cmd, want", [(["echo", "hello"], b"hello\n"), (["seq", "0", "19999"], None)])
def test_exec_output_keeps_what_came_with_the_headers(
    container: Any, headers_read_late: None, cmd: list[str], want: bytes | None
) -> None:
    want = want if want is not None else b"".join(b"%d\n" % i for i in range(20000))
    assert exec_output(container, cmd) == (0, want)


@pytest.mark.docker
def test_exec_output_returns_the_exit_code_and_stderr(container: Any) -> None:
    code, out = exec_output(container, ["sh", "-c", "echo out; echo err >&2; exit 3"])
    # stdout and stderr are two pipes: Docker keeps each one's order, not the order between them
    assert (code, sorted(out.splitlines())) == (3, [b"err", b"out"])
