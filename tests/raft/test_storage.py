"""DiskStorage: what a Ready persisted is what a restart finds; torn tails are cut off."""
from __future__ import annotations

import os

import pytest

from kmqkafka.raft import Entry, EntryKind, HardState, Ready, Snapshot, SnapshotMeta
from kmqkafka.raft.messages import Stored, loaded
from kmqkafka.raft.storage import CorruptLog, DiskStorage


def ents(first: int, last: int, term: int = 1) -> tuple[Entry, ...]:
    return tuple(Entry(i, term, EntryKind.NORMAL, b"cmd%d" % i) for i in range(first, last + 1))


def reopen(st: DiskStorage) -> DiskStorage:
    st.close()
    return DiskStorage.open(st.directory)


def test_entries_and_hard_state_survive_a_restart(tmp_path):
    st = DiskStorage.open(tmp_path / "raft")
    st.save(Ready(hard_state=HardState(1, 2, 0), entries=ents(1, 5)))
    st.save(Ready(hard_state=HardState(1, 2, 4)))
    st = reopen(st)
    assert st.hard_state == HardState(1, 2, 4)
    assert [e.index for e in st.entries] == [1, 2, 3, 4, 5]
    assert st.entries[2].data == b"cmd3"


def test_entries_overwrite_from_their_first_index(tmp_path):
    st = DiskStorage.open(tmp_path / "raft")
    st.save(Ready(entries=ents(1, 5, term=1)))
    st.save(Ready(entries=ents(3, 4, term=2), hard_state=HardState(2, None, 2)))
    for s in (st, reopen(st)):
        assert [(e.index, e.term) for e in s.entries] == [(1, 1), (2, 1), (3, 2), (4, 2)]


def test_a_torn_tail_is_cut_and_the_rest_kept(tmp_path):
    st = DiskStorage.open(tmp_path / "raft")
    st.save(Ready(entries=ents(1, 3), hard_state=HardState(1, 1, 3)))
    good = st.wal_bytes
    st.save(Ready(entries=ents(4, 4)))
    st.close()
    with open(st.path, "r+b") as f:  # the last record is half written
        f.truncate(good + 10)
    st = DiskStorage.open(st.directory)
    assert [e.index for e in st.entries] == [1, 2, 3]
    assert st.truncated_bytes == 10
    assert os.path.getsize(st.path) == good
    # A corrupt byte in the last record is treated the same way.
    st.save(Ready(entries=ents(4, 4)))
    st.close()
    with open(st.path, "r+b") as f:
        f.seek(good + 20)
        f.write(b"\xff")
    st = DiskStorage.open(st.directory)
    assert [e.index for e in st.entries] == [1, 2, 3]


def test_compaction_drops_covered_entries_and_keeps_the_snapshot(tmp_path):
    st = DiskStorage.open(tmp_path / "raft")
    st.save(Ready(entries=ents(1, 10), hard_state=HardState(1, 1, 10)))
    st.compact(Snapshot(SnapshotMeta(7, 1, frozenset({1, 2, 3})), b"kmq-snapshot:7"))
    assert [e.index for e in st.entries] == [8, 9, 10]
    st.save(Ready(entries=ents(11, 12)))
    st = reopen(st)
    assert st.snapshot.meta == SnapshotMeta(7, 1, frozenset({1, 2, 3}))
    assert st.snapshot.data == b"kmq-snapshot:7"
    assert [e.index for e in st.entries] == [8, 9, 10, 11, 12]
    assert st.hard_state.commit == 10


def test_an_installed_snapshot_replaces_the_whole_log(tmp_path):
    st = DiskStorage.open(tmp_path / "raft")
    st.save(Ready(entries=ents(1, 3)))
    snap = Snapshot(SnapshotMeta(50, 4, frozenset({1, 2})), b"kmq-snapshot:50")
    st.save(Ready(snapshot=snap, hard_state=HardState(4, None, 50)))
    st.save(Ready(entries=ents(51, 52, term=4)))
    st = reopen(st)
    assert st.snapshot == snap
    assert [e.index for e in st.entries] == [51, 52]
    assert st.hard_state == HardState(4, None, 50)


def test_compaction_deletes_whole_covered_files_without_rewriting(tmp_path):
    """Files roll at roll_bytes; a compaction deletes the files it covers entirely, and a
    restart finds the log starting right after the snapshot (the gap is covered)."""
    st = DiskStorage.open(tmp_path / "raft", roll_bytes=200)
    for i in range(1, 31, 3):
        st.save(Ready(entries=ents(i, i + 2), hard_state=HardState(1, 1, i + 2)))
    assert st.file_count > 3
    before = st.wal_bytes
    snap = Snapshot(SnapshotMeta(25, 1, frozenset({1})), b"kmq-checkpoint:25")
    st.compact(snap)
    assert st.wal_bytes < before
    assert st.file_count <= 3
    st.save(Ready(entries=ents(31, 32)))
    for s in (st, reopen(st)):
        assert s.snapshot == snap
        assert [e.index for e in s.entries] == list(range(26, 33))
        assert s.entries[0].data == b"cmd26"
        assert s.hard_state == HardState(1, 1, 30)
    # Compacting again, past every entry, keeps the hard state (every file starts with it).
    st = reopen(st)
    st.compact(Snapshot(SnapshotMeta(32, 1, frozenset({1})), b"kmq-checkpoint:32"))
    st = reopen(st)
    assert st.entries == [] and st.first_index == 33
    assert st.hard_state == HardState(1, 1, 30)
    st.save(Ready(entries=ents(33, 33)))
    assert [e.index for e in reopen(st).entries] == [33]


