"""Encoding responses as a list of chunks, so large values reach the socket uncopied.

kio's writers call ``buffer.write`` field by field. ``ChunkWriter`` gathers
small writes into one bytearray and keeps large ones as their own pieces,
uncopied. ``parts()`` returns those pieces as they were written (bytes,
bytearray or memoryview; a ``RecordChain`` contributes its parts): the protocol
joins every ready response into one ``bytes`` in a single copy and hands that
to the transport (Twisted would otherwise join its buffer list again). A Fetch
response whose records are several stored batches (memoryviews over pread
buffers) is therefore copied exactly once on its way to the socket.
``chunks()`` returns the same pieces converted to ``bytes`` (a ``bytes`` value
passes through uncopied).
"""

from __future__ import annotations

from typing import Sequence

_SMALL = 16 * 1024

Chunk = bytes


class RecordChain:
    """Several stored RecordBatches presented to kio as one ``records`` value.

    kio only needs ``len()`` and ``buffer.write(value)``; ``ChunkWriter``
    recognises the chain and keeps its parts separate. ``bytes(chain)`` joins
    them for any other writer.
    """

    __slots__ = ("parts", "_size")

    def __init__(self, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        self.parts = list(parts)
        self._size = sum(len(p) for p in self.parts)

    def __len__(self) -> int:
        return self._size

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RecordChain):
            return bytes(self) == bytes(other)
        if isinstance(other, (bytes, bytearray, memoryview)):
            return bytes(self) == bytes(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"RecordChain({len(self.parts)} parts, {self._size} bytes)"


class ChunkWriter:
    """A write-only buffer that returns its contents as a list of pieces."""

    __slots__ = ("_parts", "_tail", "size")

    def __init__(self) -> None:
        self._parts: list[bytes | bytearray | memoryview] = []
        self._tail = bytearray()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview | RecordChain) -> int:
        n = len(data)
        if isinstance(data, RecordChain):
            self._seal()
            self._parts.extend(data.parts)
        elif n >= _SMALL:
            self._seal()
            self._parts.append(data)  # kept as is: parts() users join it once
        else:
            self._tail += data
        self.size += n
        return n

    def _seal(self) -> None:
        if self._tail:
            self._parts.append(self._tail)
            self._tail = bytearray()

    def parts(self) -> list[bytes | bytearray | memoryview]:
        """The pieces as written, uncopied; valid while the encoded values are unchanged."""
        self._seal()
        return self._parts

    def chunks(self) -> list[Chunk]:
        """The pieces as ``bytes`` (Twisted's writeSequence takes only bytes)."""
        return [p if type(p) is bytes else bytes(p) for p in self.parts()]

    def getvalue(self) -> bytes:
        return b"".join(self.parts())
