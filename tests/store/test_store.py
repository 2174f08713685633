"""The ChannelStore facade: group commit, reads, waiters, reservation, restart — on a fake clock."""

import pytest
from twisted.internet.task import Clock

from kmqkafka.records import NewRecord, build_batch, iter_records, read_header
from kmqkafka.store.errors import ChannelExists, ChannelNotFound, OffsetOutOfRange, ReservedChannel
from kmqkafka.store.store import ChannelStore


def result_of(d, clock=None):
    out = []
    d.addBoth(out.append)
    if clock is not None:
        for _ in range(5):
            if out:
                break
            clock.advance(0)
    assert out, "deferred did not fire"
    if hasattr(out[0], "raiseException"):
        out[0].raiseException()
    return out[0]


@pytest.fixture
def clock():
    c = Clock()
    c.advance(1_700_000_000)
    return c


def open_store(tmp_path, clock):
    store = ChannelStore(tmp_path / "data", clock, threaded_io=False)
    result_of(store.start())
    return store


def batch(n, tag=b"v"):
    return build_batch([NewRecord(value=tag + str(i).encode(), key=b"k%d" % i) for i in range(n)],
                       now_ms=1_700_000_000_000)


def test_append_is_acknowledged_only_after_the_group_flush(tmp_path, clock):
    store = open_store(tmp_path, clock)
    result_of(store.create_channel("kafka.t"), clock)
    d = store.append_batch("kafka.t", batch(3))
    fired = []
    d.addCallback(fired.append)
    assert fired == []
    assert store.bounds("kafka.t").high_watermark == 1  # not visible before fsync
    clock.advance(0)
    assert fired[0].first_sequence == 1 and fired[0].last_sequence == 3
    assert store.bounds("kafka.t").high_watermark == 4


def test_appends_in_one_turn_share_one_fsync(tmp_path, clock):
    store = open_store(tmp_path, clock)
    result_of(store.create_channel("kafka.t"), clock)
    before = store._proposer.flush_count
    ds = [store.append_batch("kafka.t", batch(2)) for _ in range(50)]
    clock.advance(0)
    results = [result_of(d) for d in ds]
    assert store._proposer.flush_count == before + 1
    assert [r.first_sequence for r in results] == list(range(1, 101, 2))


def test_read_returns_stored_bytes_with_only_base_offset_changed(tmp_path, clock):
    store = open_store(tmp_path, clock)
    result_of(store.create_channel("kafka.t"), clock)
    sent = [batch(2, b"a"), batch(3, b"b")]
    for b in sent:
        result_of(store.append_batch("kafka.t", b), clock)
    res = store.read("kafka.t", 1, 1 << 20)
    got = [bytes(b) for b in res.batches]
    assert [g[8:] for g in got] == [s[8:] for s in sent]
    assert [read_header(g).base_offset for g in got] == [0, 2]
    values = [r.value for g in got for r in iter_records(g)]
    assert values == [b"a0", b"a1", b"b0", b"b1", b"b2"]
    with pytest.raises(OffsetOutOfRange):
        store.read("kafka.t", 7, 100)


def test_reserved_channels_are_closed_to_clients(tmp_path, clock):
    store = open_store(tmp_path, clock)
    for d in (store.create_channel("_kafka.offsets.0"), store.append_batch("_kafka.x", batch(1)),
              store.delete_channel("_kafka.groups.1")):
        with pytest.raises(ReservedChannel, match="reserved for internal use"):
            result_of(d, clock)
    with pytest.raises(ReservedChannel):
        store.read("_kafka.offsets.0", 1, 10)
    assert all(not n.startswith("_kafka.") for n in store.list_channels())


def test_create_twice_and_missing_channel_errors(tmp_path, clock):
    store = open_store(tmp_path, clock)
    assert result_of(store.create_channel("a"), clock) is True
    with pytest.raises(ChannelExists):
        result_of(store.create_channel("a"), clock)
    assert result_of(store.create_channel("a", exist_ok=True), clock) is False
    with pytest.raises(ChannelNotFound):
        result_of(store.append_batch("nope", batch(1)), clock)
    assert result_of(store.delete_channel("a"), clock) is True
    assert not store.exists("a")


def test_waiter_wakes_when_flushed_data_arrives(tmp_path, clock):
    store = open_store(tmp_path, clock)
    result_of(store.create_channel("kafka.t"), clock)
    woke = []
    store.wait_for("kafka.t", 1, 5.0).addCallback(woke.append)
    store.append_batch("kafka.t", batch(1))
    assert woke == []
    clock.advance(0)
    assert woke == [True]
    late = []
    store.wait_for("kafka.t", 2, 0.5).addCallback(late.append)
    clock.advance(0.6)
    assert late == [False]


