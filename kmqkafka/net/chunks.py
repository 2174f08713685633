"""Encoding responses as a list of chunks, so large values reach the socket uncopied.

kio's writers call ``buffer.write`` field by field. ``ChunkWriter`` gathers
small writes into one bytearray and keeps large ones as their own chunks; the
protocol hands the list to ``transport.writeSequence``, which accepts only
``bytes``. A Fetch response whose records are one ``bytes`` object (a single
disk read) therefore reaches the transport without the two copies a BytesIO
would make; other buffers are copied once.
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
    """A write-only buffer that returns its contents as a list of chunks."""

    __slots__ = ("_chunks", "_tail", "size")

    def __init__(self) -> None:
        self._chunks: list[Chunk] = []
        self._tail = bytearray()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview | RecordChain) -> int:
        n = len(data)
        if isinstance(data, RecordChain):
            self._seal()
            self._chunks.append(bytes(data))
        elif n >= _SMALL:
            self._seal()
            # Twisted's writeSequence takes only bytes: a bytes value passes uncopied.
            self._chunks.append(data if type(data) is bytes else bytes(data))
        else:
            self._tail += data
        self.size += n
        return n

    def _seal(self) -> None:
        if self._tail:
            self._chunks.append(bytes(self._tail))
            self._tail = bytearray()

    def chunks(self) -> list[Chunk]:
        self._seal()
        return self._chunks

    def getvalue(self) -> bytes:
        return b"".join(self.chunks())
