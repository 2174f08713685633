"""The segment log of one channel: append, read, recovery, group commit, retention.

A channel directory holds segments (see segment.py and index.py for their files)
and a ``log-start`` checkpoint: the decimal first available Sequence, written with
``fsutil.write_atomic`` by the flush after truncate_prefix or retention moves it. The
caller reads ``config.json`` (the channel's LogConfig) and writes it at creation; a change
made with ``set_config(..., save=True)`` is written by the next flush the same way.

Every method of ``ChannelLog`` is reactor-thread only and never calls fsync,
except ``open``/``close`` (start-up and shut-down). Durability comes from group commit::

    token = log.prepare_flush()       # reactor: capture fds and the Sequence covered
    token.run()                       # I/O thread: fdatasync/fsync, index renames
    log.complete_flush(token)         # reactor: advance durable_sequence, close fds

Readers see ``durable_sequence`` as the high watermark. Time is always passed
in (``now_ms``); nothing here reads a clock.

Opened with a ``producer_window`` (Events Store channels), a log also keeps its partition's
idempotent-producer state (``producer_state.py``): ``append`` checks batches that carry a
producer id, and ``open`` rebuilds the state from the headers of the log's tail.
"""

from __future__ import annotations

import bisect
import os
import shutil
import struct
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from twisted.logger import Logger

from kmqkafka import records
from kmqkafka.store import fsutil, prealloc
from kmqkafka.store.compaction import CompactionPlan, CompactionResult, SegmentSource
from kmqkafka.store.config import LogConfig
from kmqkafka.store.errors import CorruptStore, OffsetOutOfRange
from kmqkafka.store.pagecache import PageCacheBudget
from kmqkafka.store.producer_state import BatchMetadata, ProducerState, last_seq_of
from kmqkafka.store.txn_state import ABORT, COMMIT, AbortedIndex, PartitionTxns, index_aborted
from kmqkafka.store.segment import (
    BATCH_SPAN,
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    PART_SUFFIX,
    SCAN_SUFFIX,
    TIME_INDEX_SUFFIX,
    ScanResult,
    Segment,
    iter_file_batches,
    iter_producer_headers,
    load_saved_scan,
    parse_base,
    save_scan,
    scan_log,
    write_batch_at_offset,
    write_index_parts,
)

_log = Logger()

# baseOffset, batchLength, partitionLeaderEpoch: the header fields the CRC does not cover,
# which the broker owns (Kafka's log validator stamps the leader epoch the same way).
_BROKER_HEAD = struct.Struct(">qii")
LEADER_EPOCH = 0  # one leader epoch for every partition: Raft commits are never truncated

LOG_START_FILE = "log-start"
CONFIG_FILE = "config.json"
_READ_FLOOR = 64 * 1024  # smallest pread, so tiny budgets still cover a few headers


@dataclass(slots=True)
class ReadResult:
    """Whole stored batches (memoryviews over pread buffers) and the log's bounds."""

    batches: list[memoryview]
    nbytes: int
    log_start: int
    high_watermark: int


class FlushToken:
    """One group commit: fds to sync and the next_sequence it makes durable.

    Created by ``ChannelLog.prepare_flush`` on the reactor; ``run`` may be called
    from any thread (it only fsyncs fds the log keeps open until
    ``complete_flush`` and renames index files nobody reads yet).
    """

    __slots__ = ("serial", "covers", "fds", "index_jobs", "sync_dir", "directory", "done",
                 "abandoned", "ranges", "files", "_lock", "_finished", "_close_after")

    def __init__(self, serial: int, covers: int, fds: list[int], index_jobs: list, sync_dir: bool,
                 directory: Path) -> None:
        self.serial = serial
        self.covers = covers
        self.fds = fds
        self.index_jobs = index_jobs  # [(segment, [(fd, part, final), ...])]
        self.sync_dir = sync_dir
        self.directory = directory
        self.done = False
        # The log was closed (its channel deleted) while this may run: its fds and files may
        # be gone under it, and nothing it covers needs to be durable any more.
        self.abandoned = False
        self.ranges: list[tuple[Segment, int, int]] = []  # what it makes durable (page cache)
        # Small files to rewrite (``log-start``, ``config.json``): name -> contents.
        self.files: dict[str, bytes] = {}
        # A log closed under this token hands it the fds it may still use, to close once it
        # has finished (``close_when_finished``).
        self._lock = threading.Lock()
        self._finished = False
        self._close_after: list[int] = []

    def uses(self, fd: int) -> bool:
        """``run`` syncs ``fd`` (a segment's data, or a rolled segment's index part)."""
        return fd in self.fds or any(fd == f for _seg, parts in self.index_jobs
                                     for f, _part, _final in parts)

    def close_when_finished(self, fd: int) -> bool:
        """Close ``fd`` once ``run`` has returned; False (nothing taken) if it has already."""
        with self._lock:
            if self._finished:
                return False
            self._close_after.append(fd)
            return True

    def run(self) -> None:
        """fdatasync the data, make rolled segments' indexes durable, fsync the directory.

        The channel may be deleted meanwhile (``abandoned``): its directory renamed away, its
        fds handed to this token to close when it is done. That is nothing to sync, not a
        failed flush."""
        try:
            self._sync()
        finally:
            with self._lock:
                self._finished = True
                close, self._close_after = self._close_after, []
            for fd in close:
                _close_quietly(fd)

    def _sync(self) -> None:
        try:
            for fd in self.fds:
                os.fdatasync(fd)
            for _segment, parts in self.index_jobs:
                for fd, part, final in parts:
                    os.fsync(fd)
                    os.replace(part, final)
            for name, data in self.files.items():
                fsutil.write_atomic(self.directory / name, data)  # syncs the directory
            if not self.files and (self.sync_dir or self.index_jobs):
                fsutil.fsync_dir(self.directory)
        except OSError:
            if not self.abandoned:
                raise


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _expired(seg: Segment, cfg: LogConfig, now_ms: int) -> bool:
    """Whether ``seg``'s newest record is older than ``retention.ms``. A segment with data but
    no timestamp (batches stored with a max timestamp of -1 before produce recomputed it) is
    never expired by time: it cannot be dated alike on every node, and guessing 1970 deleted
    acknowledged records at the next retention run. A closed segment the cleaner emptied keeps
    the date of the newest record it held (Kafka dates it by the mtime its cleaner carries
    over), so the log start of a ``compact,delete`` topic does not jump past it, and consumers
    behind it are not reset, before ``retention.ms``; one with no date left expires at once:
    kept, it stopped time retention of every segment behind it."""
    if cfg.retention_ms is None:
        return False
    if seg.size == 0 and seg.write_fd is None and seg.max_timestamp < 0:
        return True
    return seg.max_timestamp >= 0 and now_ms - seg.max_timestamp > cfg.retention_ms


