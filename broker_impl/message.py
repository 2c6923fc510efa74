"""The message as the broker keeps it, and its byte form for the store.

The store and the protocol layer meet here: the store never sees pamqp frames,
the protocol layer never sees record layouts.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from pamqp import commands
from pamqp.header import ContentHeader

_HDR = struct.Struct(">QB H I")  # msg_id, flags, exchange len, routing key len
_PERSISTENT = 1


@dataclass(slots=True)
class Message:
    """A published message.

    ``msg_id`` is unique within one broker node for its lifetime (the store keeps
    it across restarts). ``persistent`` mirrors ``delivery_mode == 2``: only
    persistent messages on durable queues must survive a restart.

    A message is never changed once built (dead-lettering builds a new one), so
    its byte form is made once: a mirrored publish needs it for the store, the
    cluster link and the content fingerprint, and a copy decoded from bytes
    already has it.
    """

    exchange: str
    routing_key: str
    properties: commands.Basic.Properties
    body: bytes
    msg_id: int = 0
    persistent: bool = field(default=False)
    _bytes: bytes | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.properties.delivery_mode == 2:
            self.persistent = True

    @property
    def size(self) -> int:
        return len(self.body)

    def to_bytes(self) -> bytes:
        """Serialise for the store: fixed header, exchange, routing key, properties, body."""
        if self._bytes is None:
            self._bytes = self._encode()
        return self._bytes

    def _encode(self) -> bytes:
        ex = self.exchange.encode()
        rk = self.routing_key.encode()
        props = encode_properties(self.properties, len(self.body))
        return b"".join(
            (
                _HDR.pack(self.msg_id, _PERSISTENT if self.persistent else 0, len(ex), len(rk)),
                ex,
                rk,
                struct.pack(">I", len(props)),
                props,
                self.body,
            )
        )

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> Message:
        data = bytes(data)
        msg_id, flags, exl, rkl = _HDR.unpack_from(data, 0)
        off = _HDR.size
        exchange = data[off : off + exl].decode()
        off += exl
        routing_key = data[off : off + rkl].decode()
        off += rkl
        (pl,) = struct.unpack_from(">I", data, off)
        off += 4
        properties = decode_properties(data[off : off + pl])
        off += pl
        return cls(exchange, routing_key, properties, data[off:], msg_id, bool(flags & _PERSISTENT), data)


def encode_properties(properties: commands.Basic.Properties, body_size: int = 0) -> bytes:
    """Encode properties exactly as a content header carries them (class id 60)."""
    return ContentHeader(0, body_size, properties).marshal()


def decode_properties(data: bytes) -> commands.Basic.Properties:
    header = ContentHeader()
    header.unmarshal(data)
    return header.properties


PROPERTY_NAMES = (
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "message_type",
    "user_id",
    "app_id",
    "cluster_id",
)


def copy_properties(properties: commands.Basic.Properties) -> commands.Basic.Properties:
    """A copy to change (dead-lettering, a delayed message's swapped header) without touching the original."""
    return commands.Basic.Properties(**{k: getattr(properties, k) for k in PROPERTY_NAMES})
