"""The page-cache budget: durable segment data past the limit leaves the page cache, recent
and unsynced data stays, reads of old data drop what the reader passed, and what is read is
unchanged. Residency is the kernel's own answer (mincore on a mapping of the file)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest
from conftest import on_tmpfs
from conftest import resident_bytes as resident

from kmqkafka import records
from kmqkafka.store.config import LogConfig
from kmqkafka.store.log import ChannelLog
from kmqkafka.store.fsutil import sync_tree
from kmqkafka.store.pagecache import PageCacheBudget, drop_tree

from . import all_records, flush, make_batch

PAGE = mmap.PAGESIZE
KIB = 1024
CONFIG = LogConfig(segment_bytes=1 << 20, index_interval_bytes=4096)


@pytest.fixture
def disk_dir(tmp_path: Path) -> Path:
    if on_tmpfs(tmp_path):
        pytest.skip("the temp dir is on tmpfs, whose pages are memory and never dropped")
    return tmp_path


def fill(log: ChannelLog, batches: int, value_bytes: int = 60 * KIB, flush_each: bool = True,
         ts: int = 1_000) -> list[bytes]:
    """Append ``batches`` one-record batches; return their values."""
    values = []
    for i in range(batches):
        value = bytes([i % 251]) * value_bytes
        log.append(make_batch(1, value=value, ts=ts), ts)
        values.append(value + b"0")
        if flush_each:
            flush(log)
    return values


def segments(log: ChannelLog) -> list[Path]:
    return sorted(log.directory.glob("*.log"))


def test_durable_data_past_the_limit_leaves_the_page_cache(disk_dir: Path) -> None:
    budget = PageCacheBudget(256 * KIB)
    log = ChannelLog.open(disk_dir / "ch", CONFIG, 0, page_cache=budget)
    try:
        fill(log, 40)  # ~2.4 MiB: three segments
        files = segments(log)
        assert len(files) >= 3
        first = files[0]
        assert resident(first) <= 2 * PAGE, "an old segment stayed in the page cache"
        newest = files[-1]
        assert budget.limit - 64 * KIB < budget.held <= budget.limit + budget.chunk
        assert resident(newest) >= budget.held - 2 * PAGE  # the newest data stays
        assert budget.dropped >= 2 * CONFIG.segment_bytes - 256 * KIB - 128 * KIB
    finally:
        log.close()


def test_without_a_budget_the_kernel_keeps_everything(disk_dir: Path) -> None:
    log = ChannelLog.open(disk_dir / "ch", CONFIG, 0)
    try:
        fill(log, 40)
        first = segments(log)[0]
        assert resident(first) >= first.stat().st_size - PAGE
    finally:
        log.close()


def test_data_not_yet_synced_stays_cached(disk_dir: Path) -> None:
    budget = PageCacheBudget(64 * KIB)
    log = ChannelLog.open(disk_dir / "ch", CONFIG, 0, page_cache=budget)
    try:
        fill(log, 12, flush_each=False)  # ~720 KiB, one segment, never flushed
        seg = segments(log)[0]
        assert budget.held == 0 and budget.dropped == 0
        assert resident(seg) >= seg.stat().st_size - PAGE
        flush(log)
        assert resident(seg) <= 64 * KIB + 2 * PAGE
    finally:
        log.close()


def test_reads_return_the_stored_records_and_drop_what_the_reader_passed(
        disk_dir: Path) -> None:
    budget = PageCacheBudget(128 * KIB, trail=512 * KIB, margin=128 * KIB)
    log = ChannelLog.open(disk_dir / "ch", CONFIG, 0, page_cache=budget)
    try:
        values = fill(log, 60)  # ~3.6 MiB: four segments
        # Bring everything back into the page cache (another reader, say).
        for path in segments(log):
            with open(path, "rb") as f:
                f.read()
        assert resident(segments(log)[0]) >= segments(log)[0].stat().st_size - PAGE
        seq, got = log.log_start, []
        while seq < log.next_sequence:  # a consumer fetching 64 KiB at a time
            result = log.read(seq, 64 * KIB)
            for batch in result.batches:
                records.validate_batch(batch)
                got.extend(r.value for r in records.iter_records(batch))
                seq = records.read_header(batch).base_offset + 1 + \
                    records.read_header(batch).last_offset_delta + 1
        assert got == values
        files = segments(log)
        for path in files[:-2]:  # passed segments: the reader dropped them behind itself
            assert resident(path) <= 2 * PAGE, f"{path.name} stayed cached after the read"
    finally:
        log.close()


def test_a_reopened_log_counts_its_data_as_cold(disk_dir: Path) -> None:
    log = ChannelLog.open(disk_dir / "ch", CONFIG, 0)
    values = fill(log, 30)
    log.close()
    budget = PageCacheBudget(1 << 30, trail=512 * KIB, margin=64 * KIB)
    log = ChannelLog.open(disk_dir / "ch", CONFIG, 0, page_cache=budget)
    try:
        assert [r.value for r in all_records(log)] == values
        first = segments(log)[0]
        seq = log.log_start
        while seq < log.next_sequence:
            batches = log.read(seq, 32 * KIB).batches
            last = records.read_header(batches[-1])
            seq = last.base_offset + 1 + last.last_offset_delta + 1
        assert resident(first) <= 2 * PAGE
    finally:
        log.close()


def test_ranges_of_deleted_logs_and_expired_segments_are_skipped(disk_dir: Path) -> None:
    budget = PageCacheBudget(128 * KIB)
    gone = ChannelLog.open(disk_dir / "gone", CONFIG, 0, page_cache=budget)
    fill(gone, 4)
    gone.delete()
    kept = ChannelLog.open(disk_dir / "kept", CONFIG, 0, page_cache=budget)
    try:
        fill(kept, 30)
        kept.truncate_prefix(kept.next_sequence - 2)  # whole segments go
        fill(kept, 10)
        assert budget.held <= budget.limit
        assert [len(r.value) for r in all_records(kept)][-10:] == [60 * KIB + 1] * 10
    finally:
        kept.close()
    assert not (disk_dir / "gone").exists()
    assert os.path.isdir(disk_dir / "kept")


def test_closed_and_deleted_logs_leave_the_budget(tmp_path: Path) -> None:
    """A deleted partition's log stayed referenced (and counted) by the budget until 64 MiB
    of newer writes pushed its ranges out: 3,000 deleted topics held 3,000 logs."""
    import gc
    import weakref

    budget = PageCacheBudget(64 << 20)
    kept = ChannelLog.open(tmp_path / "kept", CONFIG, 0, page_cache=budget)
    refs = []
    try:
        fill(kept, 2, value_bytes=1000)
        held_by_kept = budget.held
        for i in range(4):
            log = ChannelLog.open(tmp_path / f"ch{i}", CONFIG, 0, page_cache=budget)
            fill(log, 3, value_bytes=1000)
            if i % 2:
                log.delete()
            else:
                log.close()
            refs.append(weakref.ref(log))
            del log
        gc.collect()
        assert [r() for r in refs] == [None] * 4
        assert budget.held == held_by_kept > 0
    finally:
        kept.close()
    assert budget.held == 0


def test_small_flushes_share_one_entry_per_segment(disk_dir: Path) -> None:
    """A partition flushing a few hundred bytes at a time keeps the budget's bookkeeping
    small: its contiguous ranges merge (up to a MiB each)."""
    budget = PageCacheBudget(64 << 20)
    logs = [ChannelLog.open(disk_dir / f"ch{i}", CONFIG, 0, page_cache=budget) for i in range(3)]
    try:
        for _ in range(500):
            for log in logs:
                log.append(make_batch(1, value=b"x" * 200), 1_000)
                flush(log)
        assert budget.held == sum(log.size_bytes for log in logs)
        assert len(budget._ranges) == 3
    finally:
        for log in logs:
            log.close()


def test_a_snapshot_tree_written_without_fsync_is_synced_then_dropped(disk_dir: Path) -> None:
    """What a follower does with a snapshot tar it unpacked: fsync every file (its checkpoint
    will count them as durable), then drop them from the page cache (dirty pages could not
    be dropped: nothing stays cached only if the sync happened)."""
    root = disk_dir / "snap.part"
    files = []
    for i in range(3):
        d = root / "channels" / f"kafka.t~{i}"
        d.mkdir(parents=True)
        path = d / "00000000000000000001.log"
        path.write_bytes(os.urandom(512 * KIB))
        files.append(path)
    assert all(resident(p) > 0 for p in files)
    sync_tree(root)
    drop_tree(root)
    assert [resident(p) for p in files] == [0, 0, 0]


def test_a_flush_larger_than_the_limit_keeps_its_newest_limit_bytes(disk_dir: Path) -> None:
    budget = PageCacheBudget(64 * KIB)
    log = ChannelLog.open(disk_dir / "ch", CONFIG, 0, page_cache=budget)
    try:
        fill(log, 5, flush_each=False)  # ~300 KiB in one flush
        flush(log)
        seg = segments(log)[0]
        size = seg.stat().st_size
        assert budget.held == 64 * KIB
        assert resident(seg, 0, size - 128 * KIB) == 0  # (a folio may straddle the cut)
        assert resident(seg, size - 64 * KIB + PAGE, size) >= 64 * KIB - 3 * PAGE
    finally:
        log.close()
