"""Durable Raft log: hard state, entries and snapshot metadata in append-only files.

The driver persists every ``Ready`` here (``save``) on its I/O thread and only then sends the
messages that depend on it; a restarted node is rebuilt from ``DiskStorage.open(...)``, which
exposes the ``RestoredState`` attributes (``hard_state``, ``snapshot``, ``entries``).

On-disk layout under ``{data_dir}/raft/``::

    wal.NNNNNNNN records, appended, in numbered files read in order (a legacy ``wal`` file
                 sorts first); a file is closed (rolled) once it passes ``roll_bytes``
    snapshots/   state-machine snapshot trees, one directory per snapshot index (owned by the
                 driver; the WAL only records the snapshot's metadata and reference bytes)

A record is ``u32 length, u32 crc, payload`` with ``payload = u8 type, body`` and
``crc = crc32c(payload)`` seeded with the file's salt (see FILE below; 0 in older files):

- ``1 ENTRY``: ``u64 index, u64 term, u8 kind, data``. An entry whose index is at or below the
  last one read replaces it and drops everything after it (Raft's overwrite-from-index), so an
  overwrite is just an append. Written with ``os.pwritev`` of (header, data): entry payloads
  are never copied into a buffer.
- ``6 STATE``: ``u64 term, u64 vote + 1 (0 = none), u64 commit``; the last one read wins.
  Every rolled file starts with one (and with a COMPACT record of the current snapshot, if
  any), so dropping older files never loses the hard state or the snapshot. Older versions
  wrote ``2 HARD`` instead, whose vote is the id itself (0 = none: node 0 could not exist
  then); both are read.
- ``3 SNAP``: ``u64 index, u64 term, u32 n, n x u64 voter, data``: an installed snapshot; the
  log restarts after it (entries read before it are dropped). First record of the file a
  ``save`` of a snapshot writes (older files are then deleted).
- ``4 COMPACT``: same body as SNAP: the application took a snapshot at ``index`` locally;
  entries up to it are dropped, later ones kept (log compaction, ``compact``).
- ``5 FILE``: ``u64 seq``: first record of every file this version writes; the file's records
  (this one included) carry CRCs seeded with ``salt(seq)``. A file without it (older versions)
  is read with seed 0.

Recycling: a file compaction frees is not deleted but renamed ``wal-free.NNNNNNNN`` (a few are
kept) and reused for a later roll: overwriting blocks a file already owns costs the page cache
and the ``fdatasync`` far less than growing a new file (no block allocation, no metadata to
journal). Its old records stay behind the new ones until overwritten; they were written with
another salt, so recovery's CRC check stops at the first of them exactly as at a torn tail. A
free file is re-headed (FILE, HARD, COMPACT records), fdatasynced, and only then renamed to its
``wal.`` name, so a crash never exposes a recycled file whose first record is stale.

Compaction appends a COMPACT record (fdatasync), rolls to a new file and deletes the older
files whose entries are all covered: no rewrite, no copy, nothing waits for it but a small
write. Recovery therefore may meet a first surviving entry above the snapshot it knows so far
(its predecessors were in a deleted file); the COMPACT record written before that deletion,
later in the read order, covers the gap, and a gap left uncovered is ``CorruptLog``.

In memory: an entry whose data is more than a few bytes is held as a ``Stored`` reference to
its record (file, offset, length) from the moment it is written, and after a restart; the
driver swaps the same references into the core once the entry is applied. Its bytes are read
back (the record's CRC checked) only for a follower that still lacks it or a replay, so a
node's memory holds its unapplied entries, not everything since the last compaction.

Writes: records are appended to the last file with ``O_DIRECT`` where the filesystem allows
it (``raft/direct.py``): the log is fdatasynced and rarely read back, so its bytes need not
pass through the page cache. A direct write ends with zeros up to a block boundary; the next
write starts over them and recovery stops at them as at a torn tail. Elsewhere, and on a
one-member cluster (whose log holds positions, not data, written on the reactor thread), the
writes go through the page cache.

Recovery reads records in order and stops at the first short or CRC-failing record: a torn tail
from a crash mid-write is cut off (the file is truncated there). Everything before it was
written by completed ``save`` calls; ``save`` fsyncs whenever it wrote entries, a snapshot, or a
term/vote change (a commit-only change is written without fsync: a lost commit index is
re-learned from the leader, and the recorded commit never exceeds what was already fsynced).

Not thread-safe: one caller at a time (the driver serializes ``save`` and ``compact``).
"""
from __future__ import annotations