def test_a_missing_file_in_the_middle_is_corruption(tmp_path):
    import pytest

    from kmqkafka.raft.storage import CorruptLog

    st = DiskStorage.open(tmp_path / "raft", roll_bytes=200)
    for i in range(1, 31, 3):
        st.save(Ready(entries=ents(i, i + 2), hard_state=HardState(1, 1, i + 2)))
    st.close()
    files = sorted(p for p in (tmp_path / "raft").iterdir() if p.name.startswith("wal."))
    files[0].unlink()  # no COMPACT record covers its entries
    with pytest.raises(CorruptLog):
        DiskStorage.open(tmp_path / "raft")


def test_large_entries_are_written_without_joining_them(tmp_path):
    st = DiskStorage.open(tmp_path / "raft")
    big = [Entry(i, 1, EntryKind.NORMAL, bytes([i]) * (3 << 20)) for i in (1, 2)]
    st.save(Ready(entries=tuple(big), hard_state=HardState(1, 1, 2)))
    st = reopen(st)
    assert [e.data for e in st.entries] == [e.data for e in big]


def test_freed_files_are_reused_and_their_old_records_are_never_read_back(tmp_path):
    """Compaction keeps covered files for reuse; a reused file's stale records (another salt)
    end recovery's read of that file like a torn tail would, never as entries."""
    st = DiskStorage.open(tmp_path / "raft", roll_bytes=300)
    for i in range(1, 41, 4):
        st.save(Ready(entries=ents(i, i + 3), hard_state=HardState(1, 1, i + 3)))
    st.compact(Snapshot(SnapshotMeta(36, 1, frozenset({1})), b"kmq-checkpoint:36"))
    free = sorted(p.name for p in (tmp_path / "raft").iterdir() if p.name.startswith("wal-free."))
    assert free
    # Newer, shorter entries overwrite the start of freed files; their old tails stay.
    for i in range(41, 61):
        st.save(Ready(entries=(Entry(i, 2, EntryKind.NORMAL, b"new%d" % i),),
                      hard_state=HardState(2, 1, i)))
    assert st.recycled > 0
    expect = [(e.index, e.term, e.data) for e in st.entries]
    assert expect[-1] == (60, 2, b"new60")
    for s in (st, reopen(st)):
        assert [(e.index, e.term, e.data) for e in s.entries] == expect
        assert s.hard_state == HardState(2, 1, 60)
    # A crash right after a reused file got its header: nothing stale comes back either.
    st = reopen(st)
    st._roll()
    st.close()
    s = DiskStorage.open(tmp_path / "raft", roll_bytes=300)
    assert [(e.index, e.term, e.data) for e in s.entries] == expect
    s.save(Ready(entries=(Entry(61, 2, EntryKind.NORMAL, b"x"),)))
    assert [e.index for e in reopen(s).entries][-2:] == [60, 61]


@pytest.mark.parametrize("keep", [1, 3, 20])
def test_compaction_keeps_at_most_keep_free_files_for_reuse(tmp_path, keep):
    st = DiskStorage.open(tmp_path / "raft", roll_bytes=200, keep_free=keep)
    for i in range(1, 61, 3):
        st.save(Ready(entries=ents(i, i + 2), hard_state=HardState(1, 1, i + 2)))
    covered = st.file_count  # all of them: compaction rolls first
    assert covered > 3
    st.compact(Snapshot(SnapshotMeta(60, 1, frozenset({1})), b"kmq-checkpoint:60"))
    free = [p for p in (tmp_path / "raft").iterdir() if p.name.startswith("wal-free.")]
    assert len(free) == min(keep, covered)
    assert st.file_count == 1


def test_a_free_file_not_yet_renamed_is_ignored(tmp_path):
    st = DiskStorage.open(tmp_path / "raft", roll_bytes=200)
    for i in range(1, 31, 3):
        st.save(Ready(entries=ents(i, i + 2), hard_state=HardState(1, 1, i + 2)))
    st.compact(Snapshot(SnapshotMeta(30, 1, frozenset({1})), b"kmq-checkpoint:30"))
    st.close()
    s = DiskStorage.open(tmp_path / "raft", roll_bytes=200)
    assert s.entries == [] and s.first_index == 31
    assert s._free  # kept for reuse across restarts


