"""Sparse offset and time indexes of one segment: derived data, rebuilt from the .log.

On-disk formats (big-endian, fixed-size entries, no header):

* ``{base_seq:020d}.index`` — 8-byte entries ``(relative_sequence u32, position u32)``:
  the batch whose first Sequence is ``base_seq + relative_sequence`` starts at byte
  ``position`` of the .log. The first batch always has an entry, then at most one
  entry per ``index_interval_bytes`` of log data. Relative sequences and positions
  strictly increase.
* ``{base_seq:020d}.timeindex`` — 12-byte entries ``(max_timestamp i64,
  relative_sequence u32)``: the running maximum batch timestamp of the segment
  became ``max_timestamp`` at the batch whose first Sequence is
  ``base_seq + relative_sequence``. Appended when the maximum grows, at most one
  entry per index interval, plus a final entry at roll so the last entry always
  names the segment's newest timestamp.

The active segment keeps both in ``array`` objects (``IndexBuilder``); closed
segments map the files read-only (``MappedOffsetIndex`` / ``MappedTimeIndex``), so
memory does not grow with stored data. All classes are reactor-thread only, except
that ``IndexBuilder`` is also used privately by compaction on its worker thread.
"""

from __future__ import annotations

import mmap
import os
import struct
from array import array
from pathlib import Path

OFFSET_ENTRY = struct.Struct(">II")
TIME_ENTRY = struct.Struct(">qI")
NO_TIMESTAMP = -1


class IndexBuilder:
    """Growing in-memory indexes of one segment; decides when an entry is due.

    ``add`` is called once per batch in file order (append, recovery scan,
    compaction writer). ``seal`` adds the final time entry before the indexes
    are written to disk at roll.
    """

    __slots__ = (
        "interval", "rels", "positions", "times", "time_rels",
        "_last_offset_pos", "_last_time_pos", "max_timestamp", "max_timestamp_rel",
    )

    def __init__(self, interval: int) -> None:
        self.interval = max(1, interval)
        self.rels = array("q")
        self.positions = array("q")
        self.times = array("q")
        self.time_rels = array("q")
        self._last_offset_pos = -1
        self._last_time_pos = -1
        self.max_timestamp = NO_TIMESTAMP
        self.max_timestamp_rel = -1

    def add(self, rel: int, position: int, max_timestamp: int) -> None:
        """Record one batch (first Sequence ``base + rel``) written at ``position``."""
        if self._last_offset_pos < 0 or position - self._last_offset_pos >= self.interval:
            self.rels.append(rel)
            self.positions.append(position)
            self._last_offset_pos = position
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.max_timestamp_rel = rel
            if self._last_time_pos < 0 or position - self._last_time_pos >= self.interval:
                self.times.append(max_timestamp)
                self.time_rels.append(rel)
                self._last_time_pos = position

    def seal(self) -> None:
        """Make the last time entry name the segment's newest timestamp."""
        if self.max_timestamp_rel >= 0 and (
            not self.times or self.times[-1] < self.max_timestamp
        ):
            self.times.append(self.max_timestamp)
            self.time_rels.append(self.max_timestamp_rel)

    def lookup(self, rel: int) -> int:
        """File position of the last indexed batch starting at or before ``base + rel``."""
        i = _bisect_right(self.rels.__getitem__, len(self.rels), rel) - 1
        return self.positions[i] if i >= 0 else 0

    def time_floor(self, timestamp: int) -> int:
        """Relative sequence of the last entry with max timestamp < ``timestamp`` (-1 if none)."""
        i = _bisect_left(self.times.__getitem__, len(self.times), timestamp) - 1
        return self.time_rels[i] if i >= 0 else -1

    def offset_bytes(self) -> bytes:
        out = bytearray(OFFSET_ENTRY.size * len(self.rels))
        for i, (rel, pos) in enumerate(zip(self.rels, self.positions)):
            OFFSET_ENTRY.pack_into(out, i * OFFSET_ENTRY.size, rel, pos)
        return bytes(out)

    _STATE = struct.Struct(">6q4q")  # interval, last positions, max ts and rel; array sizes

    def state_bytes(self) -> bytes:
        """Everything the builder holds, for ``from_state`` (a clean shut-down saves the
        active segment's builder so start-up need not rebuild it batch by batch)."""
        arrays = (self.rels, self.positions, self.times, self.time_rels)
        head = self._STATE.pack(self.interval, self._last_offset_pos, self._last_time_pos,
                                self.max_timestamp, self.max_timestamp_rel, 0,
                                *(len(a) for a in arrays))
        out = bytearray(head)
        for a in arrays:
            out += struct.pack(f">{len(a)}q", *a)
        return bytes(out)

    @classmethod
    def from_state(cls, data: bytes | memoryview) -> "IndexBuilder":
        """The builder ``state_bytes`` described; ValueError (struct.error) if it does not
        parse whole."""
        (interval, last_offset, last_time, max_ts, max_rel, _spare,
         *lengths) = cls._STATE.unpack_from(data, 0)
        b = cls(interval)
        b._last_offset_pos, b._last_time_pos = last_offset, last_time
        b.max_timestamp, b.max_timestamp_rel = max_ts, max_rel
        pos = cls._STATE.size
        for a, n in zip((b.rels, b.positions, b.times, b.time_rels), lengths):
            a.extend(struct.unpack_from(f">{n}q", data, pos))
            pos += 8 * n
        if pos != len(data):
            raise ValueError("index builder state has trailing bytes")
        return b

    def time_bytes(self) -> bytes:
        out = bytearray(TIME_ENTRY.size * len(self.times))
        for i, (ts, rel) in enumerate(zip(self.times, self.time_rels)):
            TIME_ENTRY.pack_into(out, i * TIME_ENTRY.size, ts, rel)
        return bytes(out)


