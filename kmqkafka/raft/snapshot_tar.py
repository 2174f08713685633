"""A snapshot tree as one uncompressed tar stream of known size, produced chunk by chunk.

A leader catches a lagging follower up by sending it the snapshot tree (hard links of its
segments) as a tar, announced by its size (``raft/transport.py``, ``SNAPSHOT_TAR``). Packing
that tar into a temporary file first cost the leader a full copy of its store on disk, one per
follower being caught up, and a full write before the first byte went out: a store filling
half the disk could make the leader refuse writes just to catch a follower up. Here the size is
computed up front from the members' headers and file sizes (``plan``), and the bytes come
straight from the tree's files (``TarPlan.chunks``), which the snapshot never changes.

Blocking file I/O: ``plan`` and every step of ``chunks`` run on an I/O thread, one at a time.
"""
from __future__ import annotations

import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from kmqkafka.store.pagecache import drop_file

__all__ = ["CHUNK", "TarPlan", "plan"]

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
