"""Durable Raft log: hard state, entries and snapshot metadata in one append-only file.

The driver persists every ``Ready`` here (``save``) on its I/O thread and only then sends the
messages that depend on it; a restarted node is rebuilt from ``DiskStorage.open(...)``, which
exposes the ``RestoredState`` attributes (``hard_state``, ``snapshot``, ``entries``).

On-disk layout under ``{data_dir}/raft/``::

    wal          records, appended; rewritten whole (``wal.part``, fsync, rename) on compaction
    snapshots/   state-machine snapshot trees, one directory per snapshot index (owned by the
                 driver; the WAL only records the snapshot's metadata and reference bytes)

A record is ``u32 length, u32 crc32c(payload), payload`` with ``payload = u8 type, body``:

- ``1 ENTRY``: ``u64 index, u64 term, u8 kind, data``. An entry whose index is at or below the
  last one read replaces it and drops everything after it (Raft's overwrite-from-index), so an
  overwrite is just an append.
- ``2 HARD``: ``u64 term, u64 vote (0 = none), u64 commit``; the last one read wins.
- ``3 SNAP``: ``u64 index, u64 term, u32 n, n × u64 voter, data``: the log starts after it.
  Only ever the first record of a file (written by a rewrite).

Recovery reads records in order and stops at the first short or CRC-failing record: a torn tail
from a crash mid-write is cut off (the file is truncated there). Everything before it was
written by completed ``save`` calls; ``save`` fsyncs whenever it wrote entries, a snapshot, or a
term/vote change (a commit-only change is written without fsync: a lost commit index is
re-learned from the leader, and the recorded commit never exceeds what was already fsynced).

Not thread-safe: one caller at a time (the driver serializes ``save`` and ``compact``).
"""
from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING

from twisted.logger import Logger

from kmqkafka.raft.log import HardState
from kmqkafka.raft.messages import Entry, EntryKind, Snapshot, SnapshotMeta
from kmqkafka.records import crc32c
from kmqkafka.store.fsutil import fsync_dir

if TYPE_CHECKING:
    from kmqkafka.raft.core import Ready

__all__ = ["DiskStorage", "CorruptLog"]

log = Logger()

WAL = "wal"
_REC = struct.Struct(">II")
_ENTRY = struct.Struct(">BQQB")
_HARD = struct.Struct(">BQQQ")
_SNAP = struct.Struct(">BQQI")
_U64 = struct.Struct(">Q")
T_ENTRY, T_HARD, T_SNAP = 1, 2, 3
_MAX_RECORD = 1 << 31


class CorruptLog(Exception):
    """The WAL holds a CRC-valid record that breaks the log's structure (not a torn tail)."""


def _frame(payload: bytes | bytearray) -> bytes:
    return _REC.pack(len(payload), crc32c(payload)) + payload


def _entry_record(e: Entry) -> bytes:
    return _frame(_ENTRY.pack(T_ENTRY, e.index, e.term, e.kind) + e.data)


def _hard_record(hs: HardState) -> bytes:
    return _frame(_HARD.pack(T_HARD, hs.term, hs.vote or 0, hs.commit))


def _snap_record(s: Snapshot) -> bytes:
    voters = sorted(s.meta.voters)
    body = _SNAP.pack(T_SNAP, s.meta.index, s.meta.term, len(voters))
    body += b"".join(_U64.pack(v) for v in voters) + s.data
    return _frame(body)