def test_everything_survives_a_restart(tmp_path, clock):
    store = open_store(tmp_path, clock)
    result_of(store.create_channel("kafka.t", config={"retention_ms": 12345}), clock)
    result_of(store.append_batch("kafka.t", batch(4)), clock)
    result_of(store.keyed_put("offsets", [(b"g1", b"42"), (b"g2", b"7")]), clock)
    result_of(store.keyed_put("offsets", [(b"g2", None)]), clock)
    result_of(store.stop(), clock)
    again = open_store(tmp_path, clock)
    assert again.bounds("kafka.t").high_watermark == 5
    assert again.config("kafka.t").retention_ms == 12345
    assert again.keyed_get("offsets", b"g1") == b"42"
    assert again.keyed_get("offsets", b"g2") is None
    res = again.read("kafka.t", 1, 1 << 20)
    assert [r.value for b in res.batches for r in iter_records(b)] == [b"v0", b"v1", b"v2", b"v3"]


def test_the_cut_at_start_up_leaves_an_empty_segment_at_the_checkpoint_alone(tmp_path, clock):
    """An empty channel's segment starts at its checkpoint: start-up's cut keeps it rather than
    remove and recreate it (four fsyncs per channel: 1.4 ms each at 2,500 channels). Data past
    the checkpoint is still cut, and the channel takes appends at the right offsets."""
    import os

    from kmqkafka.store import checkpoint

    store = open_store(tmp_path, clock)
    result_of(store.create_channel("kafka.empty"), clock)
    result_of(store.create_channel("kafka.full"), clock)
    result_of(store.append_batch("kafka.full", batch(3)), clock)
    result_of(store.append_batch("kafka.full", batch(2)), clock)
    result_of(store.stop(), clock)
    channels = tmp_path / "data" / "channels"
    empty = next(p for p in channels.iterdir() if "empty" in p.name)
    full = next(p for p in channels.iterdir() if "full" in p.name)
    before = {p.name: os.stat(p).st_ino for p in empty.iterdir()}
    assert [n for n in before if n.endswith(".log")]
    assert checkpoint.truncate_tail(empty, 1) == 0
    assert {p.name: os.stat(p).st_ino for p in empty.iterdir()} == before
    assert checkpoint.truncate_tail(full, 4) > 0  # the second batch was past the cut
    again = open_store(tmp_path, clock)
    result_of(again.append_batch("kafka.empty", batch(2)), clock)
    result_of(again.append_batch("kafka.full", batch(1)), clock)
    assert again.bounds("kafka.empty").high_watermark == 3
    assert again.bounds("kafka.full").high_watermark == 5
    res = again.read("kafka.empty", 1, 1 << 20)
    assert [r.value for b in res.batches for r in iter_records(b)] == [b"v0", b"v1"]


def test_truncate_prefix_moves_log_start(tmp_path, clock):
    store = open_store(tmp_path, clock)
    result_of(store.create_channel("kafka.t"), clock)
    for _ in range(3):
        result_of(store.append_batch("kafka.t", batch(2)), clock)
    assert result_of(store.truncate_prefix("kafka.t", 3), clock) == 3
    assert store.bounds("kafka.t").log_start == 3
    with pytest.raises(OffsetOutOfRange):
        store.read("kafka.t", 2, 100)


def test_queue_through_the_store(tmp_path, clock):
    store = open_store(tmp_path, clock)
    result_of(store.create_channel("q1", kind="queue"), clock)
    seqs = result_of(store.queue_send("q1", [NewRecord(value=b"m%d" % i) for i in range(3)]), clock)
    assert seqs == [1, 2, 3]
    got = result_of(store.queue_receive("q1", 2, 1000), clock)
    assert [m.record.value for m in got] == [b"m0", b"m1"]
    assert result_of(store.queue_ack("q1", [got[0].sequence]), clock) == [1]
    clock.advance(1.5)  # m1's visibility expires; the expiry loop makes it visible again
    again = result_of(store.queue_receive("q1", 5, 1000), clock)
    assert [(m.record.value, m.delivery_count) for m in again] == [(b"m1", 2), (b"m2", 1)]


def test_stop_makes_unacknowledged_acks1_writes_durable(tmp_path, clock):
    store = open_store(tmp_path, clock)
    result_of(store.create_channel("kafka.t"), clock)
    result_of(store.append_batch("kafka.t", batch(2), durable=False))
    result_of(store.stop(), clock)
    again = open_store(tmp_path, clock)
    assert again.bounds("kafka.t").high_watermark == 3