def _date_emptied(seg: Segment) -> None:
    """Recovery: a closed segment the cleaner emptied is dated by its file's mtime, which
    compaction set to the newest record it held (``_expired``). Rounded to the nearest ms: a
    snapshot's tar carries the mtime as float seconds, a few hundred ns off, and every node
    must date the segment alike."""
    if seg.size == 0 and seg.max_timestamp < 0:
        try:
            seg.max_timestamp = (os.stat(seg.path()).st_mtime_ns + 500_000) // 1_000_000
        except FileNotFoundError:
            pass  # no file, no date: it expires at once


def _reserve_ahead(active: Segment, need: int, segment_bytes: int) -> None:
    """Reserve the active segment's blocks up to ``need`` and a step further (not past
    ``segment_bytes``, where it rolls); once refused, never asked again for this segment.

    The step grows with the segment (as large as its data, from ``MIN_STEP`` to ``STEP``),
    so a partition written at a trickle never holds more than a little unused disk."""
    start = max(active.reserved, active.size)
    step = min(prealloc.STEP, max(prealloc.MIN_STEP, start))
    end = max(need, min(start + step, segment_bytes))
    active.reserved = end if prealloc.reserve(active.write_fd, start, end - start) else 1 << 62


def _waited_for_roll(active: Segment, batch_max_ts: int, now_ms: int) -> int:
    """How long the active segment has been filling, as Kafka's ``timeWaitedForRoll``: by
    record time (the incoming batch's max timestamp less the segment's first batch's) when
    both are known, else by this broker's clock since the segment's first append."""
    if active.first_batch_ts is not None and batch_max_ts >= 0:
        return batch_max_ts - active.first_batch_ts
    if active.first_append_ms is None:
        return 0
    return now_ms - active.first_append_ms


TRANSACTIONAL_MARK = "transactional"


def _control_kind(batch: bytes | memoryview) -> int | None:
    """COMMIT or ABORT for an end-transaction marker batch; None for any other control batch."""
    try:
        kind = records.control_type(batch)
    except (records.InvalidBatch, ValueError):
        return None
    return kind if kind in (ABORT, COMMIT) else None


