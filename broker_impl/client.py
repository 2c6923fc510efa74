"""What the node asks of a client connection (``broker_impl.connection.Connection``).

The broker keeps its connections as ``Client``s, so neither it nor the cluster side,
which closes them on a pause or an autoheal, imports the connection module above them.
"""

from __future__ import annotations

from typing import Any, Protocol


class Client(Protocol):
    def alarms_changed(self) -> None: ...

    def force_close(self, reason: str = ...) -> None: ...

    def terminate(self) -> None: ...

    def info(self) -> dict[str, Any]: ...
