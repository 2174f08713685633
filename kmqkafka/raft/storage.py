"""Durable Raft log: hard state, entries and snapshot metadata in append-only files.

The driver persists every ``Ready`` here (``save``) on its I/O thread and only then sends the
messages that depend on it; a restarted node is rebuilt from ``DiskStorage.open(...)``, which
exposes the ``RestoredState`` attributes (``hard_state``, ``snapshot``, ``entries``).

On-disk layout under ``{data_dir}/raft/``::

    wal.NNNNNNNN records, appended, in numbered files read in order (a legacy ``wal`` file
                 sorts first); a file is closed (rolled) once it passes ``roll_bytes``
    snapshots/   state-machine snapshot trees, one directory per snapshot index (owned by the
                 driver; the WAL only records the snapshot's metadata and reference bytes)

A record is ``u32 length, u32 crc32c(payload), payload`` with ``payload = u8 type, body``:

- ``1 ENTRY``: ``u64 index, u64 term, u8 kind, data``. An entry whose index is at or below the
  last one read replaces it and drops everything after it (Raft's overwrite-from-index), so an
  overwrite is just an append. Written with ``os.pwritev`` of (header, data): entry payloads
  are never copied into a buffer.
- ``2 HARD``: ``u64 term, u64 vote (0 = none), u64 commit``; the last one read wins. Every
  rolled file starts with one (and with a COMPACT record of the current snapshot, if any), so
  dropping older files never loses the hard state or the snapshot.
- ``3 SNAP``: ``u64 index, u64 term, u32 n, n x u64 voter, data``: an installed snapshot; the
  log restarts after it (entries read before it are dropped). First record of the file a
  ``save`` of a snapshot writes (older files are then deleted).
- ``4 COMPACT``: same body as SNAP: the application took a snapshot at ``index`` locally;
  entries up to it are dropped, later ones kept (log compaction, ``compact``).

Compaction appends a COMPACT record (fdatasync), rolls to a new file and deletes the older
files whose entries are all covered: no rewrite, no copy, nothing waits for it but a small
write. Recovery therefore may meet a first surviving entry above the snapshot it knows so far
(its predecessors were in a deleted file); the COMPACT record written before that deletion,
later in the read order, covers the gap, and a gap left uncovered is ``CorruptLog``.

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
from typing import TYPE_CHECKING, Any

import crc32c as _crc32c

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
T_ENTRY, T_HARD, T_SNAP, T_COMPACT = 1, 2, 3, 4
_MAX_RECORD = 1 << 31
ROLL_BYTES = 64 << 20
_IOV_MAX = 512  # buffers per pwritev call (IOV_MAX is 1024 on Linux)


class CorruptLog(Exception):
    """The WAL holds a CRC-valid record that breaks the log's structure (not a torn tail)."""


def _frame(payload: bytes | bytearray) -> bytes:
    return _REC.pack(len(payload), crc32c(payload)) + payload


def _entry_pieces(e: Entry) -> tuple[bytes, Any]:
    """(record header + entry header, data): the CRC runs over both without joining them."""
    head = _ENTRY.pack(T_ENTRY, e.index, e.term, e.kind)
    data = e.data
    crc = _crc32c.crc32c(data, _crc32c.crc32c(head))
    return _REC.pack(len(head) + len(data), crc) + head, data


def _hard_record(hs: HardState) -> bytes:
    return _frame(_HARD.pack(T_HARD, hs.term, hs.vote or 0, hs.commit))


def _snap_record(s: Snapshot, kind: int = T_SNAP) -> bytes:
    voters = sorted(s.meta.voters)
    body = _SNAP.pack(kind, s.meta.index, s.meta.term, len(voters))
    body += b"".join(_U64.pack(v) for v in voters) + s.data
    return _frame(body)


def _file_seq(name: str) -> int | None:
    if name == WAL:
        return 0
    prefix, dot, seq = name.partition(".")
    if prefix != WAL or not dot or not seq.isdigit() or len(seq) != 8:
        return None
    return int(seq)


class _File:
    __slots__ = ("seq", "path", "size", "last_index")

    def __init__(self, seq: int, path: Path, size: int = 0, last_index: int = 0) -> None:
        self.seq = seq
        self.path = path
        self.size = size
        self.last_index = last_index  # highest entry index written to this file