class ChannelLog:
    """Append-only log of RecordBatch v2 batches; batch baseOffset = first Sequence - 1."""

    def __init__(self, directory: Path, config: LogConfig, producer_window: int = 0) -> None:
        """Use ``ChannelLog.open``."""
        self._dir = directory
        self._config = config
        self._producer_window = producer_window
        # Idempotent-producer state (producer_state.py); None: batches are stored unchecked.
        self.producers: ProducerState | None = ProducerState() if producer_window > 0 else None
        # Open and aborted transactions (txn_state.py), with the producer state.
        self.txns: PartitionTxns | None = PartitionTxns() if producer_window > 0 else None
        self._transactional = False  # TRANSACTIONAL_MARK exists: the log holds such batches
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._log_start = 1
        self._next = 1
        self._durable = 1
        self._dirty_fds: dict[int, None] = {}
        # Compaction progress (this process only; a restart counts everything as dirty once):
        # the Sequence the last clean covered up to, and when the earliest tombstone it kept
        # reaches its delete horizon (a pass is due then even without new dirt).
        self._cleaned_to = 0
        self._tombstones_due: int | None = None
        self._cleaning = False  # a compaction plan is out (compaction_plan)
        self._fd_refs: dict[int, int] = {}
        self._retired_fds: set[int] = set()
        self._index_jobs: list = []
        self._sync_dir = False
        self._files_due: dict[str, bytes] = {}  # log-start / config.json: the next flush
        self._tokens: deque[FlushToken] = deque()
        self._serial = 0
        self.truncated_bytes = 0  # bytes cut off by the last recovery (torn tails)
        # The node's page-cache budget (pagecache.py); None leaves the page cache to the kernel.
        self.page_cache: PageCacheBudget | None = None
        self._closed = False

    # --- properties ------------------------------------------------------------------

    @property
    def log_start(self) -> int:
        return self._log_start

    @property
    def next_sequence(self) -> int:
        return self._next

    @property
    def durable_sequence(self) -> int:
        return self._durable

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def config(self) -> LogConfig:
        return self._config

    @property
    def producer_floor(self) -> int:
        """Lowest last-Sequence of a batch through which a producer is still known (see
        producer_state.py): ``max(log_start, next_sequence - producer_window)``."""
        return max(self._log_start, self._next - self._producer_window)

    def set_config(self, config: LogConfig, *, save: bool = False) -> None:
        """New settings apply from the next append/roll/retention pass. With ``save`` the next
        flush writes them to ``config.json`` on the I/O thread: written here with its fsyncs,
        an IncrementalAlterConfigs of 1,856 topics held the reactor 1.3 s. Until that flush a
        crash finds the older file, and the change was not acknowledged yet (or, on a
        cluster, its Raft entry is replayed from before the checkpoint that flush precedes)."""
        self._config = config
        if save:
            self._files_due[CONFIG_FILE] = config.to_json()

    @property
    def directory(self) -> Path:
        return self._dir

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def _active(self) -> Segment:
        return self._segments[-1]

    @property
    def active_bytes(self) -> int:
        """Size of the segment still being appended to (a snapshot must copy it)."""
        return self._active.size

    # --- open and recovery --------------------------------------------------------

    @classmethod
    def open(cls, directory: Path, config: LogConfig, now_ms: int, *,
             producer_window: int = 0, sync: bool = True,
             page_cache: PageCacheBudget | None = None) -> "ChannelLog":
        """Open (creating if needed) and recover a channel directory; blocking, start-up only.

        Recovery scans every segment that has no trustworthy index (always the last)
        batch by batch with CRC checks and truncates at the first torn or corrupt batch;
        segments after a truncated one are deleted so Sequences stay dense.

        ``producer_window`` > 0 (Events Store channels: ``producer_state.WINDOW``) turns on the
        idempotent-producer checks in ``append``; the state is then rebuilt from the log's tail
        (``_rebuild_producers``). Every node of a cluster must use the same window.

        ``sync=False`` (a channel just created, whose files the state machine's next flush
        makes durable): nothing is fsynced here.

        With a ``page_cache`` budget, what the log held before counts as cold: reading it
        drops it from the page cache again.
        """
        directory.mkdir(parents=True, exist_ok=True)
        log = cls(directory, config, producer_window)
        log._recover(now_ms, sync)
        log.page_cache = page_cache
        for seg in log._segments:
            seg.budgeted = seg.cold_below = seg.size
        if log.producers is not None:
            log._rebuild_producers()
        if log.txns is not None and (directory / TRANSACTIONAL_MARK).exists():
            log._transactional = True
            log._rebuild_txns()
        return log

    def _recover(self, now_ms: int, sync: bool = True) -> None:
        checkpoint = 0
        try:
            checkpoint = int((self._dir / LOG_START_FILE).read_text().strip() or 0)
        except FileNotFoundError:
            pass
        names = os.listdir(self._dir)
        bases = []
        for name in names:
            if name.endswith((PART_SUFFIX, CLEANED_SUFFIX, DELETED_SUFFIX)):
                os.unlink(self._dir / name)
                continue
            base = parse_base(name)
            if base is not None:
                bases.append(base)
        bases.sort()
        known = {f"{b:020d}" for b in bases}
        last_scan = f"{bases[-1]:020d}{SCAN_SUFFIX}" if bases else None
        for name in names:
            if name.endswith((INDEX_SUFFIX, TIME_INDEX_SUFFIX)) and name.split(".")[0] not in known:
                os.unlink(self._dir / name)
            elif name.endswith(SCAN_SUFFIX) and name != last_scan:
                os.unlink(self._dir / name)  # saved for a segment that is no longer active
        interval = self._config.index_interval_bytes
        if not bases:
            bases = [max(checkpoint, 1)]
            self._sync_dir = True
        active: Segment | None = None
        for i, base in enumerate(bases):
            seg = Segment(self._dir, base)
            path = seg.path()
            seg.size = os.stat(path).st_size if os.path.exists(path) else 0
            last = i == len(bases) - 1
            upper = None if last else bases[i + 1]
            if not last and self._load_closed(seg, upper):
                seg.end = upper
                _date_emptied(seg)
                self._append_segment(seg)
                continue
            scan = load_saved_scan(seg) if last else None
            if scan is None:
                scan = scan_log(seg.reader(), seg.size, base, interval, upper=upper,
                                dense=last) if seg.size else scan_log(-1, 0, base, interval)
            torn = scan.valid_size < seg.size
            if torn:
                self.truncated_bytes += seg.size - scan.valid_size
                os.truncate(path, scan.valid_size)
            seg.adopt_scan(scan)
            self._append_segment(seg)
            if last or torn:
                for later in bases[i + 1 :]:
                    self._unlink_segment_files(Segment(self._dir, later))
                seg.end = scan.next_sequence
                active = seg
                first_ts = scan.first_timestamp
                if seg.size:
                    seg.first_append_ms = first_ts if 0 <= first_ts <= now_ms else now_ms
                    seg.first_batch_ts = first_ts if first_ts >= 0 else None
                break
            # A closed segment without a usable index: write it now (start-up may block).
            seg.end = upper
            seg.builder.seal()
            for fd, part, final in write_index_parts(self._dir, base, seg.builder, PART_SUFFIX):
                os.fsync(fd)
                os.close(fd)
                os.replace(part, final)
            seg.map_indexes()
            _date_emptied(seg)
        assert active is not None
        active.open_for_append(interval)
        if sync:  # else the state machine's next flush syncs the new directory
            os.fdatasync(active.write_fd)
            fsutil.fsync_dir(self._dir)
        self._sync_dir = False
        self._next = active.end
        self._durable = self._next
        self._log_start = min(max(checkpoint, self._segments[0].base), self._next)

    def _rebuild_producers(self) -> None:
        """Fold the headers of every batch above the producer floor into ``producers``.

        Start-up only (after recovery), blocking. This yields exactly the state the checks
        would hold had the node never stopped (producer_state.py), so a retry after a restart
        is still recognised. Bound: only the batches holding the last ``producer_window``
        records are visited, plus at most one index interval before them (the offset index
        finds the start), header only (``iter_producer_headers``): at most one read (<= 64 KiB)
        per batch, so at most ``producer_window`` reads, and no more bytes than that tail of
        the log holds. With ``producer_state.WINDOW`` that is 262,144 reads in the worst case
        (one-record batches), far fewer with batching producers.
        """
        producers = self.producers
        assert producers is not None
        floor = self.producer_floor
        if floor >= self._next:
            return
        record = producers.record
        first_seg = max(bisect.bisect_right(self._bases, floor) - 1, 0)
        for seg in self._segments[first_seg:]:
            if not seg.size:
                continue
            for (base_offset, _length, attrs, delta, max_ts, pid, epoch,
                 base_seq) in iter_producer_headers(seg.reader(), seg.size, seg.lookup(floor)):
                last = base_offset + 1 + delta
                if pid < 0 or last < floor or attrs & records.CONTROL_FLAG:
                    continue
                record(pid, epoch, BatchMetadata(base_seq, last_seq_of(base_seq, delta),
                                                 base_offset + 1, last, max_ts), floor)

    def _rebuild_txns(self) -> None:
        """Fold every transactional batch header of the log into ``txns`` (txn_state.py).

        Start-up only, blocking, and only for a log that ever stored a transactional batch
        (``TRANSACTIONAL_MARK``): one header read per batch from the log's start, plus a read of
        each control batch (a few dozen bytes) for its COMMIT/ABORT type."""
        txns = self.txns
        assert txns is not None
        for seg in self._segments:
            if not seg.size:
                continue
            fd = seg.reader()
            pos = 0
            for (base_offset, length, attrs, _delta, _max_ts, pid, epoch,
                 _base_seq) in iter_producer_headers(fd, seg.size, 0):
                size = length + records.LOG_OVERHEAD
                if pid >= 0 and attrs & records.TRANSACTIONAL_FLAG:
                    if attrs & records.CONTROL_FLAG:
                        kind = _control_kind(os.pread(fd, size, pos))
                        if kind is not None:
                            txns.on_marker(pid, epoch, kind, base_offset + 1)
                    else:
                        txns.on_data(pid, base_offset + 1)
                pos += size
        txns.forget_below(self._log_start)

    def _mark_transactional(self) -> None:
        """Note, durably and once, that this log holds transactional batches, so a restart
        rebuilds its transactions (the mark must not be lost while the batch survives)."""
        self._transactional = True
        fd = os.open(self._dir / TRANSACTIONAL_MARK, os.O_WRONLY | os.O_CREAT, 0o644)
        os.close(fd)
        fsutil.fsync_dir(self._dir)

    def stable_end(self, high_watermark: int) -> int:
        """The next Sequence a read_committed reader may not pass (Kafka's LSO, + 1)."""
        txns = self.txns
        if txns is None or not txns.open:
            return high_watermark
        return txns.stable_end(high_watermark)

    def _load_closed(self, seg: Segment, upper: int) -> bool:
        """Map a closed segment's index files if they agree with its .log (cheap checks)."""
        try:
            seg.map_indexes()
        except (OSError, ValueError):
            self._drop_index_files(seg)
            return False
        offsets, times = seg.offsets, seg.times
        ok = False
        if seg.size == 0:
            ok = offsets.count == 0 and times.count == 0
        elif offsets.count and times.count:
            first, last = offsets.first(), offsets.last()
            if first[1] == 0 and last[1] < seg.size:
                walk = seg.tail_walk(last[1])
                ok = walk is not None and walk[0] == seg.base + last[0] and walk[1] < upper
                if ok:
                    seg.max_timestamp, seg.max_timestamp_rel = times.last()
        if not ok:
            self._drop_index_files(seg)
        return ok

    def _drop_index_files(self, seg: Segment) -> None:
        seg.unmap_indexes()
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            try:
                os.unlink(seg.path(suffix))
            except FileNotFoundError:
                pass

    def _append_segment(self, seg: Segment) -> None:
        self._segments.append(seg)
        self._bases.append(seg.base)

    # --- append ---------------------------------------------------------------------

    def append(self, batch: bytes | bytearray | memoryview, now_ms: int, *,
               checked: bool = False) -> tuple[int, int]:
        """Store one whole batch; return its (first, last) Sequence. No fsync.

        Raises records.InvalidBatch (nothing stored) unless ``batch`` is exactly one
        valid RecordBatch v2; ``checked``: the caller ran ``records.validate_batch`` on these
        bytes, so only the header is read here (no second CRC pass).

        With producer checks on (``producer_window``), a batch with a producer id (>= 0, not
        a control batch) is checked first (``ProducerState.check``): an out-of-order sequence
        or an old epoch raises ``OutOfOrderSequence`` / ``InvalidProducerEpoch`` (nothing
        stored), and a retry of one of the producer's last five batches is not stored again:
        the original's (first, last) come back, first below the ``next_sequence`` this call
        started from, which is how a caller tells a duplicate apart.
        """
        header = (records.read_header if checked else records.validate_batch)(batch)
        if header.size != len(batch):
            raise records.InvalidBatch("expected exactly one batch")
        producers = self.producers
        txns = self.txns
        if txns is not None and header.attributes & records.TRANSACTIONAL_FLAG \
                and header.producer_id >= 0:
            control = bool(header.attributes & records.CONTROL_FLAG)
            if not control:
                txns.check(header.producer_id, header.producer_epoch)
        else:
            txns = None
        if producers is not None and header.producer_id >= 0 \
                and not header.attributes & records.CONTROL_FLAG:
            floor = self.producer_floor
            duplicate = producers.check(header.producer_id, header.producer_epoch,
                                        header.base_sequence, header.last_offset_delta, floor)
            if duplicate is not None:
                return duplicate.first_sequence, duplicate.last_sequence
        else:
            producers = None
        buf = memoryview(batch)
        first = self._next
        head = _BROKER_HEAD.pack(first - 1, header.batch_length, LEADER_EPOCH)
        active = self._active
        cfg = self._config
        if active.size and (
            active.size + len(buf) > cfg.segment_bytes
            or _waited_for_roll(active, header.max_timestamp, now_ms) > cfg.roll_ms
        ):
            self._roll()
            active = self._active
        pos = active.size
        if pos + len(buf) > active.reserved:
            _reserve_ahead(active, pos + len(buf), cfg.segment_bytes)
        try:
            write_batch_at_offset(active.write_fd, head, buf)
        except BaseException:
            os.ftruncate(active.write_fd, pos)
            active.reserved = pos
            raise
        active.size = pos + len(buf)
        if active.first_append_ms is None:
            active.first_append_ms = now_ms
            ts = header.max_timestamp
            active.first_batch_ts = ts if ts >= 0 else None
        builder = active.builder
        builder.add(first - active.base, pos, header.max_timestamp)
        active.max_timestamp = builder.max_timestamp
        active.max_timestamp_rel = builder.max_timestamp_rel
        last = first + header.last_offset_delta
        self._next = active.end = last + 1
        self._dirty_fds[active.write_fd] = None
        if producers is not None:
            base_seq = header.base_sequence
            producers.record(header.producer_id, header.producer_epoch, BatchMetadata(
                base_seq, last_seq_of(base_seq, header.last_offset_delta), first, last,
                header.max_timestamp), floor)
        if txns is not None:
            if not self._transactional:
                self._mark_transactional()
            if control:
                kind = _control_kind(buf)
                if kind is not None:
                    txns.on_marker(header.producer_id, header.producer_epoch, kind, first)
            else:
                txns.on_data(header.producer_id, first)
        return first, last

    def append_many(self, batches: list, now_ms: int) -> list[tuple[int, int]]:
        """``append`` each batch in order; a bad batch raises after the earlier ones are stored."""
        return [self.append(b, now_ms) for b in batches]

    def roll(self) -> None:
        """Close the active segment now (if it holds data) and start a new one."""
        if self._active.size:
            self._roll()

    def _roll(self) -> None:
        old = self._active
        old.builder.seal()
        files = write_index_parts(self._dir, old.base, old.builder, PART_SUFFIX)
        self._index_jobs.append((old, files))
        retired, old.write_fd = old.write_fd, None
        if old.reserved > old.size:
            prealloc.trim(retired, old.size)
        self._retired_fds.add(retired)
        # Closed by the flush that syncs its last writes, or now if an earlier flush did (a
        # roll right after a flush used to leave the fd open for the channel's lifetime, and
        # with it the disk space of the segment once retention deleted it).
        self._maybe_close(retired)
        old.first_append_ms = None
        new = Segment(self._dir, self._next)
        new.end = self._next
        new.open_for_append(self._config.index_interval_bytes)
        self._append_segment(new)
        self._sync_dir = True

    # --- group commit ----------------------------------------------------------------

    def prepare_flush(self) -> FlushToken | None:
        """Capture what the next fsync must cover; None when nothing is unsynced.

        Tokens must be ``complete_flush``-ed after their ``run`` returned; they may
        overlap, and durable_sequence advances in preparation order.
        """
        if (not self._dirty_fds and not self._index_jobs and not self._sync_dir
                and not self._files_due):
            return None
        self._serial += 1
        fds = list(self._dirty_fds)
        for fd in fds:
            self._fd_refs[fd] = self._fd_refs.get(fd, 0) + 1
        token = FlushToken(self._serial, self._next, fds, self._index_jobs, self._sync_dir, self._dir)
        token.files, self._files_due = self._files_due, {}
        if self.page_cache is not None:
            for seg in [s for s, _files in self._index_jobs] + [self._active]:
                if seg.size > seg.budgeted:
                    token.ranges.append((seg, seg.budgeted, seg.size))
                    seg.budgeted = seg.size
        self._dirty_fds = {}
        self._index_jobs = []
        self._sync_dir = False
        self._tokens.append(token)
        return token

    def complete_flush(self, token: FlushToken) -> None:
        """After ``token.run()`` returned: advance durable_sequence, map rolled indexes, close fds."""
        token.done = True
        for fd in token.fds:
            refs = self._fd_refs[fd] - 1
            if refs:
                self._fd_refs[fd] = refs
            else:
                del self._fd_refs[fd]
                self._maybe_close(fd)
        while self._tokens and self._tokens[0].done:
            done = self._tokens.popleft()
            self._durable = max(self._durable, done.covers)
            if self.page_cache is not None:
                for seg, start, end in done.ranges:
                    self.page_cache.durable(self, seg, start, end)
            for seg, files in done.index_jobs:
                for fd, _part, _final in files:
                    os.close(fd)
                if self._is_live(seg) and seg.builder is not None and seg.write_fd is None:
                    seg.map_indexes()
                elif not self._is_live(seg):
                    self._drop_index_files(seg)

    def _maybe_close(self, fd: int) -> None:
        if fd in self._retired_fds and fd not in self._dirty_fds and fd not in self._fd_refs:
            self._retired_fds.discard(fd)
            os.close(fd)

    def _is_live(self, seg: Segment) -> bool:
        i = bisect.bisect_left(self._bases, seg.base)
        return i < len(self._segments) and self._segments[i] is seg

    def holds(self, seg: Segment) -> bool:
        """Whether ``seg`` is still one of this open log's segments (its file unchanged)."""
        return not self._closed and self._is_live(seg)

    def _pread(self, seg: Segment, n: int, pos: int, index: int) -> bytes:
        """``seg.pread`` for the read path; ``seg`` is ``self._segments[index]``. With a
        page-cache budget, the cold data the reader has passed is dropped first: behind
        ``pos``, and all of the previous segment once a read starts at this one's head."""
        budget = self.page_cache
        if budget is not None:
            budget.after_read(seg, pos)
            if pos == 0 and index > 0:
                budget.passed(self._segments[index - 1])
        return seg.pread(n, pos)

    # --- read --------------------------------------------------------------------------

    def read(self, sequence: int, max_bytes: int, *, upto: int | None = None,
             min_one: bool = True) -> ReadResult:
        """Stored batches from the one holding ``sequence``, within ``max_bytes``.

        Stops before the first batch whose last Sequence >= ``upto`` (default: the
        high watermark). With ``min_one`` the first batch is returned whole even when
        larger than ``max_bytes``. Raises OffsetOutOfRange outside
        [log_start, next_sequence].
        """
        if sequence < self._log_start or sequence > self._next:
            raise OffsetOutOfRange(sequence, self._log_start, self._next)
        hw = self._durable
        if upto is None:
            upto = hw
        out: list[memoryview] = []
        nbytes = 0
        if sequence >= upto:
            return ReadResult(out, 0, self._log_start, hw)
        i = bisect.bisect_right(self._bases, sequence) - 1
        slack = self._config.index_interval_bytes
        unpack = BATCH_SPAN.unpack_from
        segments = self._segments
        while i < len(segments):
            seg = segments[i]
            i += 1
            limit = seg.size
            pos = seg.lookup(sequence)
            if pos >= limit:
                continue
            want = min(limit - pos, max(max_bytes - nbytes + slack, _READ_FLOOR))
            view = memoryview(self._pread(seg, want, pos, i - 1))
            off = 0
            slack = 0
            while True:
                if len(view) - off < records.HEADER_SIZE:
                    if pos + off >= limit:
                        break  # next segment
                    pos += off
                    want = min(limit - pos, max(max_bytes - nbytes, _READ_FLOOR))
                    view = memoryview(self._pread(seg, want, pos, i - 1))
                    off = 0
                    continue
                base_offset, length, delta = unpack(view, off)
                size = length + records.LOG_OVERHEAD
                if size < records.HEADER_SIZE or (off == 0 and size > len(view) and pos + size > limit):
                    raise CorruptStore(f"{seg.path().name}: bad batch header at {pos + off}")
                last = base_offset + 1 + delta
                if last < sequence:
                    off += size
                    continue
                if last >= upto:
                    return ReadResult(out, nbytes, self._log_start, hw)
                if nbytes + size > max_bytes and (out or not min_one):
                    return ReadResult(out, nbytes, self._log_start, hw)
                if off + size > len(view):
                    pos += off
                    want = min(limit - pos, max(max_bytes - nbytes, size))
                    view = memoryview(self._pread(seg, want, pos, i - 1))
                    off = 0
                    continue
                out.append(view[off : off + size])
                nbytes += size
                off += size
                if nbytes >= max_bytes:
                    return ReadResult(out, nbytes, self._log_start, hw)
        return ReadResult(out, nbytes, self._log_start, hw)

    # --- timestamps ------------------------------------------------------------------

    def sequence_for_timestamp(self, ts_ms: int) -> int | None:
        """First Sequence (>= log_start) of a record with timestamp >= ``ts_ms``, else None."""
        start = self._log_start
        for seg in self._segments:
            if not seg.size or seg.max_timestamp < ts_ms or seg.end <= start:
                continue
            fd = seg.reader()
            for _pos, batch in iter_file_batches(fd, seg.size, seg.time_floor_position(ts_ms)):
                header = records.read_header(batch)
                if header.base_offset + 1 + header.last_offset_delta < start:
                    continue
                if header.max_timestamp < ts_ms:
                    continue
                for rec in records.iter_records(batch):
                    if rec.offset + 1 >= start and rec.timestamp >= ts_ms:
                        return rec.offset + 1
        return None

    def max_timestamp(self) -> tuple[int, int] | None:
        """(timestamp, Sequence) of the record with the largest timestamp (first on ties)."""
        best: Segment | None = None
        for seg in self._segments:
            if seg.size and seg.max_timestamp >= 0 and seg.end > self._log_start and (
                best is None or seg.max_timestamp > best.max_timestamp
            ):
                best = seg
        if best is None:
            return None
        target = best.base + best.max_timestamp_rel
        for _pos, batch in iter_file_batches(best.reader(), best.size, best.lookup(target)):
            header = records.read_header(batch)
            if header.base_offset + 1 < target:
                continue
            top: tuple[int, int] | None = None
            for rec in records.iter_records(batch):
                if top is None or rec.timestamp > top[0]:
                    top = (rec.timestamp, rec.offset + 1)
            return top
        return None

    # --- retention and prefix truncation ---------------------------------------

    def enforce_retention(self, now_ms: int) -> int:
        """Drop whole segments by age, total bytes and message count (config.delete).

        Advances log_start to the first remaining segment's base; never renumbers. The
        active segment goes too once its newest record is past retention.ms (or the bytes
        rule asks for it), as in Kafka: it is rolled first, so the log ends empty with
        log_start = next. Only the log decides (timestamps, sizes): every Raft node drops
        the same. Returns how many segments were dropped.
        """
        cfg = self._config
        if not cfg.delete:
            return 0
        dropped = 0
        total = self.size_bytes
        while len(self._segments) > 1:
            seg = self._segments[0]
            expired = _expired(seg, cfg, now_ms)
            # Kafka's rule: a segment goes only if what remains still holds retention.bytes.
            too_big = cfg.retention_bytes is not None and total - seg.size >= cfg.retention_bytes
            too_many = (
                cfg.retention_messages is not None
                and self._next - self._log_start > cfg.retention_messages
            )
            if not (expired or too_big or too_many):
                break
            total -= seg.size
            self._drop_first_segment()
            self._log_start = max(self._log_start, self._segments[0].base)
            dropped += 1
        seg = self._active
        if len(self._segments) == 1 and seg.size and (
                _expired(seg, cfg, now_ms)
                or (cfg.retention_bytes is not None and total - seg.size >= cfg.retention_bytes)):
            self._roll()  # a dropped segment's pending index files go at their flush
            self._drop_first_segment()
            self._log_start = self._next
            dropped += 1
        if dropped:
            self._write_log_start()
        return dropped

    def truncate_prefix(self, sequence: int) -> int:
        """DeleteRecords: make ``sequence`` the first readable Sequence; return log_start.

        Raises OffsetOutOfRange when ``sequence`` > next_sequence. Whole closed
        segments below it are deleted; a lower ``sequence`` changes nothing.
        """
        if sequence > self._next:
            raise OffsetOutOfRange(sequence, self._log_start, self._next)
        if sequence > self._log_start:
            self._log_start = sequence
            self._write_log_start()
            while len(self._segments) > 1 and self._segments[0].end <= sequence:
                self._drop_first_segment()
        return self._log_start

    def _write_log_start(self) -> None:
        """The ``log-start`` file is rewritten by the next flush, on the I/O thread (its fsyncs
        and the directory's): written here, a retention pass over 1,856 expired partitions
        held the reactor 1.5 s. Until then a crash finds the older value, as it finds the
        dropped segments' unlinks unsynced; recovery (or, on a cluster, replay from the
        checkpoint that flush precedes) drops them again."""
        self._files_due[LOG_START_FILE] = f"{self._log_start}\n".encode()

    def _drop_first_segment(self) -> None:
        seg = self._segments.pop(0)
        self._bases.pop(0)
        self._unlink_segment_files(seg)
        self._sync_dir = True

    def _unlink_segment_files(self, seg: Segment) -> None:
        seg.close_reader()
        seg.unmap_indexes()
        path = seg.path()
        if os.path.exists(path):
            doomed = path.with_name(path.name + DELETED_SUFFIX)
            os.replace(path, doomed)
            os.unlink(doomed)
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            try:
                os.unlink(seg.path(suffix))
            except FileNotFoundError:
                pass

    # --- compaction -----------------------------------------------------------------

    def may_compact(self) -> bool:
        """Whether a ``compaction_plan`` could find anything: a compacted log with a closed
        segment (an empty or one-segment log never has one)."""
        return self._config.compact and len(self._segments) > 1

    def compaction_plan(self, now_ms: int) -> CompactionPlan | None:
        """Snapshot the cleanable segments (None if not compacting or nothing is due).

        Cleanable, as Kafka's ``LogCleanerManager.cleanableOffsets``: closed, indexed segments
        up to the active one, stopping at the first whose newest record is younger than
        ``min.compaction.lag.ms`` or that reaches the last stable offset; the key map covers
        exactly those (records in the active segment do not supersede anything yet). A pass is
        due when the dirty share of those bytes (written since the last clean) exceeds
        ``min.cleanable.dirty.ratio``, when the oldest dirt is older than
        ``max.compaction.lag.ms``, or when a kept tombstone's delete
        horizon has passed. The plan holds its own fds, so later retention or closes cannot
        disturb it.

        One plan at a time, as Kafka's cleaner manager marks a partition in progress: None
        until ``install_compaction`` or ``abandon_compaction``. Every node of a cluster
        proposes its own Compact commands, and two plans for one segment wrote the same
        ``.cleaned`` files: one installed the other's half-written output, or found it gone.
        """
        cfg = self._config
        if not cfg.compact or self._cleaning:
            return None
        cleanable: list[Segment] = []
        # As Kafka's cleaner: nothing at or past the last stable offset, so an open
        # transaction's records never replace (and remove) a committed value of their key.
        stable = self.stable_end(self._durable)
        for seg in self._segments[:-1]:
            if seg.builder is not None or seg.offsets is None:
                break  # its index is still being written
            if seg.end > stable:
                break
            lag = cfg.min_compaction_lag_ms
            if lag > 0 and seg.max_timestamp > now_ms - lag:
                break
            cleanable.append(seg)
        if not cleanable:
            return None
        bound = min(self._durable, cleanable[-1].end)
        dirty = [seg for seg in cleanable if seg.end > self._cleaned_to]
        dirty_bytes = sum(seg.size for seg in dirty)
        total = sum(seg.size for seg in cleanable)
        oldest = min((seg.first_batch_ts if seg.first_batch_ts is not None else seg.max_timestamp
                      for seg in dirty), default=None)
        due = (
            (dirty_bytes and total and dirty_bytes / total > cfg.min_cleanable_dirty_ratio)
            or (dirty_bytes and oldest is not None and oldest >= 0
                and now_ms - oldest > cfg.max_compaction_lag_ms)
            or (self._tombstones_due is not None and now_ms >= self._tombstones_due)
        )
        if not due:
            return None
        sources = []
        for seg in cleanable:
            if not seg.size:
                continue
            sources.append(SegmentSource(seg.base, seg.generation, seg.size,
                                         os.open(seg.path(), os.O_RDONLY), seg.max_timestamp))
        if not sources:
            return None
        self._cleaning = True
        return CompactionPlan(
            directory=self._dir,
            sources=sources,
            bound=bound,
            now_ms=now_ms,
            delete_retention_ms=cfg.delete_retention_ms,
            interval=cfg.index_interval_bytes,
            producer_floor=self.producer_floor if self.producers is not None else None,
            owner=self,
            aborted=self._aborted_below(bound),
        )

    def _aborted_below(self, bound: int) -> AbortedIndex | None:
        """The aborted transactions a compaction below ``bound`` may meet, by producer."""
        if self.txns is None or not self.txns.aborted:
            return None
        return index_aborted(self.txns.aborted_between(self._log_start, bound))

    def install_compaction(self, result: CompactionResult) -> int:
        """Swap cleaned segments in by rename if they are unchanged since the plan.

        Returns how many segments were replaced; stale results are discarded. The
        directory fsync rides on the next flush (either version of a file is valid).
        """
        installed = 0
        self._cleaning = False
        self._cleaned_to = max(self._cleaned_to, result.bound)
        self._tombstones_due = result.tombstones_due
        for cleaned in result.segments:
            i = bisect.bisect_left(self._bases, cleaned.base)
            seg = self._segments[i] if i < len(self._segments) else None
            if (
                seg is None
                or seg.base != cleaned.base
                or seg is self._active
                or seg.generation != cleaned.generation
                or seg.builder is not None
            ):
                cleaned.discard()
                continue
            seg.close_reader()
            self._drop_index_files(seg)
            os.replace(cleaned.log_path, seg.path())
            os.replace(cleaned.index_path, seg.path(INDEX_SUFFIX))
            os.replace(cleaned.time_index_path, seg.path(TIME_INDEX_SUFFIX))
            seg.size = cleaned.size
            seg.max_timestamp = cleaned.max_timestamp
            seg.max_timestamp_rel = cleaned.max_timestamp_rel
            seg.generation += 1
            seg.budgeted = seg.cold_below = seg.size  # old data: reads drop what they read
            seg.map_indexes()
            installed += 1
        if installed:
            self._sync_dir = True
        return installed

    def abandon_compaction(self) -> None:
        """The plan's cleaning failed: the next ``compaction_plan`` may start another."""
        self._cleaning = False

    # --- shutdown -------------------------------------------------------------------

    def close(self, save_scan: bool = False) -> None:
        """Flush synchronously and release every fd and mapping (shut-down or delete;
        blocking). A token still running on another thread (a delete under a flush) closes
        the fds it uses itself, once done. With ``save_scan`` (the daemon's clean stop) the
        active segment's index is saved for the next start-up (``segment.save_scan``)."""
        for running in self._tokens:  # a delete may close the log under a running flush
            running.abandoned = True
        token = self.prepare_flush()
        if token is not None:
            token.run()
            self.complete_flush(token)
        if save_scan and not self._closed:
            self._save_active_scan()
        self._closed = True
        if self.page_cache is not None:
            self.page_cache.forget(self)
        fds = set(self._retired_fds) | set(self._fd_refs)
        for token in self._tokens:
            for _seg, files in token.index_jobs:
                fds.update(fd for fd, _part, _final in files)
        for seg in self._segments:
            seg.close_reader()
            seg.unmap_indexes()
            if seg.write_fd is not None:
                if seg.reserved > seg.size:
                    prealloc.trim(seg.write_fd, seg.size)
                fds.add(seg.write_fd)
                seg.write_fd = None
        # Each fd is closed once: an fd closed twice may by then number a file another
        # thread just opened (a delete under a running flush closed the I/O thread's
        # checkpoint file that way, and the node refused every write). An fd a prepared
        # token may still sync is closed by the newest such token once it has run.
        running = list(self._tokens)
        for fd in fds:
            if not any(t.uses(fd) and t.close_when_finished(fd) for t in reversed(running)):
                _close_quietly(fd)
        self._tokens.clear()
        self._retired_fds.clear()
        self._fd_refs.clear()
        self._dirty_fds.clear()

    def _save_active_scan(self) -> None:
        """Save the active segment's index, if every byte of the log is durable."""
        active = self._active
        if (self._durable != self._next or self._tokens or active.builder is None
                or active.end != self._next):
            return
        try:
            save_scan(self._dir, active.base, ScanResult(
                active.size, self._next, active.builder, records.NO_TIMESTAMP))
        except OSError as exc:  # start-up will walk the segment instead
            _log.warn("could not save the index of {dir}: {error}", dir=str(self._dir),
                      error=exc)

    def delete(self) -> None:
        """Close and remove the channel's whole directory (config.json included)."""
        self.close()
        shutil.rmtree(self._dir, ignore_errors=True)
