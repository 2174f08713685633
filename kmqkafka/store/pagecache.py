"""A bound on the page cache that segment data occupies: recent durable data stays cached,
older data is dropped (``posix_fadvise(DONTNEED)``) so that new writes reuse its pages.

Why: left alone, the kernel keeps every written page cached until memory runs short, so the
page cache grows by every byte a node stores and each write takes a page from free memory.
On a VM that hands free memory back to its host (virtio-balloon free page reporting, as on
this project's machines) taking such a page costs a host fault: writing a fresh 3 GB file
ran at 210-300 MB/s with 8-11 s of system CPU, the same file with its synced pages dropped
behind it at 850 MB/s with 1.3 s. A 3-node cluster caches three copies of every record, so
its throughput halved once the free pages still backed by the host ran out. Reading cold
data back is the same story (311 MB/s keeping it, 1,278 MB/s dropping it after the read).

``PageCacheBudget`` is one FIFO per node of durable ranges ``(log, segment, start, end)``,
in the order their flushes completed. Once it holds more than ``limit`` bytes (plus a small
``chunk``, so that drops come in steps) the oldest ranges, or their older parts, are dropped
down to ``limit`` and their segments' ``cold_below`` moves past them; tail readers
(consumers within ``limit`` bytes of the node's newest writes) keep reading from memory. A read below
``cold_below`` (a lagging consumer, data from before a restart) drops the cold data its
reader has passed, so a scan of old data does not refill the page cache either. Only clean
pages can be dropped, which is why a range enters the FIFO only once its flush (fdatasync)
has completed.

The Raft log is not under the budget: its files are recycled (raft/storage.py), so its
pages are overwritten in place rather than taken afresh, and dropping them would make every
write into a recycled file read its last page back from the disk first.

Used on the reactor thread only, like the logs it serves.
"""

from __future__ import annotations

import mmap
import os
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kmqkafka.store.segment import Segment

_DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", None)
_PAGE = mmap.PAGESIZE
_OVERLAP = 2 << 20  # the largest folio the page cache uses (a PMD: 2 MiB on x86-64)

DEFAULT_LIMIT = 64 << 20
# A cold read drops what lies between TRAIL and REREAD_MARGIN bytes behind where it starts:
# what this reader (or another) read before. Not what it reads now, because a fetch returns
# whole batches and the next fetch of the same consumer starts inside what this one read past
# its last batch (up to a batch plus the index's slack): dropping that made every fetch start
# with a disk read and cost the kernel's readahead its stride (a consumer of cold 1 KiB
# records fell from 700k to 200k msg/s).
REREAD_MARGIN = 4 << 20
TRAIL = 32 << 20
CHUNK = 1 << 20  # largest merged range (or a 16th of the limit): see PageCacheBudget._ranges


def drop(seg: "Segment", start: int, end: int) -> None:
    """Ask the kernel to drop the clean cached pages of ``seg``'s file in [start, end).

    The kernel drops only whole folios inside the range (a page, or up to 2 MiB where it
    caches a file in large folios), so a folio across the boundary of two consecutive ranges
    would be inside neither: the range is taken back ``_OVERLAP`` bytes, into older data
    that was dropped before."""
    start = max(start - start % _PAGE - _OVERLAP, 0)
    if end <= start:
        return
    fd = seg.read_fd if seg.read_fd is not None else seg.write_fd
    if fd is None:
        _drop_path(seg.path(), start, end - start)
        return
    try:
        _advise(fd, start, end - start)
    except OSError:
        pass


def drop_tree(root: Path) -> None:
    """Drop the clean cached pages of every file under ``root``: a snapshot tree just packed
    for a follower (hard links to the node's segments, read once by tar) or just installed
    from one (fsynced first: dirty pages cannot be dropped). Both are cold data."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            _drop_path(os.path.join(dirpath, name), 0, 0)


def drop_file(fd: int) -> None:
    """Drop the clean cached pages of the whole file open as ``fd``."""
    _advise(fd, 0, 0)


def _drop_path(path: "str | Path", start: int, length: int) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # the file went away (retention, compaction, a deleted topic)
        return
    try:
        _advise(fd, start, length)
    finally:
        os.close(fd)


def _advise(fd: int, start: int, length: int) -> None:
    if _DONTNEED is not None:
        os.posix_fadvise(fd, start, length, _DONTNEED)


class PageCacheBudget:
    """The newest ``limit`` durable bytes of every log sharing it stay cached (see module)."""

    def __init__(self, limit: int = DEFAULT_LIMIT, *, trail: int = TRAIL,
                 margin: int = REREAD_MARGIN) -> None:
        if limit <= 0:
            raise ValueError("limit must be positive (no budget: pass None to the logs)")
        self.limit = limit
        self.trail, self.margin = trail, margin
        self.chunk = min(CHUNK, max(limit // 16, 1))
        self.held = 0
        self.dropped = 0  # bytes dropped from the page cache so far
        # [log, segment, start, end] in the order they became durable; a segment's newest
        # range grows while it is under ``chunk`` and the next one continues it, so a
        # partition that flushes a few hundred bytes at a time does not cost an entry per
        # flush (a 64 MiB budget of 100-byte flushes would otherwise hold 670k entries).
        self._ranges: deque[list[Any]] = deque()
        self._newest: dict["Segment", list[Any]] = {}

    def durable(self, log: Any, seg: "Segment", start: int, end: int) -> None:
        """[start, end) of ``seg`` (a segment of ``log``) was just made durable."""
        if end <= start:
            return
        entry = self._newest.get(seg)
        if entry is not None and entry[3] == start and entry[3] - entry[2] < self.chunk:
            entry[3] = end
        else:
            entry = [log, seg, start, end]
            self._ranges.append(entry)
            self._newest[seg] = entry
        self.held += end - start
        if self.held <= self.limit + self.chunk:
            return  # drops go in steps of at least a chunk, not a syscall per small flush
        while self.held > self.limit:
            entry = self._ranges[0]
            owner, old, a, b = entry
            cut = min(b, a + self.held - self.limit)  # the oldest range, or its older part
            if cut == b:
                self._ranges.popleft()
                if self._newest.get(old) is entry:
                    del self._newest[old]
            else:
                entry[2] = cut
            self.held -= cut - a
            if owner.holds(old):  # else closed, deleted or retention took it: nothing cached
                drop(old, a, cut)
                self.dropped += cut - a
            if cut > old.cold_below:
                old.cold_below = cut

    def forget(self, log: Any) -> None:
        """``log`` was closed or deleted: its ranges leave the budget, so that the budget
        neither keeps a deleted partition's objects alive (each held them until 64 MiB of
        newer writes pushed them out: thousands of deleted topics) nor counts its bytes."""
        kept: deque[list[Any]] = deque()
        for entry in self._ranges:
            if entry[0] is log:
                self.held -= entry[3] - entry[2]
                if self._newest.get(entry[1]) is entry:
                    del self._newest[entry[1]]
            else:
                kept.append(entry)
        self._ranges = kept

    def passed(self, seg: "Segment") -> None:
        """A reader moved on from ``seg`` to the next segment: drop its cold tail."""
        self.after_read(seg, seg.size + self.margin)

    def after_read(self, seg: "Segment", pos: int) -> None:
        """A read from ``pos`` of ``seg``: drop the cold data (below ``seg.cold_below``) that
        its reader has left behind, from ``trail`` to ``margin`` bytes before ``pos``."""
        end = min(pos - self.margin, seg.cold_below)
        start = max(pos - self.trail, 0)
        if end > start:
            drop(seg, start, end)
