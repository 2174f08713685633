"""Segment files and their sparse indexes: scan, index rules, mapped lookups."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given, settings, strategies as st

from kmqkafka import records
from kmqkafka.store.index import IndexBuilder, MappedOffsetIndex, MappedTimeIndex
from kmqkafka.store.segment import (
    PART_SUFFIX,
    iter_file_batches,
    parse_base,
    scan_log,
    segment_name,
    write_index_parts,
)

from . import make_batch


def _write_segment(path: Path, base: int, sizes: list[int], stamps: list[int] | None = None) -> list[int]:
    """Write batches with Sequences from ``base``; return each batch's position."""
    out = bytearray()
    positions = []
    seq = base
    for i, n in enumerate(sizes):
        batch = bytearray(make_batch(n, ts=stamps[i] if stamps else 0, value=b"s" * 30))
        records.set_base_offset(batch, seq - 1)
        positions.append(len(out))
        out += batch
        seq += n
    path.write_bytes(bytes(out))
    return positions


def test_names_round_trip() -> None:
    assert segment_name(42, ".log") == "00000000000000000042.log"
    assert parse_base("00000000000000000042.log") == 42
    for bad in ("42.log", "00000000000000000042.index", "00000000000000000042.log.deleted", "x" * 20 + ".log"):
        assert parse_base(bad) is None


def test_index_builder_entry_rules() -> None:
    b = IndexBuilder(100)
    b.add(0, 0, 10)      # first batch: both indexes
    b.add(3, 40, 20)     # too close: no entries, but max grows
    b.add(5, 120, 15)    # offset entry (>= 100 bytes); ts not growing
    b.add(8, 150, 30)    # ts grows and 150 - 0 >= 100: time entry
    b.add(9, 170, 40)    # ts grows but too close to last time entry
    assert list(b.rels) == [0, 5] and list(b.positions) == [0, 120]
    assert list(b.times) == [10, 30] and list(b.time_rels) == [0, 8]
    b.seal()
    assert (b.times[-1], b.time_rels[-1]) == (40, 9)
    assert b.lookup(4) == 0 and b.lookup(5) == 120 and b.lookup(100) == 120
    assert b.time_floor(10) == -1 and b.time_floor(11) == 0 and b.time_floor(35) == 8


def test_scan_builds_indexes_and_stops_at_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / segment_name(11, ".log")
    positions = _write_segment(path, 11, [2, 3, 1, 4], stamps=[5, 9, 7, 12])
    whole = path.stat().st_size
    with open(path, "ab") as f:
        f.write(make_batch(1)[:40])
    fd = os.open(path, os.O_RDONLY)
    try:
        scan = scan_log(fd, whole + 40, 11, interval=1)
        assert (scan.valid_size, scan.next_sequence, scan.first_timestamp) == (whole, 21, 5)
        assert list(scan.index.positions) == positions
        assert list(scan.index.rels) == [0, 2, 5, 6]
        assert (scan.index.max_timestamp, scan.index.max_timestamp_rel) == (12, 6)
        # A base offset that jumps backwards ends the valid part.
        assert scan_log(fd, whole, 12, interval=1).valid_size == 0
        # With dense, a forward jump (gap) ends it too; without, it is a compaction gap.
        assert scan_log(fd, whole, 10, interval=1, dense=True).valid_size == 0
        assert scan_log(fd, whole, 10, interval=1).valid_size == whole
        # The next segment's base bounds the last Sequence.
        assert scan_log(fd, whole, 11, interval=1, upper=17).valid_size == positions[3]
        assert [p for p, _ in iter_file_batches(fd, whole)] == positions
    finally:
        os.close(fd)


def test_scan_rejects_a_corrupt_batch(tmp_path: Path) -> None:
    path = tmp_path / segment_name(1, ".log")
    positions = _write_segment(path, 1, [1, 1, 1])
    data = bytearray(path.read_bytes())
    data[positions[1] + 70] ^= 1
    path.write_bytes(bytes(data))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert scan_log(fd, len(data), 1, interval=1).valid_size == positions[1]
        assert scan_log(fd, len(data), 1, interval=1, verify=False).valid_size == len(data)
    finally:
        os.close(fd)


