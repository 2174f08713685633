"""A snapshot tree as one uncompressed tar stream of known size, produced chunk by chunk.

A leader catches a lagging follower up by sending it the snapshot tree (hard links of its
segments) as a tar, announced by its size (``raft/transport.py``, ``SNAPSHOT_TAR``). Packing
that tar into a temporary file first cost the leader a full copy of its store on disk, one per
follower being caught up, and a full write before the first byte went out: a store filling
half the disk could make the leader refuse writes just to catch a follower up. Here the size is
computed up front from the members' headers and file sizes (``plan``), and the bytes come
straight from the tree's files (``TarPlan.chunks``), which the snapshot never changes.

The follower unpacks the bytes as they arrive (``TarPipe`` from the reactor to a thread
running ``unpack``) rather than saving the tar first: one write of the snapshot, not two, and
no second copy of it on its disk.

Blocking file I/O: ``plan`` and every step of ``chunks`` run on an I/O thread, one at a time;
``unpack`` on a thread of its own for the length of the transfer.
"""
from __future__ import annotations

import io
import os
import shutil
import tarfile
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from kmqkafka.store.fsutil import fsync_dir, sync_tree
from kmqkafka.store.pagecache import drop_file

__all__ = ["CHUNK", "TarPipe", "TarPlan", "plan", "unpack"]

CHUNK = 1 << 20  # bytes per step of ``chunks``
_BLOCK = tarfile.BLOCKSIZE


def _padded(size: int) -> int:
    return -(-size // _BLOCK) * _BLOCK


@dataclass(frozen=True)
class TarPlan:
    """The members of one tar (header bytes, and the file to copy for a regular file) and the
    exact size of the stream ``chunks`` produces."""

    members: tuple[tuple[bytes, Path | None, int], ...]  # (header, file or None, file size)
    size: int

    def chunks(self) -> Iterator[bytes]:
        """The tar, in pieces of at most ``CHUNK`` bytes. Raises ``OSError`` if a file no longer
        has the size planned for it (the stream would not match the size announced). Each file
        read is dropped from the page cache: a snapshot is cold data."""
        out = bytearray()
        for header, path, size in self.members:
            out += header
            if path is None:
                continue
            with open(path, "rb") as f:
                left = size
                while left:
                    piece = f.read(min(left, CHUNK))
                    if not piece:
                        raise OSError(f"{path} shrank below the {size} bytes planned for it")
                    left -= len(piece)
                    out += piece
                    if len(out) >= CHUNK:
                        yield bytes(out)
                        out.clear()
                if os.fstat(f.fileno()).st_size != size:
                    raise OSError(f"{path} changed size while it was being sent")
                drop_file(f.fileno())
            out += bytes(_padded(size) - size)
            if len(out) >= CHUNK:
                yield bytes(out)
                out.clear()
        out += bytes(2 * _BLOCK)  # end of archive
        yield bytes(out)


def plan(root: Path) -> TarPlan:
    """Plan the tar of the tree under ``root``, as ``tarfile`` would write ``add(root,
    arcname=".")``: the root, then each directory's entries in name order (a name already sent
    under another path of the same inode goes as a hard link)."""
    root = Path(root)
    builder = tarfile.TarFile(fileobj=io.BytesIO(), mode="w")
    members: list[tuple[bytes, Path | None, int]] = []
    size = 0

    def add(path: Path, arcname: str) -> None:
        nonlocal size
        info = builder.gettarinfo(str(path), arcname)
        if info is None:  # a socket or other file a tar cannot hold: tarfile skips it too
            return
        header = info.tobuf(builder.format, builder.encoding, builder.errors)
        regular = info.isreg()
        members.append((header, path if regular else None, info.size if regular else 0))
        size += len(header) + (_padded(info.size) if regular else 0)
        if info.isdir():
            for name in sorted(os.listdir(path)):
                add(path / name, f"{arcname}/{name}")

    add(root, ".")
    return TarPlan(tuple(members), size + 2 * _BLOCK)


class TarPipe:
    """The bytes of one incoming tar, from the reactor (``write``, ``close``, ``abort``) to the
    thread that unpacks them (``read``). Back-pressure: once more than ``high`` bytes wait,
    ``pause()`` is called (the link stops reading its socket); ``resume()`` is scheduled with
    ``call_in_reactor`` once the reader brought them under ``low``."""

    def __init__(self, pause: Callable[[], None], resume: Callable[[], None],
                 call_in_reactor: Callable[..., None], high: int = 16 << 20,
                 low: int = 4 << 20) -> None:
        self._pause, self._resume, self._call = pause, resume, call_in_reactor
        self._high, self._low = high, low
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self.progress = 0  # bytes written plus bytes read: grows while the transfer moves
        self._paused = False
        self._closed = False
        self._aborted = False
        self._cv = threading.Condition()

    def write(self, data: bytes | memoryview) -> None:
        """Reactor thread: queue ``data``; dropped once aborted."""
        with self._cv:
            if self._aborted or self._closed:
                return
            self._queue.append(bytes(data))
            self._queued += len(data)
            self.progress += len(data)
            self._cv.notify()
            if self._queued > self._high and not self._paused:
                self._paused = True
                self._pause()

    def close(self) -> None:
        """Reactor thread: every byte was written; ``read`` returns b"" once they are read."""
        with self._cv:
            self._closed = True
            self._cv.notify()

    def abort(self) -> None:
        """Any thread: the transfer is off; the reader's next ``read`` raises."""
        with self._cv:
            self._aborted = True
            self._queue.clear()
            self._cv.notify()

    def read(self, size: int = -1) -> bytes:
        """Unpacking thread: up to ``size`` bytes (at least one unless at the end), blocking
        until some are there; raises ``OSError`` once aborted."""
        with self._cv:
            while not self._queue and not self._closed and not self._aborted:
                self._cv.wait()
            if self._aborted:
                raise OSError("the snapshot transfer was aborted")
            if not self._queue:
                return b""
            chunk = self._queue.popleft()
            if 0 <= size < len(chunk):
                self._queue.appendleft(chunk[size:])
                chunk = chunk[:size]
            self._queued -= len(chunk)
            self.progress += len(chunk)
            if self._paused and self._queued < self._low:
                self._paused = False
                self._call(self._resume)
            return chunk


def unpack(pipe: TarPipe, final: Path) -> None:
    """Unpack the tar read from ``pipe`` into ``final`` (via ``final.part`` and a rename, so a
    crash never leaves a partial tree under the final name). Its files are fsynced first:
    installed, they become the node's segments, which its checkpoint then counts as durable
    (``snapshot.install`` drops them from the page cache once it has copied what it needs).
    On failure the partial tree is removed and the error raised."""
    part = final.with_name(final.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    try:
        with tarfile.open(fileobj=pipe, mode="r|", bufsize=CHUNK) as tar:
            tar.extractall(part, filter="data")
        while pipe.read(CHUNK):  # the archive's end padding: read it, or the link stays paused
            pass
        sync_tree(part)
        if final.exists():
            shutil.rmtree(final)
        os.replace(part, final)
        fsync_dir(final.parent)
    except BaseException:
        pipe.abort()
        shutil.rmtree(part, ignore_errors=True)
        raise