def test_keyed_compare_and_set_applies_a_batch_only_when_the_key_matches(tmp_path, clock):
    from kmqkafka.store import commands as c
    from kmqkafka.store.errors import KeyConflict

    store = open_store(tmp_path, clock)
    first = c.Batch((c.KeyedPut("config", ((b"topic:t", b"v1"),), 0, expect=((b"topic:t", None),)),
                     c.CreateChannel("kafka.t", exist_ok=True)))
    result_of(store.propose(first), clock)
    # A second creator that decided on stale state: nothing of its batch may apply.
    stale = c.Batch((c.KeyedPut("config", ((b"topic:t", b"v2"),), 0, expect=((b"topic:t", None),)),
                     c.CreateChannel("kafka.t~1", exist_ok=True)))
    with pytest.raises(KeyConflict):
        result_of(store.propose(stale), clock)
    assert store.keyed_get("config", b"topic:t") == b"v1"
    assert not store.exists("kafka.t~1")
    update = c.KeyedPut("config", ((b"topic:t", b"v3"),), 0, expect=((b"topic:t", b"v1"),))
    result_of(store.propose(update), clock)
    assert store.keyed_get("config", b"topic:t") == b"v3"


def test_keyed_compare_and_set_is_idempotent_for_its_own_replay(tmp_path, clock):
    """Replaying a catalog write after a crash (its value already there) must still apply
    the rest of its batch: coordinator logs are not cut back to the applied checkpoint."""
    from kmqkafka.store import commands as c

    store = open_store(tmp_path, clock)
    create = c.Batch((c.KeyedPut("config", ((b"topic:t", b"v1"),), 0, expect=((b"topic:t", None),)),
                      c.CreateChannel("kafka.t", exist_ok=True)))
    result_of(store.propose(create), clock)
    result_of(store.propose(c.DeleteChannel("kafka.t")), clock)  # as if cut back by recovery
    result_of(store.propose(create), clock)
    assert store.exists("kafka.t")


