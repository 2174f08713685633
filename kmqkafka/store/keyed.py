"""Compact keyed logs: the internal coordinator channel families, and the
generational snapshot-and-roll log they (and queue state journals) are built on.

A ``SnapshotLog`` is a ChannelLog of small state records that is replaced, from
time to time, by a new *generation* whose first records are a snapshot of the
live state, so that replay at start-up is bounded by live state rather than by
history. On-disk layout under ``root``::

    {stem}{gen}/          the ChannelLog of generation ``gen`` (decimal)
    {pointer}             ASCII decimal ``gen`` of the current generation,
                          replaced with ``fsutil.write_atomic``

Roll protocol (no step blocks the reactor on fsync):

1. ``roll()`` (reactor) opens generation ``gen + 1``, appends the snapshot to it
   and sends every later append there; the old generation gets no more writes.
2. The next ``prepare_flush()`` token fsyncs the new generation and then writes
   the pointer atomically (both in ``token.run()``, on the I/O thread).
3. ``complete_flush()`` (reactor) deletes the old generation's directory.

A crash before step 2's rename leaves the old generation current (the new one
is a leftover); after it, the new one is current and complete (it was fsynced
before the pointer). ``open`` deletes every generation directory other than
the current one.

``KeyedLog`` is one coordinator family (``RESERVED_FAMILIES``) stored as
``root / names.dir_name(f"_kafka.{family}.{gen}")`` with the pointer file
``root / f"_kafka.{family}.CURRENT"``. Each record is ``key -> value``; a null
value deletes the key.

Everything here is reactor-thread only except ``token.run()``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterable, Iterator

from twisted.logger import Logger

from kmqkafka import records as rec
from kmqkafka.records import NewRecord, Record
from kmqkafka.store import fsutil, names
from kmqkafka.store.checkpoint import truncate_tail
from kmqkafka.store.config import LogConfig
from kmqkafka.store.errors import CorruptStore
from kmqkafka.store.log import ChannelLog, FlushToken

log = Logger()

RESERVED_FAMILIES = ("offsets", "groups", "config", "txn")

#: Log settings of every internal state log: never age anything out (the roll
#: is the only thing that drops history) and allow big snapshot batches.
INTERNAL_LOG_CONFIG = LogConfig(
    retention_ms=None,
    retention_bytes=None,
    retention_messages=None,
    max_message_bytes=8 * 1024 * 1024,
)

#: Snapshots are written in batches of at most this many records / bytes.
SNAPSHOT_BATCH_RECORDS = 1000
SNAPSHOT_BATCH_BYTES = 512 * 1024

_READ_BYTES = 1024 * 1024


def replay_log(log: ChannelLog) -> Iterator[Record]:
    """Yield every record of ``log`` from its start, durable or not, in order."""
    seq = log.log_start
    end = log.next_sequence
    while seq < end:
        result = log.read(seq, _READ_BYTES, upto=end)
        if not result.batches:
            raise CorruptStore(f"log read at sequence {seq} returned nothing before {end}")
        for batch in result.batches:
            header = rec.read_header(batch)
            if header.last_offset + 1 < seq:
                continue
            if not header.is_control:
                for record in rec.iter_records(batch):
                    if record.offset + 1 >= seq:
                        yield record
            seq = header.last_offset + 2


def family_paths(root: Path, family: str) -> tuple[str, Path]:
    """(generation directory stem, pointer file) of coordinator ``family`` under ``root``."""
    return (names.dir_name(f"{names.RESERVED_PREFIX}{family}."),
            root / f"{names.RESERVED_PREFIX}{family}.CURRENT")


def cut_back(root: Path, family: str, generation: int, next_sequence: int) -> int:
    """Make ``family`` what it was at a checkpoint: generation ``generation`` (the pointer is
    switched back when a later roll's pointer got written but no checkpoint named it yet; the
    old generation is only removed after one has) ending at ``next_sequence``. Blocking,
    start-up only, before ``KeyedLog.open``; returns the bytes removed."""
    stem, pointer = family_paths(root, family)
    path = root / f"{stem}{generation}"
    if not path.is_dir():
        log.warn("coordinator family {family}: generation {gen} of the checkpoint is gone; "
                 "left as it is", family=family, gen=generation)
        return 0
    try:
        current = int(pointer.read_bytes().decode("ascii").strip())
    except (FileNotFoundError, ValueError):
        current = None
    if current != generation:
        fsutil.write_atomic(pointer, str(generation).encode("ascii"))
    return truncate_tail(path, next_sequence)


def chunk_records(records: Iterable[NewRecord]) -> Iterator[list[NewRecord]]:
    """Group records into lists small enough for one snapshot batch each."""
    chunk: list[NewRecord] = []
    size = 0
    for r in records:
        chunk.append(r)
        size += len(r.key or b"") + len(r.value or b"") + 16
        if len(chunk) >= SNAPSHOT_BATCH_RECORDS or size >= SNAPSHOT_BATCH_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _discard(log: ChannelLog) -> None:
    """Delete a superseded generation without fsyncing its unflushed tail.

    ``ChannelLog.close`` flushes synchronously; taking (and never running) a
    token first leaves it nothing to sync, so the reactor never waits on disk.
    """
    log.prepare_flush()
    log.delete()


class SnapshotFlushToken:
    """Work of one flush of a ``SnapshotLog``: fsync logs, then maybe switch the pointer.

    ``run()`` may be called on any thread; hand the token back to
    ``SnapshotLog.complete_flush`` on the reactor.
    """

    def __init__(
        self,
        parts: list[tuple[ChannelLog, FlushToken]],
        pointer: tuple[Path, bytes] | None,
    ) -> None:
        self.parts = parts
        self.pointer = pointer

    def run(self) -> None:
        for _log, token in self.parts:
            token.run()
        if self.pointer is not None:
            fsutil.write_atomic(*self.pointer)


class SnapshotLog:
    """A state journal (ChannelLog) rolled into generations by snapshots.

    The owner replays ``records()`` once after ``open``, appends state changes
    with ``append``, and calls ``roll(snapshot)`` when the journal has grown
    well beyond live state. ``records_in_generation`` counts records of the
    current generation (snapshot included) to drive that decision.
    """

    def __init__(self, root: Path, stem: str, pointer: Path, config: LogConfig,
                 generation: int, log: ChannelLog) -> None:
        self._root = root
        self._stem = stem
        self._pointer = pointer
        self._config = config
        self._generation = generation
        self._log = log
        self._retired: ChannelLog | None = None  # old generation while a roll is pending
        self._pointer_due = False  # a roll whose pointer no flush token has taken yet
        self._closed = False
        self.records_in_generation = 0

    @classmethod
    def open(cls, root: Path, stem: str, pointer: Path, config: LogConfig,
             now_ms: int) -> "SnapshotLog":
        """Open (or create) the current generation and remove leftover ones.

        A missing pointer with generation directories present means the files
        were tampered with (the pointer is written before the first generation
        exists) and raises ``CorruptStore``.
        """
        root.mkdir(parents=True, exist_ok=True)
        part = pointer.with_name(pointer.name + ".part")
        if part.exists():
            part.unlink()
        gens = cls._generations(root, stem)
        if pointer.exists():
            try:
                generation = int(pointer.read_bytes().decode("ascii").strip())
            except ValueError as e:
                raise CorruptStore(f"unreadable generation pointer {pointer}") from e
        else:
            if gens:
                raise CorruptStore(
                    f"{root}: generations {sorted(gens)} of {stem!r} but no pointer {pointer.name}"
                )
            generation = 0
            fsutil.write_atomic(pointer, b"0")
        for gen, path in gens.items():
            if gen != generation:
                shutil.rmtree(path)
        log = ChannelLog.open(root / f"{stem}{generation}", config, now_ms)
        return cls(root, stem, pointer, config, generation, log)

    @staticmethod
    def _generations(root: Path, stem: str) -> dict[int, Path]:
        found: dict[int, Path] = {}
        for entry in os.listdir(root):
            if entry.startswith(stem):
                rest = entry[len(stem):]
                if rest.isdigit() and (root / entry).is_dir():
                    found[int(rest)] = root / entry
        return found

    @property
    def generation(self) -> int:
        """The generation appends go to (the pointer may still name the previous one)."""
        return self._generation

    @property
    def rolling(self) -> bool:
        """True from ``roll()`` until the flush that switched the pointer completed."""
        return self._retired is not None

    @property
    def log(self) -> ChannelLog:
        return self._log

    def records(self) -> Iterator[Record]:
        """Replay the current generation; counts ``records_in_generation``."""
        self.records_in_generation = 0
        for record in replay_log(self._log):
            self.records_in_generation += 1
            yield record

    def append(self, records: list[NewRecord], now_ms: int) -> None:
        """Append one batch of state records to the current generation."""
        if not records:
            return
        self._log.append(rec.build_batch(records, now_ms=now_ms), now_ms)
        self.records_in_generation += len(records)

    def roll(self, snapshot: Iterable[list[NewRecord]], now_ms: int) -> None:
        """Start generation ``gen + 1`` holding ``snapshot`` (a sequence of batches).

        Later appends go to the new generation. Ignored while a previous roll
        is still pending (its pointer not yet durable).
        """
        if self._retired is not None:
            return
        new_gen = self._generation + 1
        path = self._root / f"{self._stem}{new_gen}"
        if path.exists():  # a leftover of an earlier failed roll in this process
            shutil.rmtree(path)
        new_log = ChannelLog.open(path, self._config, now_ms)
        count = 0
        for chunk in snapshot:
            if chunk:
                new_log.append(rec.build_batch(chunk, now_ms=now_ms), now_ms)
                count += len(chunk)
        self._retired = self._log
        self._log = new_log
        self._generation = new_gen
        self._pointer_due = True
        self.records_in_generation = count

    def prepare_flush(self) -> SnapshotFlushToken | None:
        """Token that makes appends so far durable (and switches a pending roll)."""
        parts: list[tuple[ChannelLog, FlushToken]] = []
        token = self._log.prepare_flush()
        if token is not None:
            parts.append((self._log, token))
        pointer = None
        if self._pointer_due:
            pointer = (self._pointer, str(self._generation).encode("ascii"))
            self._pointer_due = False
        if not parts and pointer is None:
            return None
        return SnapshotFlushToken(parts, pointer)

    def complete_flush(self, token: SnapshotFlushToken) -> None:
        """After ``token.run()``: advance durable ends; drop the old generation."""
        for log, t in token.parts:
            if log is self._log or log is self._retired:
                log.complete_flush(t)
        if token.pointer is not None and self._retired is not None:
            retired, self._retired = self._retired, None
            _discard(retired)

    def flush_now(self) -> None:
        """Synchronous flush (blocks on fsync): for shutdown and tests only."""
        token = self.prepare_flush()
        if token is not None:
            token.run()
            self.complete_flush(token)

    def close(self) -> None:
        """Flush synchronously (finishing a pending roll) and close."""
        if self._closed:
            return
        self.flush_now()
        self._log.close()
        if self._retired is not None:  # a token with the pointer was never completed
            self._retired.close()
            self._retired = None
        self._closed = True

    def delete(self) -> None:
        """Remove every generation and the pointer."""
        if not self._closed:
            self._log.close()
            if self._retired is not None:
                self._retired.close()
            self._closed = True
        for path in self._generations(self._root, self._stem).values():
            shutil.rmtree(path, ignore_errors=True)
        for p in (self._pointer, self._pointer.with_name(self._pointer.name + ".part")):
            if p.exists():
                p.unlink()


class KeyedLog:
    """One internal coordinator family: a dict of bytes kept as a compact keyed log.

    Reactor-thread only. ``put``/``put_many`` write to the page cache; the
    caller's group commit makes them durable through ``prepare_flush``,
    ``token.run()`` (any thread) and ``complete_flush``.
    """

    def __init__(self, family: str, log: SnapshotLog, roll_min_records: int) -> None:
        self.family = family
        self._log = log
        self._roll_min_records = roll_min_records
        self._data: dict[bytes, bytes] = {}
        self.version = 0  # moves on every change: readers cache what they derive from it

    @classmethod
    def open(cls, root: Path, family: str, now_ms: int, *,
             roll_min_records: int = 10000) -> "KeyedLog":
        """Open or create ``family`` under ``root`` and replay its current generation."""
        if family not in RESERVED_FAMILIES:
            raise ValueError(f"unknown coordinator family {family!r}")
        stem, pointer = family_paths(root, family)
        snapshots = SnapshotLog.open(root, stem, pointer, INTERNAL_LOG_CONFIG, now_ms)
        keyed = cls(family, snapshots, roll_min_records)
        data = keyed._data
        for record in snapshots.records():
            if record.key is None:
                raise CorruptStore(f"{family}: record without a key at offset {record.offset}")
            if record.value is None:
                data.pop(record.key, None)
            else:
                data[record.key] = record.value
        return keyed

    @property
    def generation(self) -> int:
        return self._log.generation

    @property
    def position(self) -> tuple[int, int]:
        """(generation, next_sequence) of everything put so far: what a checkpoint records."""
        return self._log.generation, self._log.log.next_sequence

    @property
    def rolling(self) -> bool:
        """A roll was started and the flush that switches the pointer has not completed."""
        return self._log.rolling

    @property
    def records_in_generation(self) -> int:
        """Records replay of the current generation would read (snapshot included)."""
        return self._log.records_in_generation

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def items(self, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """Live pairs whose key starts with ``prefix`` (a snapshot: safe to put while iterating)."""
        return iter([(k, v) for k, v in self._data.items() if k.startswith(prefix)])

    def __len__(self) -> int:
        return len(self._data)

    def put(self, key: bytes, value: bytes | None, now_ms: int) -> None:
        """Set ``key`` (``None`` deletes it)."""
        self.put_many([(key, value)], now_ms)

    def put_many(self, pairs: Iterable[tuple[bytes, bytes | None]], now_ms: int) -> None:
        """Apply ``pairs`` in order as one batch (all or nothing on disk)."""
        batch = [NewRecord(value=v, key=k) for k, v in pairs]
        if not batch:
            return
        self._log.append(batch, now_ms)
        self.version += 1
        for r in batch:
            assert r.key is not None
            if r.value is None:
                self._data.pop(r.key, None)
            else:
                self._data[r.key] = r.value
        self._maybe_roll(now_ms)

    def _maybe_roll(self, now_ms: int) -> None:
        limit = max(self._roll_min_records, 2 * len(self._data))
        if self._log.records_in_generation > limit and not self._log.rolling:
            snapshot = [NewRecord(value=v, key=k) for k, v in self._data.items()]
            self._log.roll(chunk_records(snapshot), now_ms)

    def prepare_flush(self) -> SnapshotFlushToken | None:
        return self._log.prepare_flush()

    def complete_flush(self, token: SnapshotFlushToken) -> None:
        self._log.complete_flush(token)

    def close(self) -> None:
        """Flush synchronously and close (shutdown only: blocks on fsync)."""
        self._log.close()
