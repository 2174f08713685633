"""Snapshot and restore of the whole state machine: exactly the state at snapshot time."""

import pytest
from twisted.internet.task import Clock

from kmqkafka.records import NewRecord, build_batch, iter_records
from kmqkafka.store.errors import StoreError
from kmqkafka.store.store import ChannelStore


def fired(d, clock):
    out = []
    d.addBoth(out.append)
    clock.advance(0)
    assert out
    if hasattr(out[0], "raiseException"):
        out[0].raiseException()
    return out[0]


def values(store, name):
    res = store.read(name, store.bounds(name).log_start, 1 << 24)
    return [r.value for b in res.batches for r in iter_records(b)]


def test_restore_brings_back_exactly_the_snapshotted_state(tmp_path):
    clock = Clock()
    clock.advance(1000)
    store = ChannelStore(tmp_path / "a", clock, threaded_io=False)
    store.start()
    fired(store.create_channel("kafka.t", config={"segment_bytes": 300}), clock)
    fired(store.create_channel("q", kind="queue"), clock)
    for i in range(20):  # several rolled segments plus an active one
        fired(store.append_batch("kafka.t", build_batch([NewRecord(value=b"%03d" % i * 20)],
                                                         now_ms=1)), clock)
    fired(store.queue_send("q", [NewRecord(value=b"m1"), NewRecord(value=b"m2")]), clock)
    fired(store.keyed_put("offsets", [(b"g", b"5")]), clock)
    snap = tmp_path / "snap"
    store.machine.snapshot(snap)
    applied = store.machine.last_applied
    before = values(store, "kafka.t")

    # Diverge after the snapshot: more data, a new channel, a changed key.
    fired(store.append_batch("kafka.t", build_batch([NewRecord(value=b"late")], now_ms=1)), clock)
    fired(store.create_channel("later"), clock)
    fired(store.keyed_put("offsets", [(b"g", b"9")]), clock)
    fired(store.queue_ack("q", [1]), clock)

    store.machine.restore(snap, clock.seconds() * 1000)
    assert store.machine.last_applied == applied
    assert values(store, "kafka.t") == before
    assert not store.exists("later")
    assert store.keyed_get("offsets", b"g") == b"5"
    got = fired(store.queue_receive("q", 10, 1000), clock)
    assert [m.record.value for m in got] == [b"m1", b"m2"]
    # The restored store keeps working and numbering continues densely.
    res = fired(store.append_batch("kafka.t", build_batch([NewRecord(value=b"next")], now_ms=1)), clock)
    assert res.first_sequence == len(before) + 1


def test_snapshot_refuses_unflushed_state(tmp_path):
    clock = Clock()
    store = ChannelStore(tmp_path / "a", clock, threaded_io=False)
    store.start()
    fired(store.create_channel("c"), clock)
    store.append_batch("c", build_batch([NewRecord(value=b"x")], now_ms=1))
    with pytest.raises(StoreError):
        store.machine.snapshot(tmp_path / "snap")


def test_large_active_segments_are_rolled_so_a_snapshot_links_rather_than_copies(tmp_path):
    """A snapshot copies each log's active segment; rolling the large ones first leaves it
    only hard links to make (and the restored state is the same)."""
    clock = Clock()
    clock.advance(1000)
    store = ChannelStore(tmp_path / "a", clock, threaded_io=False)
    store.start()
    fired(store.create_channel("kafka.big"), clock)
    fired(store.create_channel("kafka.small"), clock)
    for i in range(8):
        fired(store.append_batch("kafka.big", build_batch([NewRecord(value=bytes([i]) * 4096)],
                                                           now_ms=1)), clock)
    fired(store.append_batch("kafka.small", build_batch([NewRecord(value=b"s")], now_ms=1)),
          clock)
    machine = store.machine
    assert machine.roll_for_snapshot(16 * 1024) == 1  # only the big one
    assert machine.channels["kafka.big"].active_bytes == 0
    fired(store.proposer.drain(), clock)                # the rolled segment's indexes
    before = values(store, "kafka.big")
    snap = tmp_path / "snap"
    machine.snapshot(snap)
    big = [p for p in (snap / "channels").rglob("*.log") if p.stat().st_size > 16 * 1024]
    assert big and all(p.stat().st_nlink >= 2 for p in big)  # linked, not copied
    fired(store.append_batch("kafka.big", build_batch([NewRecord(value=b"late")], now_ms=1)),
          clock)
    machine.restore(snap, clock.seconds() * 1000)
    assert values(store, "kafka.big") == before
    res = fired(store.append_batch("kafka.big", build_batch([NewRecord(value=b"n")], now_ms=1)),
                clock)
    assert res.first_sequence == 9
