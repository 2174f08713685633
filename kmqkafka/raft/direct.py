"""Append to a file with ``O_DIRECT``: the bytes go from one reused buffer to the disk.

Why: a Raft log is written, fdatasynced and almost never read back (only by a follower that
fell behind, or a restart). Written through the page cache, every byte of it costs a copy
into freshly allocated pages, their accounting and their writeback: on a 3-node loopback
cluster that copy alone was a fifth of all CPU the daemons used (perf), half of it for the
Raft log. With ``O_DIRECT`` the disk reads the bytes from the buffer below instead.

``O_DIRECT`` needs the buffer's address, the file offset and the length all aligned to the
device's block size. The buffer is an anonymous mmap (page-aligned), and each write starts
at the block holding the current end of the file: the bytes of that block already written
(kept in memory as ``_tail``) are written again in front of the new ones, and the last block
is padded with zeros. Those zeros are never part of the log: the next write starts over
them, and recovery stops at a zero record length exactly as at a torn tail. Rewriting a
block with the bytes it already holds changes nothing if the write is torn.

Where ``O_DIRECT`` is refused (tmpfs on older kernels, another filesystem, a block size
above ``ALIGN``) the caller writes through the page cache instead.
"""

from __future__ import annotations

import errno
import mmap
import os
from typing import Any, Sequence

ALIGN = 4096
"""Alignment of offsets, lengths and the buffer (covers 512- and 4096-byte devices)."""
CHUNK = 4 << 20
"""Staging buffer size: the most bytes written per ``pwrite``; bounds the memory used."""


class DirectAppender:
    """Appends to one file through ``O_DIRECT``; knows where the file's data ends."""

    __slots__ = ("fd", "end", "_tail", "_buf", "_view")

    def __init__(self, fd: int, end: int, tail: bytes) -> None:
        """Use ``open_direct``. ``tail``: the file's bytes from ``end`` rounded down to
        ``ALIGN`` up to ``end``."""
        self.fd = fd
        self.end = end
        self._tail = tail
        # Private, not the default shared mapping: plain anonymous pages, which a direct write
        # pins without the shared-memory lookups (perf showed those on every write).
        self._buf = mmap.mmap(-1, CHUNK, flags=mmap.MAP_PRIVATE)
        self._view = memoryview(self._buf)

    def append(self, pieces: Sequence[Any]) -> int:
        """Write ``pieces`` (bytes-like) at the end of the data; returns the new end.

        Blocking; raises ``OSError`` as ``pwrite`` does. On a failure the end stays where it
        was: the caller's next write (if any) starts over whatever part went out."""
        view = self._view
        start = self.end - len(self._tail)
        fill = len(self._tail)
        view[:fill] = self._tail
        for piece in pieces:
            src = memoryview(piece).cast("B")
            while src:
                n = min(len(src), CHUNK - fill)
                view[fill:fill + n] = src[:n]
                fill += n
                src = src[n:]
                if fill == CHUNK:
                    self._write(start, CHUNK)
                    start += CHUNK
                    fill = 0
        keep = fill % ALIGN
        if fill:
            whole = fill - keep
            if keep:
                view[fill:whole + ALIGN] = bytes(whole + ALIGN - fill)
            self._write(start, whole + (ALIGN if keep else 0))
        self._tail = bytes(view[fill - keep:fill])
        self.end = start + fill
        return self.end

    def wrote(self, pieces: Sequence[Any]) -> None:
        """The caller wrote ``pieces`` at the end through the page cache (a write too small
        to sync, on the reactor thread): move the end past them, keeping the new tail block
        in memory. The next ``append`` rewrites that block; the kernel writes the cached page
        back before it does, so the two paths never disagree on the file's bytes."""
        total = sum(len(memoryview(p).cast("B")) for p in pieces)
        keep = (self.end + total) % ALIGN
        parts: list[bytes] = []
        need = keep
        for piece in reversed([self._tail, *pieces]):
            if need <= 0:
                break
            b = memoryview(piece).cast("B")
            take = min(need, len(b))
            parts.append(bytes(b[len(b) - take:]))
            need -= take
        self._tail = b"".join(reversed(parts))
        self.end += total

    def _write(self, at: int, length: int) -> None:
        out = self._view[:length]
        done = 0
        while done < length:
            n = os.pwrite(self.fd, out[done:], at + done)
            if n <= 0 or n % ALIGN:
                raise OSError(errno.EIO, f"short direct write ({n} of {length - done} bytes)")
            done += n

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._view.release()
        self._buf.close()


def open_direct(path: os.PathLike | str, end: int) -> DirectAppender | None:
    """A ``DirectAppender`` for ``path`` whose data ends at ``end``, or None where the
    filesystem refuses ``O_DIRECT``. Some filesystems accept the flag and refuse the first
    write (EINVAL): the caller falls back then."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        fd = os.open(path, os.O_RDWR | flag)
    except OSError:
        return None
    try:
        return DirectAppender(fd, end, _read_tail(path, end - end % ALIGN, end))
    except OSError:
        os.close(fd)
        return None


def _read_tail(path: os.PathLike | str, at: int, end: int) -> bytes:
    """The bytes ``at..end`` of ``path``, read through the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        tail = os.pread(fd, end - at, at)
    finally:
        os.close(fd)
    if len(tail) != end - at:
        raise OSError(errno.EIO, f"{path}: short read of its last block")
    return tail
