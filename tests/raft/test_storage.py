"""DiskStorage: what a Ready persisted is what a restart finds; torn tails are cut off."""
from __future__ import annotations

import os

from kmqkafka.raft import Entry, EntryKind, HardState, Ready, Snapshot, SnapshotMeta
from kmqkafka.raft.storage import DiskStorage


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
    before = st.wal_bytes
    st.compact(Snapshot(SnapshotMeta(7, 1, frozenset({1, 2, 3})), b"kmq-snapshot:7"))
    assert st.wal_bytes < before
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