def _bisect_right(get, n: int, x: int) -> int:
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if x < get(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _bisect_left(get, n: int, x: int) -> int:
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if get(mid) < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


class _Mapped:
    """A read-only mapping of an index file (empty files map to nothing)."""

    __slots__ = ("_map", "count")
    entry: struct.Struct

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size % self.entry.size:
                raise ValueError(f"{path.name}: size {size} is not a whole number of entries")
            self._map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else None
        finally:
            os.close(fd)
        self.count = size // self.entry.size

    def entry_at(self, i: int) -> tuple[int, int]:
        return self.entry.unpack_from(self._map, i * self.entry.size)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None


class MappedOffsetIndex(_Mapped):
    """A closed segment's offset index, searched in place (reactor thread)."""

    entry = OFFSET_ENTRY

    def _rel(self, i: int) -> int:
        return OFFSET_ENTRY.unpack_from(self._map, i * 8)[0]

    def lookup(self, rel: int) -> int:
        i = _bisect_right(self._rel, self.count, rel) - 1
        return self.entry_at(i)[1] if i >= 0 else 0

    def last(self) -> tuple[int, int] | None:
        return self.entry_at(self.count - 1) if self.count else None

    def first(self) -> tuple[int, int] | None:
        return self.entry_at(0) if self.count else None

    def is_monotonic(self) -> bool:
        prev_rel = prev_pos = -1
        for i in range(self.count):
            rel, pos = self.entry_at(i)
            if rel <= prev_rel or pos <= prev_pos:
                return False
            prev_rel, prev_pos = rel, pos
        return True


class MappedTimeIndex(_Mapped):
    """A closed segment's time index, searched in place (reactor thread)."""

    entry = TIME_ENTRY

    def _ts(self, i: int) -> int:
        return TIME_ENTRY.unpack_from(self._map, i * 12)[0]

    def time_floor(self, timestamp: int) -> int:
        i = _bisect_left(self._ts, self.count, timestamp) - 1
        return self.entry_at(i)[1] if i >= 0 else -1

    def last(self) -> tuple[int, int] | None:
        return self.entry_at(self.count - 1) if self.count else None
