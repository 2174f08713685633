"""Blocks reserved ahead of a segment's writes (store/prealloc.py): the file's size stays
that of its data, what a closed segment did not use is given back, and nothing read,
recovered or restarted differs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kmqkafka.store import prealloc
from kmqkafka.store.config import LogConfig
from kmqkafka.store.log import ChannelLog

from . import all_records, flush, make_batch, reopen, segment_files

BIG = LogConfig(segment_bytes=64 << 20, index_interval_bytes=4096)


def _allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


@pytest.fixture(autouse=True)
def _fallocate_works(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        if not prealloc.reserve(fd, 0, 1 << 20):
            pytest.skip("this filesystem refuses fallocate(FALLOC_FL_KEEP_SIZE)")
    finally:
        os.close(fd)
        probe.unlink()


def test_the_active_segment_reserves_ahead_and_keeps_its_size(tmp_path: Path) -> None:
    log = ChannelLog.open(tmp_path / "ch", BIG, 0)
    batch = make_batch(10, value=b"x" * 1000)
    for _ in range(110):  # just past 1 MiB: the step doubled to 1 MiB, reserved to 2 MiB
        log.append(batch, 0)
    flush(log)
    [seg] = segment_files(tmp_path / "ch")
    assert os.stat(seg).st_size == log.size_bytes == 110 * len(batch)
    assert _allocated(seg) >= log.size_bytes + (512 << 10)
    assert _allocated(seg) <= 2 * log.size_bytes + prealloc.MIN_STEP + (1 << 20)
    log.close()


def test_a_small_segment_reserves_little(tmp_path: Path) -> None:
    log = ChannelLog.open(tmp_path / "ch", BIG, 0)
    log.append(make_batch(1), 0)
    flush(log)
    [seg] = segment_files(tmp_path / "ch")
    assert 0 < _allocated(seg) <= prealloc.MIN_STEP + 4096
    log.close()


def test_a_rolled_segment_and_a_closed_log_give_back_what_they_did_not_use(
        tmp_path: Path) -> None:
    log = ChannelLog.open(tmp_path / "ch", BIG, 0)
    batch = make_batch(10, value=b"y" * 1000)
    for _ in range(3):
        for _ in range(110):  # just past 1 MiB, reserved to 2 MiB
            log.append(batch, 0)
        log.roll()
    for _ in range(110):
        log.append(batch, 0)
    flush(log)
    *rolled, active = segment_files(tmp_path / "ch")
    assert len(rolled) == 3
    for path in rolled:
        assert _allocated(path) < os.stat(path).st_size + 3 * 4096
    assert _allocated(active) > os.stat(active).st_size + (512 << 10)
    stored = [(r.offset, r.value) for r in all_records(log)]
    log = reopen(log)
    assert _allocated(active) < os.stat(active).st_size + 3 * 4096
    assert [(r.offset, r.value) for r in all_records(log)] == stored
    log.append(batch, 0)  # the reopened active segment reserves again and goes on
    flush(log)
    assert [(r.offset, r.value) for r in all_records(log)][:-10] == stored
    assert _allocated(active) > os.stat(active).st_size + (512 << 10)
    log.close()


def test_a_failed_write_gives_the_reservation_back(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    log = ChannelLog.open(tmp_path / "ch", BIG, 0)
    log.append(make_batch(1), 0)
    import kmqkafka.store.log as log_module

    def broken(fd: int, head: bytes, batch: memoryview) -> None:
        os.write(fd, bytes(batch[:10]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(log_module, "write_batch_at_offset", broken)
    size = log.size_bytes
    with pytest.raises(OSError):
        log.append(make_batch(3), 0)
    [seg] = segment_files(tmp_path / "ch")
    assert os.stat(seg).st_size == size
    assert _allocated(seg) <= size + 4096
    monkeypatch.undo()
    assert log.append(make_batch(1), 0) == (2, 2)
    flush(log)
    assert [r.offset for r in all_records(log)] == [0, 1]
    log.close()