class DiskStorage:
    """The persisted Raft state of one node (see the module docstring for the format)."""

    def __init__(self, directory: Path) -> None:
        """Use ``DiskStorage.open``."""
        self.directory = Path(directory)
        self.hard_state = HardState()
        self.snapshot: Snapshot | None = None
        self.entries: list[Entry] = []
        self.wal_bytes = 0
        self.truncated_bytes = 0  # torn tail cut off by the last open
        self._fd = -1

    # ------------------------------------------------------------------ open / close

    @classmethod
    def open(cls, directory: Path) -> "DiskStorage":
        """Open (creating if needed) and recover ``directory``; blocking, start-up only."""
        st = cls(directory)
        st.directory.mkdir(parents=True, exist_ok=True)
        (st.directory / "snapshots").mkdir(exist_ok=True)
        part = st.directory / (WAL + ".part")
        if part.exists():
            part.unlink()  # a rewrite that never reached its rename
        path = st.directory / WAL
        st._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        st._load()
        fsync_dir(st.directory)
        return st

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @property
    def path(self) -> Path:
        return self.directory / WAL

    @property
    def snapshot_dir(self) -> Path:
        """Where the driver keeps state-machine snapshot trees."""
        return self.directory / "snapshots"

    @property
    def first_index(self) -> int:
        return (self.snapshot.meta.index if self.snapshot else 0) + 1

    @property
    def last_index(self) -> int:
        return self.first_index - 1 + len(self.entries)

    def _load(self) -> None:
        size = os.fstat(self._fd).st_size
        data = os.pread(self._fd, size, 0) if size else b""
        view = memoryview(data)
        pos = 0
        while pos + _REC.size <= size:
            length, crc = _REC.unpack_from(view, pos)
            end = pos + _REC.size + length
            if length == 0 or length > _MAX_RECORD or end > size:
                break
            payload = view[pos + _REC.size:end]
            if crc32c(payload) != crc:
                break
            self._replay(payload, pos)
            pos = end
        if pos < size:
            self.truncated_bytes = size - pos
            log.warn("raft log: cut a torn tail of {n} byte(s) at {pos}", n=size - pos, pos=pos)
            os.ftruncate(self._fd, pos)
            os.fsync(self._fd)
        self.wal_bytes = pos
        if self.hard_state.commit > self.last_index:
            # Defensive: never claim a commit beyond what the log holds.
            self.hard_state = HardState(self.hard_state.term, self.hard_state.vote, self.last_index)

    def _replay(self, payload: memoryview, pos: int) -> None:
        kind = payload[0]
        if kind == T_ENTRY:
            _t, index, term, ekind = _ENTRY.unpack_from(payload, 0)
            entry = Entry(index, term, EntryKind(ekind), bytes(payload[_ENTRY.size:]))
            self._put_entries([entry], pos)
        elif kind == T_HARD:
            _t, term, vote, commit = _HARD.unpack_from(payload, 0)
            self.hard_state = HardState(term, vote or None, commit)
        elif kind == T_SNAP:
            _t, index, term, n = _SNAP.unpack_from(payload, 0)
            off = _SNAP.size
            voters = frozenset(_U64.unpack_from(payload, off + 8 * i)[0] for i in range(n))
            data = bytes(payload[off + 8 * n:])
            self.snapshot = Snapshot(SnapshotMeta(index, term, voters), data)
            self.entries = []
        else:
            raise CorruptLog(f"unknown raft log record type {kind} at byte {pos}")

    def _put_entries(self, entries: list[Entry] | tuple[Entry, ...], pos: int = -1) -> None:
        first = entries[0].index
        base = self.first_index
        if not base <= first <= self.last_index + 1:
            raise CorruptLog(f"entry {first} does not follow the log ({base}..{self.last_index})"
                             f" at byte {pos}")
        del self.entries[first - base:]
        self.entries.extend(entries)

    # ------------------------------------------------------------------ writes

    def save(self, ready: "Ready") -> None:
        """Persist a Ready: snapshot (rewrites the file), then entries, then hard state.

        Blocking (I/O thread). Returns once durable as the module docstring describes.
        """
        if ready.snapshot is not None:
            hs = ready.hard_state or self.hard_state
            self.snapshot = ready.snapshot
            self.entries = []
            if ready.entries:
                self._put_entries(ready.entries)
            self.hard_state = hs
            self._rewrite()
            return
        out = bytearray()
        if ready.entries:
            self._put_entries(ready.entries)
            for e in ready.entries:
                out += _entry_record(e)
        sync = bool(ready.entries)
        if ready.hard_state is not None:
            old = self.hard_state
            self.hard_state = ready.hard_state
            out += _hard_record(ready.hard_state)
            sync = sync or (old.term, old.vote) != (ready.hard_state.term, ready.hard_state.vote)
        if out:
            self._write(out)
        if sync:
            os.fdatasync(self._fd)

    def compact(self, snapshot: Snapshot) -> None:
        """The application took ``snapshot`` locally: drop the entries it covers and rewrite
        the file (``wal.part``, fsync, rename). Blocking (I/O thread)."""
        covered = snapshot.meta.index - self.first_index + 1
        if covered <= 0:
            return
        del self.entries[:covered]
        self.snapshot = snapshot
        self._rewrite()

    def _write(self, data: bytes | bytearray) -> None:
        view = memoryview(data)
        pos = self.wal_bytes
        while view:
            n = os.pwrite(self._fd, view, pos)
            pos += n
            view = view[n:]
        self.wal_bytes = pos

    def _rewrite(self) -> None:
        part = self.directory / (WAL + ".part")
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            out = bytearray()
            if self.snapshot is not None:
                out += _snap_record(self.snapshot)
            for e in self.entries:
                out += _entry_record(e)
            out += _hard_record(self.hard_state)
            view = memoryview(out)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        os.replace(part, self.path)
        fsync_dir(self.directory)
        os.close(fd)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR)
        self.wal_bytes = len(out)