def _big(first: int, last: int, term: int = 1, size: int = 200) -> tuple[Entry, ...]:
    return tuple(Entry(i, term, EntryKind.NORMAL, bytes([i % 251]) * size)
                 for i in range(first, last + 1))


def test_written_entries_are_held_as_references_to_the_file(tmp_path):
    """Saved data of more than a few bytes is not kept in memory: the storage holds ``Stored``
    references (read back on demand), before and after a restart; tiny data stays inline."""
    st = DiskStorage.open(tmp_path / "raft")
    big = _big(1, 3)
    st.save(Ready(entries=big + (Entry(4, 1, EntryKind.NORMAL, b"tiny"),),
                  hard_state=HardState(1, 1, 4)))
    for s in (st, reopen(st)):
        assert [type(e.data) for e in s.entries] == [Stored, Stored, Stored, bytes]
        assert [bytes(e.data) for e in s.entries[:3]] == [e.data for e in big]
        assert s.entries[3].data == b"tiny"
        assert [e.index for e in s.stored_entries(2, 9)] == [2, 3]
        assert type(loaded(s.entries[0]).data) is not Stored
        assert bytes(loaded(s.entries[0]).data) == big[0].data


def test_a_stored_entry_whose_file_was_reused_is_refused_not_misread(tmp_path):
    """Compaction frees a file only once the core dropped its entries; should a reference
    outlive that anyway, reading it fails loudly rather than return another record's bytes."""
    st = DiskStorage.open(tmp_path / "raft", roll_bytes=600)
    for i in range(1, 21, 2):
        st.save(Ready(entries=_big(i, i + 1), hard_state=HardState(1, 1, i + 1)))
    stale = st.entries[0].data
    live = st.entries[-1]
    st.compact(Snapshot(SnapshotMeta(18, 1, frozenset({1})), b"kmq-checkpoint:18"))
    for i in range(21, 41):
        st.save(Ready(entries=_big(i, i, term=2, size=300), hard_state=HardState(2, 1, i)))
    assert st.recycled > 0
    assert bytes(live.data) == _big(20, 20)[0].data  # a live entry still reads back
    with pytest.raises(CorruptLog):
        stale.load()


def test_a_vote_for_node_0_survives_a_restart_and_old_records_still_read(tmp_path):
    """Node ids start at 0 as Kafka's do, so a vote for node 0 is a vote, not "none"; the
    records older versions wrote (vote 0 meaning none) keep their meaning."""
    from kmqkafka.raft import storage as wal

    st = DiskStorage.open(tmp_path / "raft")
    st.save(Ready(hard_state=HardState(3, 0, 0)))
    assert reopen(st).hard_state == HardState(3, 0, 0)
    st = reopen(st)
    st.save(Ready(hard_state=HardState(4, None, 0)))
    assert reopen(st).hard_state == HardState(4, None, 0)
    st = reopen(st)
    legacy = wal._frame(wal._HARD.pack(wal.T_HARD, 5, 0, 0), st._files[-1].seed)
    st._write([legacy])
    assert reopen(st).hard_state == HardState(5, None, 0)


def test_prepared_free_files_are_what_the_first_rolls_reuse(tmp_path, monkeypatch):
    """A fresh log prepares its free files a step at a time (zeros, full size); the first rolls
    then reuse them, and the zeros behind the records stop recovery like any torn tail."""
    from kmqkafka.raft import storage as storage_module

    monkeypatch.setattr(storage_module, "PREPARE_STEP", 128)
    st = DiskStorage.open(tmp_path / "raft", roll_bytes=300, keep_free=5)
    steps = 1
    while st.prepare_free():
        steps += 1
        assert steps < 100
    assert steps == 5 * 3  # 300 bytes in steps of 128
    free = sorted(p.name for p in (tmp_path / "raft").iterdir() if p.name.startswith("wal-free"))
    assert free == [f"wal-free.new-{n}" for n in range(1, 5 + 1)]
    assert all((tmp_path / "raft" / n).stat().st_size == 300 for n in free)
    assert not st.prepare_free()  # enough of them
    for i in range(1, 31, 3):
        st.save(Ready(entries=ents(i, i + 2), hard_state=HardState(1, 1, i + 2)))
    assert st.recycled >= 3
    again = reopen(st)
    assert [e.index for e in again.entries] == list(range(1, 31))
    assert again.hard_state == HardState(1, 1, 30)


def test_a_free_file_cut_short_by_a_crash_is_removed_at_open(tmp_path, monkeypatch):
    from kmqkafka.raft import storage as storage_module

    monkeypatch.setattr(storage_module, "PREPARE_STEP", 128)
    st = DiskStorage.open(tmp_path / "raft", roll_bytes=300)
    assert st.prepare_free()  # one step of the first file: a part file
    assert (tmp_path / "raft" / "wal-free.part").exists()
    st.close()
    st = DiskStorage.open(tmp_path / "raft", roll_bytes=300)
    assert not (tmp_path / "raft" / "wal-free.part").exists() and st._free == []