def test_scan_reads_batches_larger_than_its_chunk(tmp_path: Path, monkeypatch) -> None:
    from kmqkafka.store import segment
    monkeypatch.setattr(segment, "SCAN_CHUNK", 100)
    path = tmp_path / segment_name(1, ".log")
    _write_segment(path, 1, [5, 1, 7])
    fd = os.open(path, os.O_RDONLY)
    try:
        size = path.stat().st_size
        assert scan_log(fd, size, 1, interval=1).next_sequence == 14
        assert len(list(iter_file_batches(fd, size))) == 3
    finally:
        os.close(fd)


@settings(max_examples=50, deadline=None)
@given(entries=st.lists(st.tuples(st.integers(1, 5), st.integers(1, 300), st.integers(0, 50)),
                        min_size=1, max_size=80),
       interval=st.integers(1, 500), probe=st.integers(0, 500))
def test_mapped_indexes_answer_like_the_builder(tmp_path_factory, entries, interval, probe) -> None:
    """Index files written at roll give the same lookups as the in-memory builder."""
    d = tmp_path_factory.mktemp("idx")
    b = IndexBuilder(interval)
    rel = pos = 0
    ts = 0
    for span, size, jump in entries:
        ts += jump - 10
        b.add(rel, pos, ts)
        rel += span
        pos += size
    b.seal()
    for fd, part, final in write_index_parts(d, 1, b, PART_SUFFIX):
        os.close(fd)
        os.replace(part, final)
    offsets = MappedOffsetIndex(d / segment_name(1, ".index"))
    times = MappedTimeIndex(d / segment_name(1, ".timeindex"))
    try:
        assert offsets.lookup(probe) == b.lookup(probe)
        assert times.time_floor(probe - 10) == b.time_floor(probe - 10)
        assert offsets.last() == (b.rels[-1], b.positions[-1])
        assert times.last() == (b.max_timestamp, b.max_timestamp_rel) or b.max_timestamp < 0
        assert offsets.is_monotonic()
    finally:
        offsets.close()
        times.close()


def test_index_file_with_a_partial_entry_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.index"
    path.write_bytes(b"\x00" * 12)
    try:
        MappedOffsetIndex(path)
    except ValueError:
        pass
    else:
        raise AssertionError("a 12-byte offset index must be refused")
    path.write_bytes(b"")
    empty = MappedOffsetIndex(path)
    assert empty.lookup(5) == 0 and empty.last() is None


def _header_broken(batch: bytearray, how: str) -> None:
    """Break one header check of ``validate_batch`` and re-seal the CRC (so only that check
    can catch it)."""
    import struct

    if how == "magic":
        batch[16] = 1
    elif how == "negative count":
        struct.pack_into(">i", batch, 57, -1)
    elif how == "negative delta":
        struct.pack_into(">i", batch, 23, -1)
    elif how == "codec":
        struct.pack_into(">h", batch, 21, 6)
    struct.pack_into(">I", batch, 17, records.crc32c(memoryview(batch)[21:]))


def test_the_scan_checks_each_header_as_validate_batch_does(tmp_path: Path) -> None:
    """Start-up reads raw header fields for speed; every batch ``validate_batch`` refuses
    ends the valid part there, and every batch it takes is taken."""
    import pytest

    for how in ("magic", "negative count", "negative delta", "codec", "crc", None):
        path = tmp_path / segment_name(1, ".log")
        positions = _write_segment(path, 1, [1, 1, 1])
        data = bytearray(path.read_bytes())
        second = bytearray(data[positions[1]:positions[2]])
        if how == "crc":
            second[-1] ^= 1
        elif how is not None:
            _header_broken(second, how)
        data[positions[1]:positions[2]] = second
        path.write_bytes(bytes(data))
        if how is None:
            records.validate_batch(bytes(second))
        else:
            with pytest.raises(records.InvalidBatch):
                records.validate_batch(bytes(second))
        fd = os.open(path, os.O_RDONLY)
        try:
            scanned = scan_log(fd, len(data), 1, interval=1).valid_size
        finally:
            os.close(fd)
        assert scanned == (len(data) if how is None else positions[1]), how