import errno
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

import crc32c as _crc32c

from twisted.logger import Logger

from kmqkafka.raft.direct import ALIGN, DirectAppender, open_direct
from kmqkafka.raft.log import HardState
from kmqkafka.raft.messages import Entry, EntryKind, Gather, Snapshot, SnapshotMeta, Stored
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
T_ENTRY, T_HARD, T_SNAP, T_COMPACT, T_FILE, T_STATE = 1, 2, 3, 4, 5, 6
FREE = "wal-free"
KEEP_FREE = 4  # freed files kept for reuse (default; see DiskStorage.keep_free)
PREPARE_STEP = 4 << 20  # bytes of a new free file written per ``prepare_free`` call
_MAX_RECORD = 1 << 31
ROLL_BYTES = 64 << 20
_IOV_MAX = 512  # buffers per pwritev call (IOV_MAX is 1024 on Linux)
_INLINE_MAX = 64  # entry data up to this size stays in memory (no ``Stored`` reference)
_DATA_AT = _REC.size + _ENTRY.size  # an entry's data, from the start of its record


class CorruptLog(Exception):
    """The WAL holds a CRC-valid record that breaks the log's structure (not a torn tail)."""


def salt(seq: int) -> int:
    """The CRC seed of file ``seq`` (never 0, the seed of files without a FILE record)."""
    return ((seq * 0x9E3779B1) ^ 0x6B6D7121) & 0xFFFFFFFF or 1


def _frame(payload: bytes | bytearray, seed: int = 0) -> bytes:
    return _REC.pack(len(payload), _crc32c.crc32c(payload, seed)) + payload


def _file_record(seq: int) -> bytes:
    return _frame(bytes([T_FILE]) + _U64.pack(seq), salt(seq))


def _entry_pieces(e: Entry, seed: int = 0) -> list[Any]:
    """[record header + entry header, data...]: the CRC runs over all of them without joining
    them (a ``Gather``'s parts are written as they are)."""
    head = _ENTRY.pack(T_ENTRY, e.index, e.term, e.kind)
    data = e.data.load() if type(e.data) is Stored else e.data
    crc = _crc32c.crc32c(head, seed)
    if type(data) is Gather:
        for part in data.parts:
            crc = _crc32c.crc32c(part, crc)
        return [_REC.pack(len(head) + data.size, crc) + head, *data.parts]
    crc = _crc32c.crc32c(data, crc)
    return [_REC.pack(len(head) + len(data), crc) + head, data]


def _hard_record(hs: HardState, seed: int = 0) -> bytes:
    vote = 0 if hs.vote is None else hs.vote + 1
    return _frame(_HARD.pack(T_STATE, hs.term, vote, hs.commit), seed)


def _snap_record(s: Snapshot, kind: int = T_SNAP, seed: int = 0) -> bytes:
    voters = sorted(s.meta.voters)
    body = _SNAP.pack(kind, s.meta.index, s.meta.term, len(voters))
    body += b"".join(_U64.pack(v) for v in voters) + s.data
    return _frame(body, seed)


def _file_seq(name: str) -> int | None:
    if name == WAL:
        return 0
    prefix, dot, seq = name.partition(".")
    if prefix != WAL or not dot or not seq.isdigit() or len(seq) != 8:
        return None
    return int(seq)


