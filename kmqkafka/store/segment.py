"""One segment of a channel log: a file of whole RecordBatch v2 batches plus its indexes.

Files of a segment whose first Sequence is ``base`` (see index.py for the index formats)::

    {base:020d}.log         plain concatenation of batches, baseOffset = Sequence - 1
    {base:020d}.index       sparse offset index (derived)
    {base:020d}.timeindex   sparse time index (derived)

Transient suffixes: ``.part`` (an index being written, renamed after fsync),
``.cleaned`` (compaction output, renamed in by ``ChannelLog.install_compaction``),
``.deleted`` (being removed). Recovery deletes all three.

Only the 61-byte batch header is parsed on the append and read paths. A
``Segment`` is owned by its ``ChannelLog`` and used on the reactor thread only.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from kmqkafka import records
from kmqkafka.store.index import IndexBuilder, MappedOffsetIndex, MappedTimeIndex

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
PART_SUFFIX = ".part"
CLEANED_SUFFIX = ".cleaned"
DELETED_SUFFIX = ".deleted"
SCAN_SUFFIX = ".scan"

# baseOffset, batchLength, lastOffsetDelta (at byte 23): all the read path needs.
BATCH_SPAN = struct.Struct(">qi11xi")
_MAX_TS = struct.Struct(">q")
SCAN_CHUNK = 4 * 1024 * 1024
# baseOffset, batchLength, attributes, lastOffsetDelta, maxTimestamp, producerId,
# producerEpoch, baseSequence: what the idempotent-producer state needs (57 bytes).
PRODUCER_SPAN = struct.Struct(">qi9xhi8xqqhi")
HEADER_CHUNK = 64 * 1024


def segment_name(base: int, suffix: str) -> str:
    return f"{base:020d}{suffix}"


def parse_base(name: str) -> int | None:
    """Base Sequence of a ``{base:020d}.log`` file name, else None."""
    stem, dot, ext = name.partition(".")
    if dot and "." + ext == LOG_SUFFIX and len(stem) == 20 and stem.isdigit():
        return int(stem)
    return None


@dataclass(slots=True)
class ScanResult:
    """What a batch-by-batch walk of a .log found; ``valid_size`` < file size means torn."""

    valid_size: int
    next_sequence: int
    index: IndexBuilder
    first_timestamp: int  # maxTimestamp of the first batch, -1 if empty


def scan_log(
    fd: int,
    size: int,
    base: int,
    interval: int,
    *,
    verify: bool = True,
    upper: int | None = None,
    dense: bool = False,
) -> ScanResult:
    """Walk every batch of a segment file from position 0, building its indexes.

    Stops at the first batch that is cut off, fails its CRC (when ``verify``), starts
    below the previous batch's last Sequence + 1 (or below ``base``), or reaches
    ``upper`` (the next segment's base). With ``dense`` (the active segment, which
    compaction never touches) every batch must start exactly at the previous last
    Sequence + 1, since the CRC does not cover baseOffset. Safe on any thread.
    """
    builder = IndexBuilder(interval)
    add = builder.add
    fields_at, valid = records.read_header_fields, records.valid_fields
    header_size, overhead = records.HEADER_SIZE, records.LOG_OVERHEAD
    expected = base
    pos = 0
    first_ts = records.NO_TIMESTAMP
    while pos < size:
        chunk = os.pread(fd, min(SCAN_CHUNK, size - pos), pos)
        view = memoryview(chunk)
        end = len(view)
        off = 0
        # The same steps as for a batch cut by the chunk's end (below), on raw header fields:
        # start-up scans every batch of each active segment, and this loop is most of it.
        while off + header_size <= end:
            fields = fields_at(view, off)
            batch_size = fields[1] + overhead
            if batch_size < header_size:
                return ScanResult(pos + off, expected, builder, first_ts)
            if off + batch_size > end:
                break
            if verify and not valid(view, off, fields):
                return ScanResult(pos + off, expected, builder, first_ts)
            first_seq = fields[0] + 1
            last_seq = first_seq + fields[6]
            if first_seq < expected or (dense and first_seq != expected) or (
                upper is not None and last_seq >= upper
            ):
                return ScanResult(pos + off, expected, builder, first_ts)
            if pos + off == 0:
                first_ts = fields[8]
            add(first_seq - base, pos + off, fields[8])
            expected = last_seq + 1
            off += batch_size
        if off == 0:
            # The batch at pos does not fit in this chunk: read it whole, or it is torn.
            batch_size = records.batch_size_at(view, 0) if len(view) >= records.LOG_OVERHEAD else -1
            if batch_size < records.HEADER_SIZE or pos + batch_size > size:
                return ScanResult(pos, expected, builder, first_ts)
            chunk = os.pread(fd, batch_size, pos)
            view = memoryview(chunk)
            try:
                header = (records.validate_batch if verify else records.read_header)(view, 0)
            except records.InvalidBatch:
                return ScanResult(pos, expected, builder, first_ts)
            first_seq = header.base_offset + 1
            last_seq = first_seq + header.last_offset_delta
            if first_seq < expected or (dense and first_seq != expected) or (
                upper is not None and last_seq >= upper
            ):
                return ScanResult(pos, expected, builder, first_ts)
            if pos == 0:
                first_ts = header.max_timestamp
            builder.add(first_seq - base, pos, header.max_timestamp)
            expected = last_seq + 1
            off = batch_size
        pos += off
    return ScanResult(pos, expected, builder, first_ts)


_SAVED_SCAN = struct.Struct(">8sqqqI")  # magic, base, valid size, next Sequence, crc32c
_SAVED_MAGIC = b"kmqscan1"


def save_scan(directory: Path, base: int, scan: ScanResult) -> None:
    """Write what ``scan_log`` would find in the active segment ``base`` as it stands now (a
    clean shut-down, every byte of it durable): start-up then takes it instead of walking
    every batch (``load_saved_scan``). Not fsynced: a torn file fails its checksum."""
    body = scan.index.state_bytes()
    head = _SAVED_SCAN.pack(_SAVED_MAGIC, base, scan.valid_size, scan.next_sequence,
                            records.crc32c(body))
    final = directory / segment_name(base, SCAN_SUFFIX)
    part = final.with_name(final.name + PART_SUFFIX)
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, head + body)
    finally:
        os.close(fd)
    os.replace(part, final)


def load_saved_scan(seg: "Segment") -> ScanResult | None:
    """The scan ``save_scan`` left for segment ``seg`` (whose ``size`` is its file's size), if
    it still describes the file; None otherwise. The file is removed either way, before the
    segment takes a new append.

    Trusted only if it parses whole, its checksum holds, it names this segment and this file
    size, and the batches after its last index entry walk exactly to the end of the file,
    from the Sequence that entry names to the saved next Sequence. Appends only ever add to
    a segment's file and crash recovery only cuts it, so a file of the saved size holds the
    saved bytes."""
    path = seg.path(SCAN_SUFFIX)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    os.unlink(path)
    try:
        magic, base, size, next_sequence, crc = _SAVED_SCAN.unpack_from(data, 0)
        body = memoryview(data)[_SAVED_SCAN.size:]
        if (magic != _SAVED_MAGIC or base != seg.base or size != seg.size
                or records.crc32c(body) != crc):
            return None
        index = IndexBuilder.from_state(body)
    except (struct.error, ValueError):
        return None
    if size == 0:
        return ScanResult(0, base, index, records.NO_TIMESTAMP) if next_sequence == base \
            else None
    if not index.rels:
        return None
    walked = seg.tail_walk(index.positions[-1])
    if walked != (base + index.rels[-1], next_sequence - 1):
        return None
    first_ts = seg.batch_max_timestamp(0)
    return ScanResult(size, next_sequence, index, first_ts)


def write_index_parts(directory: Path, base: int, builder: IndexBuilder, suffix: str) -> list[tuple[int, Path, Path]]:
    """Write both index files as ``{name}{suffix}`` (not yet fsynced); return (fd, part, final).

    The caller fsyncs each fd, then renames part -> final (see FlushToken).
    """
    out = []
    for ext, data in ((INDEX_SUFFIX, builder.offset_bytes()), (TIME_INDEX_SUFFIX, builder.time_bytes())):
        final = directory / segment_name(base, ext)
        part = final.with_name(final.name + suffix)
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        write_all(fd, data)
        out.append((fd, part, final))
    return out


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_batch_at_offset(fd: int, head: bytes, batch: memoryview) -> None:
    """Write ``batch`` with its first ``len(head)`` bytes replaced by ``head`` (the broker's
    base offset, length and leader epoch), without copying the batch."""
    n = len(head)
    done = os.writev(fd, (head, batch[n:]))
    if done < len(batch):
        if done < n:
            write_all(fd, head[done:])
            done = n
        write_all(fd, batch[done:])


class Segment:
    """One segment's state: a handful of numbers plus index handles, never per batch.

    The active segment has ``write_fd`` and an in-memory ``IndexBuilder``; a closed
    segment has mapped index files once its index files are durable (until then it
    keeps the builder). ``end`` is the Sequence after the segment's last stored
    record slot: the next segment's base, or the log's next_sequence when active.
    """

    __slots__ = (
        "directory", "base", "end", "size", "max_timestamp", "max_timestamp_rel",
        "builder", "offsets", "times", "write_fd", "read_fd", "first_append_ms",
        "first_batch_ts", "generation", "budgeted", "cold_below", "reserved",
    )

    def __init__(self, directory: Path, base: int) -> None:
        self.directory = directory
        self.base = base
        self.end = base
        self.size = 0
        self.max_timestamp = records.NO_TIMESTAMP
        self.max_timestamp_rel = -1
        self.builder: IndexBuilder | None = None
        self.offsets: MappedOffsetIndex | None = None
        self.times: MappedTimeIndex | None = None
        self.write_fd: int | None = None
        self.reserved = 0  # blocks reserved up to here (store/prealloc.py); active only
        self.read_fd: int | None = None
        self.first_append_ms: int | None = None
        # maxTimestamp of the segment's first batch (Kafka's rollingBasedTimestamp); None if
        # unknown (a closed segment after a restart) or the batch had no timestamp
        self.first_batch_ts: int | None = None
        self.generation = 0
        # Page-cache bookkeeping (pagecache.py): bytes below ``budgeted`` were handed to the
        # budget as durable; below ``cold_below`` the cache was dropped (or predates us).
        self.budgeted = 0
        self.cold_below = 0

    def path(self, suffix: str = LOG_SUFFIX) -> Path:
        return self.directory / segment_name(self.base, suffix)

    # --- index access -------------------------------------------------------------

    def lookup(self, sequence: int) -> int:
        """Position of an indexed batch starting at or before ``sequence``."""
        rel = sequence - self.base
        if rel <= 0:
            return 0
        if self.builder is not None:
            return self.builder.lookup(rel)
        if self.offsets is not None:
            return self.offsets.lookup(rel)
        return 0

    def time_floor_position(self, timestamp: int) -> int:
        """A position from which a walk finds the first batch with maxTimestamp >= ts."""
        if self.builder is not None:
            rel = self.builder.time_floor(timestamp)
        elif self.times is not None:
            rel = self.times.time_floor(timestamp)
        else:
            rel = -1
        return self.lookup(self.base + rel) if rel >= 0 else 0

    def map_indexes(self) -> None:
        """Switch from the in-memory builder to the durable index files (read-only)."""
        offsets = MappedOffsetIndex(self.path(INDEX_SUFFIX))
        try:
            times = MappedTimeIndex(self.path(TIME_INDEX_SUFFIX))
        except BaseException:
            offsets.close()
            raise
        self.unmap_indexes()
        self.offsets, self.times = offsets, times
        self.builder = None

    def unmap_indexes(self) -> None:
        if self.offsets is not None:
            self.offsets.close()
            self.offsets = None
        if self.times is not None:
            self.times.close()
            self.times = None

    def adopt_scan(self, scan: ScanResult) -> None:
        self.builder = scan.index
        self.size = scan.valid_size
        self.max_timestamp = scan.index.max_timestamp
        self.max_timestamp_rel = scan.index.max_timestamp_rel

    # --- file access --------------------------------------------------------------

    def open_for_append(self, interval: int) -> None:
        self.write_fd = os.open(self.path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if self.builder is None:
            self.builder = IndexBuilder(interval)

    def reader(self) -> int:
        if self.read_fd is None:
            self.read_fd = os.open(self.path(), os.O_RDONLY)
        return self.read_fd

    def pread(self, n: int, pos: int) -> bytes:
        return os.pread(self.reader(), n, pos)

    def close_reader(self) -> None:
        if self.read_fd is not None:
            os.close(self.read_fd)
            self.read_fd = None

    def tail_walk(self, start: int) -> tuple[int, int] | None:
        """Walk headers from ``start`` to the end of the file: (first Sequence of the
        batch at ``start``, last Sequence of the last batch).

        None when the walk does not end exactly at the file size (index and log disagree).
        """
        data = self.pread(self.size - start, start)
        view = memoryview(data)
        off = 0
        first_seq = last_seq = -1
        while off < len(view):
            if len(view) - off < records.HEADER_SIZE:
                return None
            base_offset, length, delta = BATCH_SPAN.unpack_from(view, off)
            size = length + records.LOG_OVERHEAD
            if size < records.HEADER_SIZE or off + size > len(view) or view[off + 16] != records.MAGIC_V2:
                return None
            if first_seq < 0:
                first_seq = base_offset + 1
            last_seq = base_offset + 1 + delta
            off += size
        return (first_seq, last_seq) if first_seq >= 0 else None

    def batch_max_timestamp(self, pos: int) -> int:
        return _MAX_TS.unpack(self.pread(8, pos + 35))[0]


def iter_file_batches(fd: int, size: int, start: int = 0) -> Iterator[tuple[int, memoryview]]:
    """Yield (position, memoryview of one whole batch) from ``start`` up to ``size``.

    Header-only walk (no CRC); stops at a cut-off batch. Safe on any thread.
    """
    pos = start
    while pos < size:
        chunk = os.pread(fd, min(SCAN_CHUNK, size - pos), pos)
        view = memoryview(chunk)
        off = 0
        while len(view) - off >= records.LOG_OVERHEAD:
            batch_size = records.batch_size_at(view, off)
            if batch_size < records.HEADER_SIZE:
                return
            if off + batch_size > len(view):
                break
            yield pos + off, view[off : off + batch_size]
            off += batch_size
        if off == 0:
            batch_size = records.batch_size_at(view, 0)
            if batch_size < records.HEADER_SIZE or pos + batch_size > size:
                return
            yield pos, memoryview(os.pread(fd, batch_size, pos))
            off = batch_size
        pos += off


def iter_producer_headers(fd: int, size: int, start: int = 0) -> Iterator[tuple[int, ...]]:
    """Yield ``PRODUCER_SPAN`` fields of every batch from ``start`` up to ``size``.

    Header-only walk (no CRC, records never parsed): reads of at most ``HEADER_CHUNK`` bytes
    serve every header inside them; after a batch larger than a read, only the next header is
    read. Every read serves at least one header, so a walk costs at most one read per batch
    and, give or take a header cut at a read's end, no more bytes than lie between ``start``
    and ``size``. Stops at a cut-off or malformed batch.
    Safe on any thread.
    """
    pos = start
    want = HEADER_CHUNK
    batch_size = 0
    unpack = PRODUCER_SPAN.unpack_from
    while size - pos >= records.HEADER_SIZE:
        buf = os.pread(fd, min(want, size - pos), pos)
        n = len(buf)
        if n < records.HEADER_SIZE:
            return
        off = 0
        while n - off >= records.HEADER_SIZE:
            fields = unpack(buf, off)
            batch_size = fields[1] + records.LOG_OVERHEAD
            if batch_size < records.HEADER_SIZE or pos + off + batch_size > size:
                return
            yield fields
            off += batch_size
        pos += off
        want = records.HEADER_SIZE if batch_size > HEADER_CHUNK else HEADER_CHUNK
