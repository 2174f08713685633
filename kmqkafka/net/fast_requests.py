"""Hand-written reader of Produce request bodies that leaves the record batches in the frame.

kio's native reader returns every ``records`` field as new ``bytes``: a copy of each produced
byte, into memory freshly taken from the system (a megabyte request is a megabyte of page
faults), before the broker has even looked at it. A frame read into a buffer of its own
(``recvinto``: every large request) is never written again, so its batches can be handed on as
read-only views of it, the frame living as long as they do. ``read_produce`` builds exactly
the request kio builds, except that ``records`` are those views; the protocol uses it for such
frames only, after ``guard.check`` has checked every length against the frame. Its test
compares it with kio over requests of every version.
"""
from __future__ import annotations

import datetime
import struct
import sys
from functools import cache
from typing import Any
from uuid import UUID

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">hi")  # acks, timeout
_FIRST_FLEXIBLE = 9
_FIRST_TOPIC_ID = 13


class _Reader:
    """A cursor over one frame (a read-only memoryview)."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: memoryview, pos: int) -> None:
        self.buf = buf
        self.pos = pos

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.buf[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise ValueError("overlong varint")

    def fixed(self, st: struct.Struct) -> Any:
        value = st.unpack_from(self.buf, self.pos)[0]
        self.pos += st.size
        return value

    def nullable(self, flexible: bool, legacy: struct.Struct) -> memoryview | None:
        """A string's or bytes' value (compact, or after a ``legacy`` length), None for null."""
        n = self.uvarint() - 1 if flexible else self.fixed(legacy)
        if n < 0:
            return None
        start = self.pos
        self.pos += n
        if self.pos > len(self.buf):
            raise ValueError("a value runs past the frame")
        return self.buf[start:self.pos]

    def string(self, flexible: bool) -> str | None:
        value = self.nullable(flexible, _I16)
        return None if value is None else str(value, "utf-8")

    def count(self, flexible: bool) -> int:
        n = self.uvarint() - 1 if flexible else self.fixed(_I32)
        if n < 0:
            raise ValueError("a non-nullable array was null")
        return n

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.pos += self.uvarint()


@cache
def _classes(request_type: type) -> tuple[type, type]:
    module = sys.modules[request_type.__module__]
    return module.TopicProduceData, module.PartitionProduceData


def read_produce(request_type: type, version: int, frame: memoryview, pos: int) -> Any:
    """The Produce request (``request_type``, ``version``) whose body starts at ``pos`` of
    ``frame``, its ``records`` views of ``frame``. Raises ValueError on a malformed body."""
    try:
        return _read(request_type, version, frame, pos)
    except (IndexError, struct.error) as exc:
        raise ValueError(f"truncated Produce request: {exc}") from None


def _read(request_type: type, version: int, frame: memoryview, pos: int) -> Any:
    topic_cls, partition_cls = _classes(request_type)
    flexible = version >= _FIRST_FLEXIBLE
    by_id = version >= _FIRST_TOPIC_ID
    r = _Reader(frame, pos)
    transactional_id = r.string(flexible)
    acks, timeout_ms = _HEAD.unpack_from(frame, r.pos)
    r.pos += _HEAD.size
    topics = []
    for _ in range(r.count(flexible)):
        if by_id:
            raw = bytes(frame[r.pos:r.pos + 16])
            r.pos += 16
            key: Any = UUID(bytes=raw) if any(raw) else None  # as kio reads the zero id
        else:
            key = r.string(flexible)
            if key is None:
                raise ValueError("a topic name was null")
        partitions = []
        for _ in range(r.count(flexible)):
            index = r.fixed(_I32)
            records = r.nullable(flexible, _I32)
            if flexible:
                r.skip_tags()
            partitions.append(partition_cls(index=index, records=records))
        if flexible:
            r.skip_tags()
        if by_id:
            topics.append(topic_cls(topic_id=key, partition_data=tuple(partitions)))
        else:
            topics.append(topic_cls(name=key, partition_data=tuple(partitions)))
    if flexible:
        r.skip_tags()
    return request_type(transactional_id=transactional_id, acks=acks,
                        timeout=datetime.timedelta(milliseconds=timeout_ms),
                        topic_data=tuple(topics))
