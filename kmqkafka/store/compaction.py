"""Key-based compaction of a channel's closed segments.

Flow (see ``ChannelLog.compaction_plan`` / ``install_compaction``)::

    plan = log.compaction_plan(now_ms)   # reactor: snapshot segments, open fds
    result = plan.run()                  # any thread: pure file work, fsyncs its output
    log.install_compaction(result)       # reactor: rename in if still unchanged

For every key only the record with the highest Sequence survives (the key map covers
the cleanable segments only: ``ChannelLog.compaction_plan``); records with a null key
are dropped, as Kafka's cleaner does; a tombstone (null value) is kept by the first
clean that sees it, which stamps its batch with a delete horizon of now +
``delete_retention_ms`` (KIP-534), and dropped by a clean after that horizon; control
batches are kept untouched, and the records of aborted transactions (``aborted``: the
partition's aborted ranges, ``txn_state.py``) neither count in the key map nor survive, as
Kafka's cleaner discards them, so an aborted record never supersedes its key's committed value.
Surviving records keep their Sequence: a rewritten batch keeps its base
offset, span (last offset delta), codec, attributes, producer id/epoch, base sequence and
leader epoch, with offset deltas that leave gaps. A batch left without records disappears;
a segment may become an empty file (it is kept so log_start never moves), dated by the
newest record it held: the file's mtime is set to that timestamp, as Kafka's cleaner gives
its output the original segment's last-modified time, so ``retention.ms`` expires it when it
would have expired the records (recovery reads the date back). A batch of an
idempotent producer at or above the plan's ``producer_floor`` left without records stays as
an empty batch (Kafka's cleaner does this for a producer's last batch): restart rebuilds the
producer state from those headers (producer_state.py), which must not change under it.
Output files are
``{base:020d}.log.cleaned`` plus ``.index.cleaned`` / ``.timeindex.cleaned``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kmqkafka import records
from kmqkafka.store.index import IndexBuilder
from kmqkafka.store.segment import (
    CLEANED_SUFFIX,
    LOG_SUFFIX,
    iter_file_batches,
    segment_name,
    write_all,
    write_index_parts,
)
from kmqkafka.store.txn_state import AbortedIndex, is_aborted

_WRITE_BUFFER = 1024 * 1024


@dataclass(slots=True)
class SegmentSource:
    """One segment as the plan saw it; ``fd`` is owned by the plan."""

    base: int
    generation: int
    size: int
    fd: int
    max_timestamp: int = records.NO_TIMESTAMP  # the segment's newest record, before cleaning


@dataclass(slots=True)
class CleanedSegment:
    """A rewritten segment waiting to be renamed over the original."""

    base: int
    generation: int
    size: int
    max_timestamp: int
    max_timestamp_rel: int
    log_path: Path
    index_path: Path
    time_index_path: Path

    def discard(self) -> None:
        for path in (self.log_path, self.index_path, self.time_index_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


@dataclass(slots=True)
class CompactionResult:
    segments: list[CleanedSegment]
    records_removed: int = 0
    bound: int = 0  # the plan's key-map bound: everything below it is clean now
    tombstones_due: int | None = None  # earliest delete horizon of a tombstone kept


@dataclass
class CompactionPlan:
    """A snapshot to compact; ``run`` is thread-safe and closes the plan's fds."""

    directory: Path
    sources: list[SegmentSource]
    bound: int  # exclusive Sequence bound for the key map (durable_sequence at plan time)
    now_ms: int
    delete_retention_ms: int
    interval: int
    # Batches with a producer id whose last Sequence is at or above this stay as they are
    # (None: no channel producer state to protect).
    producer_floor: int | None = None
    # The ChannelLog that made the plan: a result is installed only into that very log, not
    # into a channel of the same name created after a delete (same directory and bases).
    owner: object = None
    # producer id -> (first, last) Sequences of its aborted transactions in this partition
    aborted: AbortedIndex | None = None

    def _aborted(self, header: records.BatchHeader) -> bool:
        """The data batch belongs to an aborted transaction."""
        return (header.producer_id >= 0 and header.is_transactional
                and is_aborted(self.aborted, header.producer_id, header.base_offset + 1))

    def run(self) -> CompactionResult:
        """Build the key map, rewrite the segments that change, fsync the output."""
        try:
            latest = self._key_map()
            out: list[CleanedSegment] = []
            removed = 0
            due: int | None = None
            for src in self.sources:
                cleaned, n, horizon = self._clean(src, latest)
                removed += n
                if horizon is not None:
                    due = horizon if due is None else min(due, horizon)
                if cleaned is not None:
                    out.append(cleaned)
            return CompactionResult(out, removed, self.bound, due)
        finally:
            self.close()

    def close(self) -> None:
        """Release the fds (``run`` does this itself)."""
        for src in self.sources:
            if src.fd >= 0:
                os.close(src.fd)
                src.fd = -1

    def _key_map(self) -> dict[bytes, int]:
        latest: dict[bytes, int] = {}
        for src in self.sources:
            for _pos, batch in iter_file_batches(src.fd, src.size):
                header = records.read_header(batch)
                if header.base_offset + 1 + header.last_offset_delta >= self.bound:
                    return latest
                if header.is_control or self._aborted(header):
                    continue
                for rec in records.iter_records(batch):
                    if rec.key is not None:
                        latest[rec.key] = rec.offset + 1
        return latest

    def _clean(
        self, src: SegmentSource, latest: dict[bytes, int]
    ) -> tuple[CleanedSegment | None, int, int | None]:
        """Rewrite one segment; returns it (None if unchanged), the records removed, and the
        earliest delete horizon of the tombstones it keeps."""
        builder = IndexBuilder(self.interval)
        floor = self.producer_floor
        log_path = self.directory / (segment_name(src.base, LOG_SUFFIX) + CLEANED_SUFFIX)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        changed = False
        removed = 0
        written = 0
        due: int | None = None
        pending = bytearray()
        try:
            for _pos, batch in iter_file_batches(src.fd, src.size):
                header = records.read_header(batch)
                keep: bytes | memoryview
                if header.is_control:
                    keep = batch
                else:
                    recs = list(records.iter_records(batch))
                    horizon = header.delete_horizon_ms
                    expired = horizon is not None and self.now_ms >= horizon
                    kept = [] if self._aborted(header) else [
                        r for r in recs
                        if r.key is not None  # Kafka's cleaner drops keyless records
                        and latest.get(r.key, r.offset + 1) == r.offset + 1
                        and not (r.value is None and expired)
                    ]
                    removed += len(recs) - len(kept)
                    tombstones = any(r.value is None for r in kept)
                    if tombstones and horizon is None:
                        # First clean to keep a tombstone: it stays delete.retention.ms from
                        # now, whatever its own timestamp says (Kafka's delete horizon).
                        horizon = self.now_ms + self.delete_retention_ms
                    if tombstones:
                        due = horizon if due is None else min(due, horizon)
                    if len(kept) == len(recs) and horizon == header.delete_horizon_ms:
                        keep = batch
                    elif kept:
                        changed = True
                        keep = _rebuild(header, kept, self.now_ms,
                                        horizon if tombstones else None)
                    elif (floor is not None and header.producer_id >= 0
                          and header.base_offset + 1 + header.last_offset_delta >= floor):
                        changed = True  # the producer's state is read from this header
                        keep = records.empty_batch(header)
                    else:
                        changed = True
                        continue
                max_ts = records.read_header(keep).max_timestamp
                builder.add(records.read_header(keep).base_offset + 1 - src.base, written + len(pending), max_ts)
                pending += keep
                if len(pending) >= _WRITE_BUFFER:
                    write_all(fd, pending)
                    written += len(pending)
                    pending = bytearray()
            if not changed:
                os.close(fd)
                fd = -1
                os.unlink(log_path)
                return None, removed, due
            write_all(fd, pending)
            written += len(pending)
            if not written and src.max_timestamp >= 0:
                date = src.max_timestamp * 1_000_000
                os.utime(fd, ns=(date, date))  # set before the fsync that makes it durable
            os.fsync(fd)
        finally:
            if fd >= 0:
                os.close(fd)
        builder.seal()
        files = write_index_parts(self.directory, src.base, builder, CLEANED_SUFFIX)
        for ifd, _part, _final in files:
            os.fsync(ifd)
            os.close(ifd)
        return CleanedSegment(
            base=src.base,
            generation=src.generation,
            size=written,
            max_timestamp=builder.max_timestamp if written else src.max_timestamp,
            max_timestamp_rel=builder.max_timestamp_rel,
            log_path=log_path,
            index_path=files[0][1],
            time_index_path=files[1][1],
        ), removed, due


def _rebuild(header: records.BatchHeader, kept: list[records.Record], now_ms: int,
             delete_horizon_ms: int | None) -> bytearray:
    """Re-encode the surviving records of one batch, keeping their offsets and metadata."""
    batch = bytearray(records.build_batch(
        [records.NewRecord(value=r.value, key=r.key, headers=r.headers, timestamp=r.timestamp)
         for r in kept],
        now_ms=now_ms,
        base_offset=header.base_offset,
        compression=header.compression,
        attributes=header.attributes,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        offset_deltas=[r.offset - header.base_offset for r in kept],
        last_offset_delta=header.last_offset_delta,
        delete_horizon_ms=delete_horizon_ms,
    ))
    records.set_partition_leader_epoch(batch, header.partition_leader_epoch)
    return batch
