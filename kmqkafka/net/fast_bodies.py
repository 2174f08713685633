"""Hand-written body encoders for the responses answered most often.

kio encodes a response field by field through generic writers: about 20 µs for a one-partition
Produce answer, a sixth of what the broker spent on the whole request (bench/README.md). An API
whose answers are that frequent registers an encoder for its response classes here (``register``);
the protocol asks ``body`` first and falls back to kio when there is no encoder or the encoder
declines (returns None) a response it does not cover. An encoder returns the body as ``bytes``
or as a list of pieces (large values such as stored batches left uncopied). Encoders must
give exactly kio's bytes; each one's test compares the two over generated responses of
every version.
"""
from __future__ import annotations

import struct
from typing import Any, Callable

Encoder = Callable[[Any], "bytes | list[Any] | None"]

_encoders: dict[type, Encoder] = {}

NO_TAGS = b"\x00"  # an empty tagged-field section (flexible versions)
ZERO_UUID = bytes(16)

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_NULL_STRING = _I16.pack(-1)


def uvarint(n: int) -> bytes:
    """``n`` (>= 0) as an unsigned varint: compact lengths and counts, n + 1 for nullable."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def count(n: int, flexible: bool) -> bytes:
    """An array's length: a compact (n + 1) varint in flexible versions, else an int32."""
    return uvarint(n + 1) if flexible else _I32.pack(n)


def string(value: str | None, flexible: bool) -> bytes:
    """A (nullable) string, compact in flexible versions; over 32,767 bytes is a ValueError,
    as Kafka's writers refuse it."""
    if value is None:
        return b"\x00" if flexible else _NULL_STRING
    data = value.encode()
    if len(data) > 0x7FFF:
        raise ValueError("string longer than 32767 bytes")
    return (uvarint(len(data) + 1) if flexible else _I16.pack(len(data))) + data


def register(response_type: type, encoder: Encoder) -> None:
    """Use ``encoder`` for the body of every ``response_type`` instance."""
    _encoders[response_type] = encoder


def body(response: Any) -> bytes | list[Any] | None:
    """The encoded body of ``response``, or None when kio must encode it."""
    encoder = _encoders.get(type(response))
    return None if encoder is None else encoder(response)