def test_a_refused_disk_write_fails_that_append_only(tmp_path, clock, monkeypatch):
    """ENOSPC while writing a batch: that append fails with StorageFailure (Kafka's
    KAFKA_STORAGE_ERROR), nothing of it is stored, and the next one continues densely."""
    import errno

    from kmqkafka.store import log as log_module
    from kmqkafka.store.errors import StorageFailure

    store = open_store(tmp_path, clock)
    result_of(store.create_channel("kafka.t"), clock)
    assert result_of(store.append_batch("kafka.t", batch(2)), clock).last_sequence == 2
    real = log_module.write_batch_at_offset

    def full(fd, base_offset, buf):
        real(fd, base_offset, buf[: len(buf) // 2])  # a short write, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(log_module, "write_batch_at_offset", full)
    with pytest.raises(StorageFailure, match="No space left"):
        result_of(store.append_batch("kafka.t", batch(3)), clock)
    monkeypatch.setattr(log_module, "write_batch_at_offset", real)
    after = result_of(store.append_batch("kafka.t", batch(1, tag=b"after")), clock)
    assert (after.first_sequence, after.last_sequence) == (3, 3)
    store.stop()
    reopened = open_store(tmp_path, clock)
    stored = [r.value for b in reopened.read("kafka.t", 1, 1 << 20).batches
              for r in iter_records(b)]
    assert stored == [b"v0", b"v1", b"after0"]


def test_a_failed_fsync_refuses_later_writes_and_marks_the_store_failed(tmp_path, clock,
                                                                         monkeypatch):
    import errno
    import os

    from kmqkafka.store.errors import StorageFailure, StoreError

    store = open_store(tmp_path, clock)
    result_of(store.create_channel("kafka.t"), clock)
    assert not store.failed

    def broken(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken)
    with pytest.raises(StoreError, match="fsync failed"):
        result_of(store.append_batch("kafka.t", batch(1)), clock)
    monkeypatch.undo()
    assert store.failed
    with pytest.raises(StorageFailure, match="until the daemon restarts"):
        result_of(store.append_batch("kafka.t", batch(1)), clock)


def test_a_failed_background_round_does_not_stop_the_task(tmp_path, clock):
    """A retention round that fails (a cluster node without a Raft leader for a while) is
    logged; the task runs again next interval rather than never again."""
    store = ChannelStore(tmp_path / "data", clock, threaded_io=False, retention_interval_s=1)
    rounds: list[int] = []

    def flaky():
        rounds.append(1)
        if len(rounds) == 1:
            raise RuntimeError("no raft leader within 10.0s")

    store.enforce_retention = flaky
    result_of(store.start())
    for _ in range(3):
        clock.advance(1)
    assert len(rounds) == 3


def test_channel_names_past_name_max_get_shortened_directories(tmp_path, clock):
    """A channel name may be 512 characters; a directory name at most 255 bytes, less room
    for ``.deleted-N``. Long names get a shortened directory that records the name, and live
    through a restart and a delete."""
    from kmqkafka.store.names import DIR_NAME_MAX, dir_name, is_shortened

    long_name = "kafka." + "t" * 249 + "~13"
    native = "n" * 300 + "%/é"[0]
    store = open_store(tmp_path, clock)
    for name in (long_name, native):
        result_of(store.create_channel(name), clock)
        result_of(store.append_batch(name, batch(2)), clock)
    dirs = sorted(p.name for p in (tmp_path / "data" / "channels").iterdir())
    assert all(len(d.encode()) <= DIR_NAME_MAX for d in dirs)
    assert dir_name(long_name) in dirs and is_shortened(dir_name(long_name))
    result_of(store.stop(), clock)
    again = open_store(tmp_path, clock)
    assert again.bounds(long_name).high_watermark == 3
    assert again.bounds(native).high_watermark == 3
    result_of(again.delete_channel(long_name), clock)
    result_of(again.append_batch(native, batch(1)), clock)  # the store still takes writes
    with pytest.raises(ChannelNotFound):
        again.bounds(long_name)


def test_a_directory_named_whole_by_an_older_version_is_renamed_on_start(tmp_path, clock):
    """Before shortening, names up to NAME_MAX were kept whole (and could not be deleted):
    such a directory moves to today's name at start-up, with its data."""
    from kmqkafka.store.names import dir_name

    name = "kafka." + "o" * 240
    store = open_store(tmp_path, clock)
    result_of(store.create_channel(name), clock)
    result_of(store.append_batch(name, batch(3)), clock)
    result_of(store.stop(), clock)
    channels = tmp_path / "data" / "channels"
    (channels / dir_name(name)).rename(channels / name)   # the old layout
    (channels / name / "name").unlink()
    again = open_store(tmp_path, clock)
    assert (channels / dir_name(name)).is_dir() and not (channels / name).exists()
    assert again.bounds(name).high_watermark == 4
    result_of(again.delete_channel(name), clock)


def test_a_checkpoint_lists_every_channel_only_in_its_full_records(tmp_path):
    """Group commits record the channels they touched; the map of every channel's end (one
    entry per partition) is built only for the full record the journal starts or rolls with."""
    from kmqkafka.store.checkpoint import CheckpointJournal

    journal = CheckpointJournal(tmp_path)
    built: list[int] = []

    def everything():
        built.append(1)
        return {"kafka.a": 5, "kafka.b": 9}

    first = journal.prepare(1, {"kafka.a": 5}, everything, {})
    journal.write(first)
    for applied in range(2, 50):
        journal.write(journal.prepare(applied, {"kafka.a": 5 + applied}, everything, {}))
    assert first.full and len(built) == 1


def test_a_compaction_pass_skips_compacted_channels_without_a_closed_segment(tmp_path, clock):
    """Each pass is a command through Raft: an empty (or one-segment) compacted channel never
    has anything to clean, so no pass is proposed for it."""
    store = open_store(tmp_path, clock)
    compact = {"cleanup_policy": "compact", "segment_bytes": 400}
    result_of(store.create_channel("kafka.idle", config=compact), clock)
    result_of(store.create_channel("kafka.busy", config=compact), clock)
    proposed: list = []
    original = store.propose
    store.propose = lambda cmd, **kw: proposed.append(type(cmd).__name__) or original(cmd, **kw)
    assert result_of(store.compact_all(), clock) == 0
    assert proposed == []
    for i in range(6):  # past 400 bytes: the first segment closes
        result_of(store.append_batch("kafka.busy", batch(3, tag=b"x%d" % i)), clock)
    proposed.clear()
    assert result_of(store.compact_all(), clock) == 1
    assert proposed.count("Compact") == 1


def test_a_config_change_is_written_by_its_flush_and_survives_a_restart(tmp_path, clock):
    """The apply changes the live config; config.json is rewritten by the group flush that
    acknowledges it (on the I/O thread), so a restart finds it."""
    store = open_store(tmp_path, clock)
    result_of(store.create_channel("kafka.t"), clock)
    path = next((tmp_path / "data" / "channels").glob("*/config.json"))
    before = path.read_bytes()
    d = store.set_config("kafka.t", {"retention_ms": 86_400_000})
    assert path.read_bytes() == before
    config = result_of(d, clock)
    assert config.retention_ms == 86_400_000
    assert path.read_bytes() != before
    store.stop()
    clock.advance(0)
    again = open_store(tmp_path, clock)
    assert again.machine.channel("kafka.t").config.retention_ms == 86_400_000
    again.stop()


def test_a_plan_made_by_another_nodes_compact_command_is_cleaned_here(tmp_path, clock):
    """Every node applies every node's Compact commands, but took the plans they made only
    when a Compact of its own came back: one this node never proposed again (the channel
    no longer qualified) kept its plan, and its fds, forever."""
    from kmqkafka.store import commands as c

    store = open_store(tmp_path, clock)
    result_of(store.create_channel("kafka.c", config={"cleanup_policy": "compact",
                                                      "segment_bytes": 400}), clock)
    for i in range(12):
        result_of(store.append_batch("kafka.c", batch(2, tag=b"x%d" % (i % 2))), clock)
    ch = store.machine.channel("kafka.c")

    def stored() -> int:
        res = store.read("kafka.c", 1, 1 << 20)
        return sum(1 for b in res.batches for _ in iter_records(b))

    assert stored() == 24
    assert result_of(store.propose(c.Compact("kafka.c", store.now_ms())), clock) is True
    result_of(store.set_config("kafka.c", {"cleanup_policy": "delete"}), clock)
    assert not ch.may_compact()  # so this node proposes no Compact of its own any more
    assert result_of(store.compact_all(), clock) == 1
    assert stored() < 24  # the waiting plan ran and was installed
    assert store.machine.take_compactions() == [] and not store._compacting
    store.stop()


def test_only_the_leader_proposes_compaction_passes(tmp_path, clock, monkeypatch):
    """Every node applies the leader's Compact commands and cleans the plans they make; a
    follower's own commands only multiplied them."""
    store = open_store(tmp_path, clock)
    result_of(store.create_channel("kafka.c", config={"cleanup_policy": "compact",
                                                      "segment_bytes": 400}), clock)
    for i in range(12):
        result_of(store.append_batch("kafka.c", batch(2, tag=b"x%d" % (i % 2))), clock)
    proposed: list = []
    original = store.propose
    store.propose = lambda cmd, **kw: proposed.append(type(cmd).__name__) or original(cmd, **kw)
    monkeypatch.setattr(store, "is_leader", lambda: False)
    assert result_of(store.compact_all(), clock) == 0 and proposed == []
    monkeypatch.setattr(store, "is_leader", lambda: True)
    assert result_of(store.compact_all(), clock) == 1 and proposed == ["Compact"]
    store.stop()


def test_settled_gives_up_by_cancelling_the_drivers_waiter(tmp_path, clock):
    """``settled`` (a follower behind its commit index answers Metadata after at most
    ``timeout_s``) gives up by cancelling the Raft driver's apply waiter, which takes it off
    the driver's list. It once fired the driver's Deferred itself: the later apply fired it
    again, raised AlreadyCalledError and the node stopped taking part for good; then it kept
    the waiter listed until the apply came."""
    from kmqkafka.raft.driver import RaftDriver

    class Driver:
        node = type("Node", (), {"applied_index": 5})()
        wait_applied = RaftDriver.wait_applied

        def __init__(self) -> None:
            self._applied_waiters: list = []

    class Behind:
        driver = Driver()
        applied_index, commit_index = 5, 9

    store = open_store(tmp_path, clock)
    store._proposer = Behind()
    out = []
    store.settled(1.0).addCallback(out.append)
    [(index, _theirs)] = Behind.driver._applied_waiters
    assert index == 9
    clock.advance(0.5)
    assert out == []
    clock.advance(0.5)
    assert out == [None]  # gave up after the timeout, without an error
    assert Behind.driver._applied_waiters == []  # and nothing is left for the apply to fire
    applied = []
    timers = len(clock.getDelayedCalls())
    store.settled(1.0).addCallback(applied.append)
    [(_, waiter)] = Behind.driver._applied_waiters
    assert len(clock.getDelayedCalls()) == timers + 1
    waiter.callback(None)  # the apply comes in time: answered at once, no timer left behind
    assert applied == [None] and len(clock.getDelayedCalls()) == timers
