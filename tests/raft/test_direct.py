"""O_DIRECT appends of the Raft log: the file holds exactly what was appended, whatever the
sizes, and a restart (clean or not) finds every entry."""
from __future__ import annotations

import errno
import os
import random

import pytest

from kmqkafka.raft import Entry, EntryKind, HardState, Ready
from kmqkafka.raft import direct
from kmqkafka.raft.direct import ALIGN, open_direct
from kmqkafka.raft.storage import DiskStorage


def _appender_or_skip(path, end=0):
    appender = open_direct(path, end)
    if appender is None:
        pytest.skip(f"the filesystem of {path} refuses O_DIRECT")
    return appender


def test_appends_of_any_size_land_byte_exact(tmp_path, monkeypatch):
    monkeypatch.setattr(direct, "CHUNK", 4 * ALIGN)  # cross the staging buffer's end often
    path = tmp_path / "log"
    path.write_bytes(b"head")
    appender = _appender_or_skip(path, 4)
    rng = random.Random(7)
    want = bytearray(b"head")
    for size in [0, 1, ALIGN - 5, ALIGN, 3 * ALIGN + 17, 4 * ALIGN, 9 * ALIGN + 1, 2, 5000]:
        pieces = [os.urandom(n) for n in _split(rng, size)]
        want += b"".join(pieces)
        assert appender.append(pieces) == len(want)
        data = path.read_bytes()
        assert data[:len(want)] == want
        assert data[len(want):] == bytes(len(data) - len(want))  # only the padding after it
        assert len(data) % ALIGN == 0 or len(data) == len(want)
    appender.close()


def test_page_cache_writes_between_direct_ones_are_kept(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"")
    appender = _appender_or_skip(path)
    fd = os.open(path, os.O_RDWR)
    rng = random.Random(3)
    want = bytearray()
    for i in range(40):
        pieces = [os.urandom(n) for n in _split(rng, rng.choice([0, 7, 300, ALIGN + 9, 9000]))]
        if i % 3:
            appender.append(pieces)
        else:  # the caller writes itself, then tells the appender
            os.pwrite(fd, b"".join(pieces), len(want))
            appender.wrote(pieces)
        want += b"".join(pieces)
        assert appender.end == len(want)
        assert path.read_bytes()[:len(want)] == want
    os.close(fd)
    appender.close()


def _direct_storage_or_skip(path):
    st = DiskStorage.open(path)
    if st._direct is None:
        pytest.skip(f"the filesystem of {path} refuses O_DIRECT")
    return st


def _split(rng: random.Random, size: int) -> list[int]:
    cuts = sorted(rng.randrange(size + 1) for _ in range(3))
    bounds = [0, *cuts, size]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def ents(first, last, size=300):
    return tuple(Entry(i, 1, EntryKind.NORMAL, bytes([i % 251]) * size)
                 for i in range(first, last + 1))


def test_a_restart_after_a_crash_finds_every_entry_and_cuts_the_padding(tmp_path):
    st = _direct_storage_or_skip(tmp_path / "raft")
    for first in range(1, 60, 7):
        st.save(Ready(hard_state=HardState(1, 1, first), entries=ents(first, first + 6)))
    logical = st.wal_bytes
    assert os.path.getsize(st.path) % ALIGN == 0 and os.path.getsize(st.path) > logical
    # No close(): as after kill -9, the zeros of the last block are still there.
    again = DiskStorage.open(tmp_path / "raft")
    assert [e.index for e in again.entries] == list(range(1, 64))
    assert all(bytes(e.data.load()) == bytes([e.index % 251]) * 300 for e in again.entries)
    assert again.wal_bytes == logical
    again.save(Ready(entries=ents(64, 64)))
    again.close()
    assert os.path.getsize(again.path) == again.wal_bytes  # a clean close leaves no padding
    last = DiskStorage.open(tmp_path / "raft")
    assert [e.index for e in last.entries] == list(range(1, 65))
    assert last.truncated_bytes == 0


def test_a_refused_direct_write_falls_back_to_the_page_cache(tmp_path, monkeypatch):
    st = _direct_storage_or_skip(tmp_path / "raft")
    st.save(Ready(entries=ents(1, 3)))

    def refuse(self, pieces):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(direct.DirectAppender, "append", refuse)
    st.save(Ready(entries=ents(4, 6), hard_state=HardState(1, 1, 6)))
    assert st._direct is None and not st.direct_writes
    st.close()
    again = DiskStorage.open(tmp_path / "raft")
    assert [e.index for e in again.entries] == [1, 2, 3, 4, 5, 6]
    assert again.hard_state == HardState(1, 1, 6)


def test_other_write_errors_are_raised(tmp_path, monkeypatch):
    st = _direct_storage_or_skip(tmp_path / "raft")

    def full(self, pieces):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(direct.DirectAppender, "append", full)
    with pytest.raises(OSError) as info:
        st.save(Ready(entries=ents(1, 1)))
    assert info.value.errno == errno.ENOSPC


def test_a_stale_cached_block_is_dropped_and_read_again(tmp_path, monkeypatch):
    """A read that raced a direct write of its block may find the block's older bytes in the
    page cache; the reader drops them and reads the disk before calling the log damaged."""
    from kmqkafka.raft import storage as storage_mod

    st = DiskStorage.open(tmp_path / "raft")
    st.save(Ready(entries=ents(1, 2)))
    stored = st.entries[1].data
    real = storage_mod._Reader._read_into
    calls = []

    def stale_once(self, buf, at):
        calls.append(at)
        if len(calls) == 1:
            buf[-1] ^= 0xFF  # what a stale page would hand back
            return False
        return real(self, buf, at)

    dropped = []
    monkeypatch.setattr(storage_mod._Reader, "_read_into", stale_once)
    monkeypatch.setattr(storage_mod.os, "posix_fadvise",
                        lambda fd, at, n, advice: dropped.append((at, n, advice)))
    assert bytes(stored.load()) == bytes([2]) * 300
    assert len(calls) == 2 and dropped and dropped[0][2] == os.POSIX_FADV_DONTNEED