class _Reader:
    """A read-only descriptor of one WAL file, for the ``Stored`` entries in it. Each of them
    holds ``read`` (so this object): the descriptor is closed once none is left. A file is
    freed (deleted, or recycled and overwritten) only after compaction dropped every entry in
    it from the Raft core, so nothing reads it then; ``read`` checks the record's CRC anyway
    and raises ``CorruptLog`` rather than return other bytes."""

    __slots__ = ("fd", "seed", "name")

    def __init__(self, path: Path, seed: int) -> None:
        self.fd = os.open(path, os.O_RDONLY)
        self.seed = seed
        self.name = path.name

    def read(self, at: int, size: int) -> memoryview:
        """The data of the entry record at offset ``at`` (``size`` bytes of it)."""
        buf = bytearray(_DATA_AT + size)
        view = memoryview(buf)
        if not self._read_into(buf, at):
            # A read racing a direct write of the same block can leave the block's older
            # bytes cached (the kernel does not order the two): drop them, read the disk.
            os.posix_fadvise(self.fd, at, len(buf), os.POSIX_FADV_DONTNEED)
            if not self._read_into(buf, at):
                raise CorruptLog(f"raft log: the entry record at byte {at} of {self.name} is "
                                 f"gone or damaged")
        return view[_DATA_AT:].toreadonly()  # as a follower's received entries are

    def _read_into(self, buf: bytearray, at: int) -> bool:
        n = os.preadv(self.fd, [buf], at)
        length, crc = _REC.unpack_from(buf, 0)
        return (n == len(buf) and length == len(buf) - _REC.size and buf[_REC.size] == T_ENTRY
                and _crc32c.crc32c(memoryview(buf)[_REC.size:], self.seed) == crc)

    def __del__(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _File:
    __slots__ = ("seq", "path", "size", "last_index", "seed", "reader")

    def __init__(self, seq: int, path: Path, size: int = 0, last_index: int = 0,
                 seed: int = 0) -> None:
        self.seq = seq
        self.path = path
        self.size = size
        self.last_index = last_index  # highest entry index written to this file
        self.seed = seed              # CRC seed of its records (0: no FILE record)
        self.reader: _Reader | None = None  # for its Stored entries (opened with the file)

    def open_reader(self) -> _Reader:
        if self.reader is None:
            self.reader = _Reader(self.path, self.seed)
        return self.reader


class DiskStorage:
    """The persisted Raft state of one node (see the module docstring for the format)."""

    direct_writes = True  # append with O_DIRECT where the filesystem allows (see Writes)

    def __init__(self, directory: Path, roll_bytes: int = ROLL_BYTES,
                 keep_free: int = KEEP_FREE) -> None:
        """Use ``DiskStorage.open``."""
        self.directory = Path(directory)
        self.roll_bytes = roll_bytes
        # Freed files kept for reuse: enough for every roll between two compactions, so a
        # node in steady state never grows a file (nor takes fresh pages for one).
        self.keep_free = keep_free
        self.hard_state = HardState()
        self.snapshot: Snapshot | None = None
        self.entries: list[Entry] = []
        self._start = 1  # index of entries[0]
        self.truncated_bytes = 0  # torn tail cut off by the last open
        self._files: list[_File] = []
        self._free: list[Path] = []  # freed files kept for reuse (see "Recycling")
        self._fd = -1
        self._direct: DirectAppender | None = None  # appends to the last file (see Writes)
        self.recycled = 0

    # ------------------------------------------------------------------ open / close

    @classmethod
    def open(cls, directory: Path, roll_bytes: int = ROLL_BYTES,
             keep_free: int = KEEP_FREE, direct: bool = True) -> "DiskStorage":
        """Open (creating if needed) and recover ``directory``; blocking, start-up only.
        ``direct``: append with O_DIRECT where the filesystem allows (see Writes)."""
        st = cls(directory, roll_bytes, keep_free)
        st.direct_writes = direct
        st.directory.mkdir(parents=True, exist_ok=True)
        (st.directory / "snapshots").mkdir(exist_ok=True)
        for name in os.listdir(st.directory):
            if name.startswith(WAL) and name.endswith(".part"):
                (st.directory / name).unlink()  # from the single-file format's rewrite
        names = os.listdir(st.directory)
        found = sorted((seq, name) for name in names if (seq := _file_seq(name)) is not None)
        st._free = sorted(st.directory / n for n in names if n.startswith(FREE + "."))
        st._files = [_File(seq, st.directory / name) for seq, name in found]
        if not st._files:
            st._files = [_File(1, st.directory / f"{WAL}.{1:08d}")]
        st._load()
        last = st._files[-1]
        st._fd = os.open(last.path, os.O_RDWR | os.O_CREAT, 0o644)
        if last.size == 0:
            # A new (or emptied) file: give it its FILE record, so it is salted.
            head = _file_record(last.seq)
            os.pwrite(st._fd, head, 0)
            os.fdatasync(st._fd)
            last.size, last.seed = len(head), salt(last.seq)
        st._open_direct()
        fsync_dir(st.directory)
        return st

    def close(self) -> None:
        self._close_direct()
        if self._fd >= 0:
            last = self._files[-1].size
            try:
                if last < os.fstat(self._fd).st_size <= -(-last // ALIGN) * ALIGN:
                    os.ftruncate(self._fd, last)  # the zeros a direct write padded it with
            except OSError:
                pass  # recovery cuts them off as well
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
            seed = salt(f.seq)
            if not self._has_file_record(view, f.seq, seed):
                seed = 0  # written before FILE records existed
            f.seed = seed
            pos = 0
            while pos + _REC.size <= size:
                length, crc = _REC.unpack_from(view, pos)
                end = pos + _REC.size + length
                if length == 0 or length > _MAX_RECORD or end > size:
                    break
                payload = view[pos + _REC.size:end]
                if _crc32c.crc32c(payload, seed) != crc:
                    break
                self._replay(payload, pos, f)
                pos = end
            if pos < size:
                if seed and not final:
                    # A recycled file's old records behind its own: expected, not damage.
                    log.debug("raft log: {file} ends at {pos}", file=f.path.name, pos=pos)
                else:
                    if not final:
                        log.warn("raft log: {file} (not the last file) has a bad tail",
                                 file=f.path.name)
                    self.truncated_bytes += size - pos
                    if seed and final:
                        # Usually a recycled file's old records (another salt), not damage.
                        log.info("raft log: {file} ends at {pos}; cut the {n} byte(s) after it "
                                 "(a recycled file's old records, or a torn write)",
                                 file=f.path.name, pos=pos, n=size - pos)
                    else:
                        log.warn("raft log: cut a torn tail of {n} byte(s) at {pos} of {file}",
                                 n=size - pos, pos=pos, file=f.path.name)
                os.ftruncate(fd, pos)
                os.fsync(fd)
            return pos
        finally:
            os.close(fd)

    @staticmethod
    def _has_file_record(view: memoryview, seq: int, seed: int) -> bool:
        n = _REC.size + 9
        if len(view) < n:
            return False
        length, crc = _REC.unpack_from(view, 0)
        payload = view[_REC.size:n]
        return (length == 9 and _crc32c.crc32c(payload, seed) == crc and payload[0] == T_FILE
                and _U64.unpack_from(payload, 1)[0] == seq)

    def _replay(self, payload: memoryview, pos: int, f: _File) -> None:
        kind = payload[0]
        if kind == T_FILE:
            return
        if kind == T_ENTRY:
            _t, index, term, ekind = _ENTRY.unpack_from(payload, 0)
            size = len(payload) - _ENTRY.size
            if ekind == EntryKind.NORMAL and size > _INLINE_MAX:
                # Left in the file: read back when applied or sent (a restart loads no data).
                data: Any = Stored(f.open_reader().read, pos, size)
            else:
                data = bytes(payload[_ENTRY.size:])
            entry = Entry(index, term, EntryKind(ekind), data)
            self._put_entries([entry], pos, loading=True)
            f.last_index = max(f.last_index, index)
        elif kind in (T_STATE, T_HARD):
            _t, term, vote, commit = _HARD.unpack_from(payload, 0)
            if kind == T_STATE:
                self.hard_state = HardState(term, vote - 1 if vote else None, commit)
            else:  # an older version's record: the vote is the id, 0 none
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

    def save(self, ready: "Ready", sync_entries: bool = True) -> None:
        """Persist a Ready: snapshot (starts a new file), then entries, then hard state.

        Blocking (I/O thread). Returns once durable as the module docstring describes;
        ``sync_entries=False`` skips the fsync entries alone would need (a one-member
        cluster's ELIDED entries: their durability is the application's checkpoint).
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
        at: list[int] = []  # file offset of each entry's record
        if ready.entries:
            self._put_entries(ready.entries)
            seed = f.seed
            pos = f.size
            for e in ready.entries:
                at.append(pos)
                record = _entry_pieces(e, seed)
                pieces.extend(record)
                pos += sum(len(p) for p in record)
            f.last_index = max(f.last_index, ready.entries[-1].index)
        sync = bool(ready.entries) and sync_entries
        if ready.hard_state is not None:
            old = self.hard_state
            self.hard_state = ready.hard_state
            pieces.append(_hard_record(ready.hard_state, f.seed))
            sync = sync or (old.term, old.vote) != (ready.hard_state.term, ready.hard_state.vote)
        if pieces:
            self._write(pieces, direct=sync_entries)
        if at:
            self._keep_on_disk(ready.entries, at, f)
        if sync:
            os.fdatasync(self._fd)

    def _keep_on_disk(self, written: list[Entry] | tuple[Entry, ...], at: list[int],
                      f: _File) -> None:
        """Hold the entries just written as ``Stored`` references to ``f``, not their bytes."""
        read = f.open_reader().read
        base = written[0].index - self._start
        for n, (e, pos) in enumerate(zip(written, at)):
            size = len(e.data)
            if e.kind is EntryKind.NORMAL and size > _INLINE_MAX and type(e.data) is not Stored:
                self.entries[base + n] = Entry(e.index, e.term, e.kind, Stored(read, pos, size))

    def stored_entries(self, lo: int, hi: int) -> list[Entry]:
        """The entries ``lo..hi`` (inclusive) whose data is left in the file; the driver puts
        them in place of applied entries so their bytes can go (``RaftNode.swap_applied``).
        Reactor thread, between saves."""
        lo = max(lo, self._start)
        hi = min(hi, self.last_index)
        return [e for e in self.entries[lo - self._start:hi - self._start + 1]
                if type(e.data) is Stored]

    def compact(self, snapshot: Snapshot) -> None:
        """The application took ``snapshot`` locally: record it (COMPACT, fdatasync), drop
        the entries it covers, roll, and delete the files it covers whole. Blocking (I/O
        thread)."""
        index = snapshot.meta.index
        if index < self._start:
            return
        self._write([_snap_record(snapshot, T_COMPACT, self._files[-1].seed)])
        os.fdatasync(self._fd)
        self.snapshot = snapshot
        self._drop_through(index)
        self._roll()
        keep = [f for f in self._files[:-1] if f.last_index > index]
        gone = [f for f in self._files[:-1] if f.last_index <= index]
        for f in gone:
            if len(self._free) < self.keep_free and f.seed:
                free = self.directory / f"{FREE}.{f.seq:08d}"
                os.replace(f.path, free)
                self._free.append(free)
            else:
                f.path.unlink(missing_ok=True)
        self._files = keep + self._files[-1:]
        if gone:
            fsync_dir(self.directory)

    def prepare_free(self) -> bool:
        """Write one step (``PREPARE_STEP`` bytes of zeros) of a new free file, until
        ``keep_free`` full-size ones wait; returns whether more steps are due. A node that
        starts empty then writes its first Raft log records into blocks and pages it already
        owns, as every roll after its first compactions does (see Recycling): the first
        produce run on a fresh cluster ran at two thirds of the later ones. A file is grown
        as ``wal-free.part`` (removed by ``open`` if a crash cut it short), fdatasynced, and
        renamed ``wal-free.new-<n>`` once full. Blocking (I/O thread), between saves."""
        if len(self._free) >= self.keep_free:
            return False
        part = self.directory / f"{FREE}.part"
        fd = os.open(part, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            step = min(PREPARE_STEP, self.roll_bytes - size)
            if step > 0:
                os.pwrite(fd, bytes(step), size)
                size += step
                # Each step is synced on its own, so no Raft save queued behind this one on
                # the I/O thread waits for a whole file's flush (a cluster's acks at start-up
                # had a p99 of 60-100 ms when the file was synced once at its end).
                os.fdatasync(fd)
            if size < self.roll_bytes:
                return True
        finally:
            os.close(fd)
        n = 1
        while (self.directory / f"{FREE}.new-{n}").exists():
            n += 1
        free = self.directory / f"{FREE}.new-{n}"
        os.replace(part, free)
        fsync_dir(self.directory)
        self._free.append(free)
        return len(self._free) < self.keep_free

    def restart_at(self, snapshot: Snapshot, hard_state: HardState) -> None:
        """Start-up only (blocking): the application's durable state is at ``snapshot``,
        past every entry held here (a one-member cluster whose checkpoint outran its last
        save): the log restarts after it, as an installed snapshot would make it."""
        self.snapshot = snapshot
        self.entries = []
        self._start = snapshot.meta.index + 1
        self.hard_state = hard_state
        self._restart_with_snapshot()

    def _open_direct(self) -> None:
        """Append to the last file with ``O_DIRECT`` from now on, where the filesystem can."""
        self._close_direct()
        if self.direct_writes:
            f = self._files[-1]
            self._direct = open_direct(f.path, f.size)

    def _close_direct(self) -> None:
        if self._direct is not None:
            self._direct.close()
            self._direct = None

    def _write(self, pieces: list[Any], direct: bool = True) -> None:
        """Append ``pieces`` to the last file. ``direct=False``: a small write nothing syncs
        (a one-member cluster's ELIDED entries) made on the reactor thread, so it must not
        wait for the disk: through the page cache."""
        f = self._files[-1]
        if self._direct is not None and direct:
            try:
                f.size = self._direct.append(pieces)
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                # Refused after all (a block size above ALIGN): the page cache from now on.
                log.info("raft log: direct writes refused ({e}); writing through the page "
                         "cache", e=exc)
                self.direct_writes = False
                self._close_direct()
        written = list(pieces) if self._direct is not None else None
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
        if written is not None and self._direct is not None:
            self._direct.wrote(written)

    def _new_file(self, header: list[bytes] | None = None,
                  recycle: bool = True) -> tuple[_File, int]:
        """The next file, open, holding its FILE record and ``header`` (records built for its
        seed by the caller via ``_header``), fdatasynced; a freed file is reused if any (it
        gets its ``wal.`` name only once its new first records are durable)."""
        seq = self._files[-1].seq + 1
        f = _File(seq, self.directory / f"{WAL}.{seq:08d}", seed=salt(seq))
        record = _file_record(seq) + b"".join(self._header(f.seed) if header is None else header)
        free = self._free.pop(0) if recycle and self._free else None
        if free is not None:
            fd = os.open(free, os.O_RDWR)
        else:
            fd = os.open(f.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.pwrite(fd, record, 0)
            os.fdatasync(fd)
            if free is not None:
                os.replace(free, f.path)
                self.recycled += 1
        except BaseException:
            os.close(fd)
            raise
        fsync_dir(self.directory)
        f.size = len(record)
        return f, fd

    def _header(self, seed: int) -> list[bytes]:
        """Hard state and snapshot (as COMPACT) records every rolled file starts with."""
        out = [_hard_record(self.hard_state, seed)]
        if self.snapshot is not None:
            out.append(_snap_record(self.snapshot, T_COMPACT, seed))
        return out

    def _roll(self) -> None:
        """Start a new file, beginning with the hard state and the snapshot (as COMPACT),
        so deleting every older file loses neither."""
        f, fd = self._new_file()
        os.close(self._fd)
        self._fd = fd
        self._files.append(f)
        self._open_direct()

    def _restart_with_snapshot(self) -> None:
        """A new file holding the installed snapshot, the entries after it and the hard
        state; then the older files go (recovery would drop their entries anyway)."""
        f, fd = self._new_file(header=[], recycle=False)
        pieces: list[Any] = [_snap_record(self.snapshot, T_SNAP, f.seed)] if self.snapshot else []
        for e in self.entries:
            pieces.extend(_entry_pieces(e, f.seed))
        pieces.append(_hard_record(self.hard_state, f.seed))
        f.last_index = self.last_index if self.entries else 0
        os.close(self._fd)
        self._fd = fd
        self._files.append(f)
        self._open_direct()
        self._write(pieces)
        os.fsync(fd)
        fsync_dir(self.directory)
        for old in self._files[:-1]:
            old.path.unlink(missing_ok=True)
        self._files = self._files[-1:]
        fsync_dir(self.directory)
