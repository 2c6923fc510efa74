"""Run a command in a container and read everything it wrote.

docker-py's ``exec_run`` reads a started exec's output from the raw socket beneath the HTTP
response's buffered reader, so whatever that reader took in together with the response's headers
is skipped (docker/docker-py#3332). When the command has answered before the client parses the
headers, as it does on a loaded machine, the start of its output is lost, up to the reader's
8 KiB: a node's data read back short, a probe's answer empty. Here the output is read through the
response itself (the daemon ends the stream when the command ends), so nothing is skipped.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

#: A frame of Docker's multiplexed stream: stream kind (1 stdout, 2 stderr), 3 zero bytes, size.
_FRAME = struct.Struct(">BxxxL")


def exec_output(container: Any, cmd: Sequence[str]) -> tuple[int, bytes]:
    """Run ``cmd`` in ``container`` (not a TTY) and return its exit code (1 if Docker has none)
    and its stdout and stderr as written, interleaved. Docker's errors propagate."""
    api = container.client.api
    exec_id = api.exec_create(container.id, list(cmd), stdout=True, stderr=True)["Id"]
    # No Upgrade header: the daemon answers 200 and streams until the command ends. No timeout:
    # a quiet command (a wait, a sync) may write nothing for longer than the client's default.
    res = api._post_json(
        api._url("/exec/{0}/start", exec_id), data={"Tty": False, "Detach": False}, stream=True, timeout=None
    )
    try:
        api._raise_for_status(res)
        body = res.raw.read()
    finally:
        res.close()
    code = api.exec_inspect(exec_id).get("ExitCode")
    return (code if code is not None else 1), payloads(body)


def payloads(stream: bytes) -> bytes:
    """The frames' contents of a multiplexed stream, in order (a frame cut short by the stream's
    end gives what it holds)."""
    out, at = [], 0
    while at + _FRAME.size <= len(stream):
        _, size = _FRAME.unpack_from(stream, at)
        at += _FRAME.size
        out.append(stream[at : at + size])
        at += size
    return b"".join(out)