class DiskStorage:
    """The persisted Raft state of one node (see the module docstring for the format)."""

    def __init__(self, directory: Path, roll_bytes: int = ROLL_BYTES) -> None:
        """Use ``DiskStorage.open``."""
        self.directory = Path(directory)
        self.roll_bytes = roll_bytes
        self.hard_state = HardState()
        self.snapshot: Snapshot | None = None
        self.entries: list[Entry] = []
        self._start = 1  # index of entries[0]
        self.truncated_bytes = 0  # torn tail cut off by the last open
        self._files: list[_File] = []
        self._fd = -1

    # ------------------------------------------------------------------ open / close

    @classmethod
    def open(cls, directory: Path, roll_bytes: int = ROLL_BYTES) -> "DiskStorage":
        """Open (creating if needed) and recover ``directory``; blocking, start-up only."""
        st = cls(directory, roll_bytes)
        st.directory.mkdir(parents=True, exist_ok=True)
        (st.directory / "snapshots").mkdir(exist_ok=True)
        for name in os.listdir(st.directory):
            if name.startswith(WAL) and name.endswith(".part"):
                (st.directory / name).unlink()  # from the single-file format's rewrite
        found = sorted((seq, name) for name in os.listdir(st.directory)
                       if (seq := _file_seq(name)) is not None)
        st._files = [_File(seq, st.directory / name) for seq, name in found]
        if not st._files:
            st._files = [_File(1, st.directory / f"{WAL}.{1:08d}")]
        st._load()
        st._fd = os.open(st._files[-1].path, os.O_RDWR | os.O_CREAT, 0o644)
        fsync_dir(st.directory)
        return st

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @property
    def path(self) -> Path:
        """The file being appended to."""
        return self._files[-1].path

    @property
    def wal_bytes(self) -> int:
        """Bytes in every WAL file (what compaction bounds)."""
        return sum(f.size for f in self._files)

    @property
    def file_count(self) -> int:
        return len(self._files)

    @property
    def snapshot_dir(self) -> Path:
        """Where the driver keeps state-machine snapshot trees."""
        return self.directory / "snapshots"

    @property
    def first_index(self) -> int:
        return self._start

    @property
    def last_index(self) -> int:
        return self._start - 1 + len(self.entries)

    def _snap_index(self) -> int:
        return self.snapshot.meta.index if self.snapshot is not None else 0

    def _load(self) -> None:
        last = len(self._files) - 1
        for i, f in enumerate(self._files):
            f.size = self._load_file(f, final=i == last)
        snap = self._snap_index()
        if not self.entries:
            self._start = snap + 1
        elif self._start != snap + 1:
            raise CorruptLog(f"raft log: entries start at {self._start} but the snapshot "
                             f"ends at {snap} (a WAL file is missing)")
        if self.hard_state.commit > self.last_index:
            # Defensive: never claim a commit beyond what the log holds.
            self.hard_state = HardState(self.hard_state.term, self.hard_state.vote, self.last_index)

    def _load_file(self, f: _File, final: bool) -> int:
        try:
            fd = os.open(f.path, os.O_RDWR)
        except FileNotFoundError:
            return 0
        try:
            size = os.fstat(fd).st_size
            data = os.pread(fd, size, 0) if size else b""
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
                self._replay(payload, pos, f)
                pos = end
            if pos < size:
                if not final:
                    log.warn("raft log: {file} (not the last file) has a bad tail",
                             file=f.path.name)
                self.truncated_bytes += size - pos
                log.warn("raft log: cut a torn tail of {n} byte(s) at {pos} of {file}",
                         n=size - pos, pos=pos, file=f.path.name)
                os.ftruncate(fd, pos)
                os.fsync(fd)
            return pos
        finally:
            os.close(fd)

    def _replay(self, payload: memoryview, pos: int, f: _File) -> None:
        kind = payload[0]
        if kind == T_ENTRY:
            _t, index, term, ekind = _ENTRY.unpack_from(payload, 0)
            entry = Entry(index, term, EntryKind(ekind), bytes(payload[_ENTRY.size:]))
            self._put_entries([entry], pos, loading=True)
            f.last_index = max(f.last_index, index)
        elif kind == T_HARD:
            _t, term, vote, commit = _HARD.unpack_from(payload, 0)
            self.hard_state = HardState(term, vote or None, commit)
        elif kind in (T_SNAP, T_COMPACT):
            _t, index, term, n = _SNAP.unpack_from(payload, 0)
            off = _SNAP.size
            voters = frozenset(_U64.unpack_from(payload, off + 8 * i)[0] for i in range(n))
            data = bytes(payload[off + 8 * n:])
            self.snapshot = Snapshot(SnapshotMeta(index, term, voters), data)
            if kind == T_SNAP:
                self.entries = []
                self._start = index + 1
            else:
                self._drop_through(index)
        else:
            raise CorruptLog(f"unknown raft log record type {kind} at byte {pos}")

    def _drop_through(self, index: int) -> None:
        """Drop entries up to ``index`` (a local snapshot covers them)."""
        if index >= self.last_index:
            self.entries = []
            self._start = index + 1
        elif index >= self._start:
            del self.entries[:index - self._start + 1]
            self._start = index + 1

    def _put_entries(self, entries: list[Entry] | tuple[Entry, ...], pos: int = -1,
                     loading: bool = False) -> None:
        first = entries[0].index
        last = self.last_index
        if loading and first > last + 1:
            # Its predecessors were in a file compaction deleted: a later COMPACT covers them.
            self.entries = []
            self._start = first
        elif not self._snap_index() < first <= last + 1 or first < self._start:
            raise CorruptLog(f"entry {first} does not follow the log ({self._start}..{last})"
                             f" at byte {pos}")
        del self.entries[first - self._start:]
        self.entries.extend(entries)

    # ------------------------------------------------------------------ writes

    def save(self, ready: "Ready") -> None:
        """Persist a Ready: snapshot (starts a new file), then entries, then hard state.

        Blocking (I/O thread). Returns once durable as the module docstring describes.
        """
        if ready.snapshot is not None:
            hs = ready.hard_state or self.hard_state
            self.snapshot = ready.snapshot
            self.entries = []
            self._start = ready.snapshot.meta.index + 1
            if ready.entries:
                self._put_entries(ready.entries)
            self.hard_state = hs
            self._restart_with_snapshot()
            return
        if self._files[-1].size >= self.roll_bytes and (ready.entries or ready.hard_state):
            self._roll()
        pieces: list[Any] = []
        f = self._files[-1]
        if ready.entries:
            self._put_entries(ready.entries)
            for e in ready.entries:
                pieces.extend(_entry_pieces(e))
            f.last_index = max(f.last_index, ready.entries[-1].index)
        sync = bool(ready.entries)
        if ready.hard_state is not None:
            old = self.hard_state
            self.hard_state = ready.hard_state
            pieces.append(_hard_record(ready.hard_state))
            sync = sync or (old.term, old.vote) != (ready.hard_state.term, ready.hard_state.vote)
        if pieces:
            self._write(pieces)
        if sync:
            os.fdatasync(self._fd)

    def compact(self, snapshot: Snapshot) -> None:
        """The application took ``snapshot`` locally: record it (COMPACT, fdatasync), drop
        the entries it covers, roll, and delete the files it covers whole. Blocking (I/O
        thread)."""
        index = snapshot.meta.index
        if index < self._start:
            return
        self._write([_snap_record(snapshot, T_COMPACT)])
        os.fdatasync(self._fd)
        self.snapshot = snapshot
        self._drop_through(index)
        self._roll()
        keep = [f for f in self._files[:-1] if f.last_index > index]
        gone = [f for f in self._files[:-1] if f.last_index <= index]
        for f in gone:
            f.path.unlink(missing_ok=True)
        self._files = keep + self._files[-1:]
        if gone:
            fsync_dir(self.directory)

    def _write(self, pieces: list[Any]) -> None:
        f = self._files[-1]
        pos = f.size
        while pieces:
            chunk = pieces[:_IOV_MAX]
            want = sum(len(p) for p in chunk)
            n = os.pwritev(self._fd, chunk, pos)
            pos += n
            if n == want:
                del pieces[:_IOV_MAX]
                continue
            # Short write: skip what went out, retry the rest.
            rest: list[Any] = []
            for p in pieces:
                if n >= len(p):
                    n -= len(p)
                    continue
                rest.append(memoryview(p)[n:] if n else p)
                n = 0
            pieces = rest
        f.size = pos

    def _new_file(self) -> tuple[_File, int]:
        seq = self._files[-1].seq + 1
        f = _File(seq, self.directory / f"{WAL}.{seq:08d}")
        fd = os.open(f.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        return f, fd

    def _roll(self) -> None:
        """Start a new file, beginning with the hard state and the snapshot (as COMPACT),
        so deleting every older file loses neither."""
        f, fd = self._new_file()
        record = _hard_record(self.hard_state)
        if self.snapshot is not None:
            record += _snap_record(self.snapshot, T_COMPACT)
        try:
            os.pwrite(fd, record, 0)
            os.fdatasync(fd)
        except BaseException:
            os.close(fd)
            raise
        fsync_dir(self.directory)
        os.close(self._fd)
        self._fd = fd
        f.size = len(record)
        self._files.append(f)

    def _restart_with_snapshot(self) -> None:
        """A new file holding the installed snapshot, the entries after it and the hard
        state; then the older files go (recovery would drop their entries anyway)."""
        f, fd = self._new_file()
        pieces: list[Any] = [_snap_record(self.snapshot)] if self.snapshot else []
        for e in self.entries:
            pieces.extend(_entry_pieces(e))
        pieces.append(_hard_record(self.hard_state))
        f.last_index = self.last_index if self.entries else 0
        os.close(self._fd)
        self._fd = fd
        self._files.append(f)
        self._write(pieces)
        os.fsync(fd)
        fsync_dir(self.directory)
        for old in self._files[:-1]:
            old.path.unlink(missing_ok=True)
        self._files = self._files[-1:]
        fsync_dir(self.directory)
