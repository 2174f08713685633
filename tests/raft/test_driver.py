"""Three store nodes with Raft drivers on one fake clock and an in-memory network.

Scenario scripts: a leader is elected, commands proposed on the leader are applied on every
node with the same Sequences, results come back to the proposer, a follower forwards to the
leader, a crashed leader is replaced and catches up after restart (replaying its Raft log past
its applied-index checkpoint without applying twice), no leader means a clean NoLeaderError,
and a follower that fell behind a compacted log is caught up by a snapshot.
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock, deferLater

from kmqkafka.raft.errors import NoLeaderError, NotLeaderError, TransportError
from kmqkafka.raft.messages import ELIDED, InstallSnapshot, Snapshot, SnapshotMeta, Stored
from kmqkafka.raft.proposer import Member, RaftProposer
from kmqkafka.records import NewRecord, build_batch, iter_records
from kmqkafka.store.errors import ChannelExists, StoreStopped
from kmqkafka.store.store import ChannelStore
from tests.raft.fakes import Network

TICK = 0.1


class Cluster:
    def __init__(self, tmp_path: Path, n: int = 3, seed: int = 7, **raft: object) -> None:
        self.tmp = tmp_path
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.net = Network(self.clock)
        self.ids = list(range(1, n + 1))
        self.members = {i: Member(i, "127.0.0.1", 0, "127.0.0.1", 9092 + i) for i in self.ids}
        self.seed = seed
        self.raft = raft
        self.stores: dict[int, ChannelStore] = {}
        self.started: dict[int, object] = {}
        for i in self.ids:
            self.boot(i)

    def boot(self, i: int) -> None:
        transport = self.net.transport(i)
        rng = random.Random(self.seed * 100 + i + len(self.started))

        def factory(machine, reactor, run_io):
            return RaftProposer(machine, reactor, run_io, node_id=i, members=self.members,
                                transport=transport, raft_dir=self.tmp / f"n{i}" / "raft",
                                rng=rng, tick_s=TICK, **self.raft)

        store = ChannelStore(self.tmp / f"n{i}", self.clock, threaded_io=False,
                             proposer_factory=factory)
        self.stores[i] = store
        out: list = []
        store.start().addBoth(out.append)
        self.started[i] = out

    def crash(self, i: int) -> None:
        """Lose the process: no flush, no clean stop; files stay as written."""
        store = self.stores.pop(i)
        p = store.proposer
        p._stopped = True
        p.driver._stopped = True
        if p.driver._ticker.running:
            p.driver._ticker.stop()
        for loop in store._loops:
            if loop.running:
                loop.stop()
        self.net.nodes[i].receiver = None
        p.storage.close()
        store.machine.close()

    def run(self, seconds: float = 0.0) -> None:
        for _ in range(5):
            self.clock.advance(0)
        steps = int(round(seconds / TICK))
        for _ in range(steps):
            self.clock.advance(TICK)
            for _ in range(5):
                self.clock.advance(0)

    def leader(self) -> int | None:
        leaders = [i for i, s in self.stores.items() if s.is_leader()]
        assert len(leaders) <= 1
        return leaders[0] if leaders else None

    def wait_leader(self, seconds: float = 10.0) -> int:
        for _ in range(int(seconds / TICK)):
            self.run(TICK)
            if self.leader() is not None:
                return self.leader()
        raise AssertionError("no leader elected")

    def result(self, d, seconds: float = 5.0):
        out: list = []
        d.addBoth(out.append)
        for _ in range(int(seconds / TICK)):
            if out:
                break
            self.run(TICK)
        assert out, "proposal did not complete"
        if hasattr(out[0], "raiseException"):
            out[0].raiseException()
        return out[0]


def batch(*values: bytes) -> bytes:
    return build_batch([NewRecord(value=v) for v in values], now_ms=1)


def values(store: ChannelStore, name: str) -> list[bytes]:
    b = store.bounds(name)
    if b.high_watermark <= b.log_start:
        return []
    res = store.read(name, b.log_start, 1 << 24)
    return [r.value for x in res.batches for r in iter_records(x)]


def test_a_leader_is_elected_and_commands_replicate_with_the_same_sequences(tmp_path):
    cl = Cluster(tmp_path)
    leader = cl.wait_leader()
    assert all(s.leader_id() == leader for s in cl.stores.values())
    ls = cl.stores[leader]
    assert cl.result(ls.create_channel("kafka.t")) is True
    results = [cl.result(ls.append_batch("kafka.t", batch(b"a%d" % i, b"b%d" % i)))
               for i in range(5)]
    assert [(r.first_sequence, r.last_sequence) for r in results] == [
        (1, 2), (3, 4), (5, 6), (7, 8), (9, 10)]
    cl.run(1.0)
    expect = [v for i in range(5) for v in (b"a%d" % i, b"b%d" % i)]
    for s in cl.stores.values():
        assert values(s, "kafka.t") == expect
        assert s.bounds("kafka.t").high_watermark == 11
    # Errors come back like LocalProposer's.
    with pytest.raises(ChannelExists):
        cl.result(ls.create_channel("kafka.t"))


def test_many_proposals_in_one_turn_share_few_raft_log_writes(tmp_path):
    cl = Cluster(tmp_path)
    ls = cl.stores[cl.wait_leader()]
    cl.result(ls.create_channel("c"))
    before = ls.proposer.driver.ready_count
    ds = [ls.append_batch("c", batch(b"%d" % i)) for i in range(200)]
    firsts = [cl.result(d).first_sequence for d in ds]
    assert firsts == list(range(1, 201))
    assert ls.proposer.driver.ready_count - before < 20


def test_a_follower_forwards_to_the_leader_and_gets_the_result(tmp_path):
    cl = Cluster(tmp_path)
    leader = cl.wait_leader()
    follower = next(i for i in cl.ids if i != leader)
    fs = cl.stores[follower]
    assert cl.result(fs.create_channel("kafka.f")) is True
    r = cl.result(fs.append_batch("kafka.f", batch(b"x", b"y", b"z")))
    assert (r.first_sequence, r.last_sequence) == (1, 3)
    # The follower answered from its own applied state: it can read what it acknowledged.
    assert values(fs, "kafka.f") == [b"x", b"y", b"z"]
    cl.run(0.5)
    assert values(cl.stores[leader], "kafka.f") == [b"x", b"y", b"z"]


def test_forwards_failing_at_once_share_one_retry_timer(tmp_path):
    """A dead leader refuses every forward at once. Each refusal scheduled a retry of every
    parked proposal, so N proposals made N^2 timers a round, then N^3: a follower spun at
    1.6 GB for a minute and its election timer starved."""
    cl = Cluster(tmp_path)
    leader = cl.wait_leader()
    follower = next(i for i in cl.ids if i != leader)
    fs = cl.stores[follower]
    assert cl.result(fs.create_channel("kafka.f")) is True
    cl.crash(leader)
    answers = [fs.append_batch("kafka.f", batch(b"%d" % i)) for i in range(20)]
    cl.run(TICK * 5)  # before the followers' election timeout
    assert len(cl.clock.getDelayedCalls()) < 100
    firsts = sorted(cl.result(d, seconds=10).first_sequence for d in answers)
    assert firsts == list(range(1, 21))


def test_a_member_whose_store_flush_failed_stops_taking_part(tmp_path):
    """A failed segment/checkpoint fsync makes the store refuse every write; such a member
    became leader anyway and held the cluster without writes for minutes. It now stops
    taking part, and the others go on."""
    from twisted.python.failure import Failure

    cl = Cluster(tmp_path)
    leader = cl.wait_leader()
    broken = leader
    p = cl.stores[broken].proposer
    p._commit._flush_failed(Failure(OSError(9, "Bad file descriptor")), [])
    assert p.driver.failed is not None
    cl.run(3.0)
    survivor = cl.wait_leader()
    assert survivor != broken
    assert cl.result(cl.stores[survivor].create_channel("kafka.after")) is True


def test_a_member_whose_apply_raises_stops_taking_part_and_says_so(tmp_path):
    """An entry a member cannot apply (one it cannot decode) raised out of the Ready loop's
    reactor call: the loop stayed busy for good and the node still looked healthy. It now
    stops taking part as after a failed fsync (``driver.failed``), and the others go on."""
    cl = Cluster(tmp_path)
    leader = cl.wait_leader()
    assert cl.result(cl.stores[leader].create_channel("kafka.a")) is True
    cl.run(0.5)
    broken = next(i for i in cl.ids if i != leader)
    p = cl.stores[broken].proposer

    def unreadable(entry):
        raise ValueError("unknown command tag 251")

    p.apply = unreadable
    # Its Raft log saves finish a reactor turn later, as on the I/O thread: a committed entry
    # it already holds is then applied within the Ready loop's own call (``_apply_stable``).
    p.driver._run_io = lambda f, *args: deferLater(cl.clock, 0, f, *args)
    for n, value in enumerate([b"x", b"y", b"z"], start=1):
        d = cl.stores[leader].append_batch("kafka.a", batch(value))
        assert cl.result(d).first_sequence == n  # raised out of the clock before
    assert p.driver.failed is not None and p.driver.failed.check(ValueError)


def test_leader_crash_elects_a_new_leader_and_the_old_one_catches_up(tmp_path):
    cl = Cluster(tmp_path)
    old = cl.wait_leader()
    cl.result(cl.stores[old].create_channel("kafka.t"))
    for i in range(3):
        cl.result(cl.stores[old].append_batch("kafka.t", batch(b"before%d" % i)))
    cl.crash(old)
    new = cl.wait_leader(seconds=10)
    assert new != old
    r = cl.result(cl.stores[new].append_batch("kafka.t", batch(b"after")))
    assert r.first_sequence == 4
    cl.boot(old)
    cl.run(3.0)
    assert cl.started[old] == [None]
    expect = [b"before0", b"before1", b"before2", b"after"]
    for s in cl.stores.values():
        assert values(s, "kafka.t") == expect


def test_restart_replays_only_entries_after_the_checkpoint(tmp_path):
    """Applied-but-unflushed entries are cut back and replayed: nothing is applied twice."""
    cl = Cluster(tmp_path, n=1)
    cl.wait_leader()
    s = cl.stores[1]
    cl.result(s.create_channel("kafka.t"))
    cl.result(s.append_batch("kafka.t", batch(b"a")))
    # Apply more without letting the group commit (and its checkpoint) run, then crash.
    s.proposer._commit.schedule = lambda: None
    ds = [s.append_batch("kafka.t", batch(b"b%d" % i), durable=False) for i in range(3)]
    ds.append(s.create_channel("kafka.late"))
    ds.append(s.append_batch("kafka.late", batch(b"L"), durable=False))
    cl.run(0.2)
    assert s.machine.channels["kafka.t"].next_sequence == 5   # in the page cache
    cl.crash(1)
    cl.boot(1)
    cl.run(1.0)
    assert cl.started[1] == [None]
    s = cl.stores[1]
    assert values(s, "kafka.t") == [b"a", b"b0", b"b1", b"b2"]
    assert values(s, "kafka.late") == [b"L"]
    r = cl.result(s.append_batch("kafka.t", batch(b"c")))
    assert r.first_sequence == 5


def test_no_leader_fails_cleanly_within_the_timeout(tmp_path):
    cl = Cluster(tmp_path, propose_timeout_s=2.0)
    leader = cl.wait_leader()
    others = [i for i in cl.ids if i != leader]
    cl.crash(others[0])
    cl.crash(others[1])
    cl.run(3.0)  # the leader steps down (check-quorum)
    with pytest.raises(NoLeaderError):
        cl.result(cl.stores[leader].create_channel("x"), seconds=5)


def test_a_lagging_follower_is_caught_up_by_a_snapshot(tmp_path):
    cl = Cluster(tmp_path, compact_entries=20)
    leader = cl.wait_leader()
    lagging = next(i for i in cl.ids if i != leader)
    ls = cl.stores[leader]
    cl.result(ls.create_channel("kafka.s"))
    cl.net.down.add(lagging)
    for i in range(60):
        cl.result(ls.append_batch("kafka.s", batch(b"v%d" % i)))
    cl.run(1.0)
    assert ls.proposer.driver.node.snapshot_index > 0
    cl.net.down.discard(lagging)
    cl.run(5.0)
    expect = [b"v%d" % i for i in range(60)]
    assert values(cl.stores[lagging], "kafka.s") == expect
    r = cl.result(ls.append_batch("kafka.s", batch(b"more")))
    cl.run(1.0)
    assert values(cl.stores[lagging], "kafka.s") == expect + [b"more"]
    assert r.first_sequence == 61


def test_applied_entries_drop_their_bytes_and_a_lagging_follower_still_gets_them(tmp_path):
    """Every node keeps only references (``Stored``) to the applied entries in its Raft log
    file, not their bytes; a follower that missed entries gets them read back from the
    leader's file (no snapshot: nothing was compacted)."""
    cl = Cluster(tmp_path)
    leader = cl.wait_leader()
    ls = cl.stores[leader]
    cl.result(ls.create_channel("kafka.m"))
    cl.run(0.5)
    late = next(i for i in cl.ids if i != leader)
    cl.net.down.add(late)
    sent = _snapshots_sent_by(cl, leader)
    expect = [b"%03d" % i + bytes(500) for i in range(30)]
    for v in expect:
        cl.result(ls.append_batch("kafka.m", batch(v)))
    cl.run(1.0)
    for i, s in cl.stores.items():
        if i == late:
            continue
        node = s.proposer.driver.node
        applied = [e for e in node._log.entries if e.index <= node.applied_index]
        assert len(applied) > 30
        assert not [e for e in applied if len(e.data) > 64 and type(e.data) is not Stored]
    cl.net.down.discard(late)
    cl.run(3.0)
    assert values(cl.stores[late], "kafka.m") == expect
    assert not sent
    late_node = cl.stores[late].proposer.driver.node
    assert all(type(e.data) is Stored for e in late_node._log.entries[-30:])


def _cut_off_follower(tmp_path: Path, channel: str,
                      **raft: object) -> tuple[Cluster, ChannelStore, int, list]:
    """A cluster with ``channel`` whose leader has one follower cut off from now on: the
    cluster, the leader's store, the follower and the snapshots the leader sends from now."""
    cl = Cluster(tmp_path, election_ticks=50, **raft)
    leader = cl.wait_leader()
    ls = cl.stores[leader]
    slow = next(i for i in cl.ids if i != leader)
    cl.result(ls.create_channel(channel))
    cl.run(0.5)
    snapshots_sent = _snapshots_sent_by(cl, leader)
    cl.net.down.add(slow)
    return cl, ls, slow, snapshots_sent


def _snapshots_sent_by(cl: Cluster, node: int) -> list:
    """The InstallSnapshot messages ``node`` sends from now on (a spy on its transport)."""
    sent: list = []
    send = cl.net.nodes[node].send

    def counting_send(messages):
        sent.extend(m for m in messages if isinstance(m, InstallSnapshot))
        send(messages)

    cl.net.nodes[node].send = counting_send
    return sent


def test_a_leader_waits_for_a_live_follower_before_compacting_past_it(tmp_path):
    """A follower a moment behind is caught up from the log, not sent the whole store: the
    leader takes its snapshot but compacts to it only once that follower holds the entries."""
    cl, ls, slow, snapshots_sent = _cut_off_follower(tmp_path, "kafka.s", compact_entries=20)
    acks = []
    for i in range(60):  # one Raft entry each (proposals in one turn would share one)
        acks.append(ls.append_batch("kafka.s", batch(b"v%d" % i)))
        cl.run()
    cl.run(0.2)
    driver = ls.proposer.driver
    assert all(d.called for d in acks)
    assert driver._taken is not None, "no snapshot was taken"
    assert driver.node.snapshot_index < driver._taken[0]  # ...but the log is not compacted
    cl.net.down.discard(slow)
    cl.run(3.0)
    assert driver.node.snapshot_index > 0 and not snapshots_sent
    expect = values(ls, "kafka.s")
    assert len(expect) == 60 and values(cl.stores[slow], "kafka.s") == expect


# ---------------------------------------------------------------------- graceful hand-over


def test_a_stopping_leader_hands_over_to_the_most_up_to_date_follower(tmp_path):
    cl = Cluster(tmp_path)
    old = cl.wait_leader()
    ls = cl.stores[old]
    cl.result(ls.create_channel("kafka.h"))
    lagging, fresh = [i for i in cl.ids if i != old]
    cl.net.down.add(lagging)
    for i in range(3):
        cl.result(ls.append_batch("kafka.h", batch(b"v%d" % i)))
    cl.net.down.discard(lagging)
    assert ls.proposer.driver.node.transfer_target() == fresh
    pending = ls.append_batch("kafka.h", batch(b"last"))  # in the log when the stop begins
    stopped: list = []
    ls.stop().addBoth(stopped.append)
    late: list = []
    ls.append_batch("kafka.h", batch(b"late")).addErrback(late.append)
    assert late and late[0].check(StoreStopped)
    cl.run(0.3)  # far less than an election timeout (1-2 s here)
    assert stopped == [None]
    del cl.stores[old]
    assert cl.leader() == fresh
    assert cl.stores[fresh].leader_id() == fresh
    # The proposal already in the log was answered (applied), not failed by the stop.
    assert cl.result(pending).first_sequence == 4
    r = cl.result(cl.stores[fresh].append_batch("kafka.h", batch(b"after")))
    assert r.first_sequence == 5
    cl.run(0.5)
    assert values(cl.stores[lagging], "kafka.h") == [b"v0", b"v1", b"v2", b"last", b"after"]


def test_hand_over_is_bounded_when_no_follower_answers(tmp_path):
    cl = Cluster(tmp_path, transfer_timeout_s=0.4)
    old = cl.wait_leader()
    ls = cl.stores[old]
    cl.result(ls.create_channel("kafka.h"))
    for i in cl.ids:
        if i != old:
            cl.net.down.add(i)
    stopped: list = []
    ls.stop().addBoth(stopped.append)
    cl.run(0.3)
    assert stopped == []          # still trying within its bound
    cl.run(0.3)
    assert stopped == [None]      # gave up after transfer_timeout_s, stopped cleanly


def test_a_follower_or_a_lone_node_stops_without_a_transfer(tmp_path):
    cl = Cluster(tmp_path)
    old = cl.wait_leader()
    follower = next(i for i in cl.ids if i != old)
    stopped: list = []
    cl.stores[follower].stop().addBoth(stopped.append)
    cl.run(0)
    assert stopped == [None]
    assert cl.stores[old].proposer.driver.node.transferring is None


# ---------------------------------------------------------------------- early apply (one member)


class _HeldIO:
    """A Raft-log I/O runner whose calls finish only when the test says so."""

    def __init__(self) -> None:
        self.calls: list = []

    def __call__(self, f, *args):
        d = Deferred()
        self.calls.append((d, f, args))
        return d

    def finish(self) -> int:
        calls, self.calls = self.calls, []
        for d, f, args in calls:
            d.callback(f(*args))
        return len(calls)


def _solo_store(tmp_path: Path, clock: Clock, io: _HeldIO, **raft: object) -> ChannelStore:
    def factory(machine, reactor, run_io):
        return RaftProposer(machine, reactor, run_io, node_id=1, members=None, transport=None,
                            raft_dir=tmp_path / "raft", rng=random.Random(1), tick_s=TICK,
                            run_raft_io=io, **raft)

    return ChannelStore(tmp_path, clock, threaded_io=False, proposer_factory=factory)


def _settle(clock: Clock, io: _HeldIO) -> None:
    for _ in range(20):
        clock.advance(0)
        if not io.finish():
            clock.advance(0)
            if not io.calls:
                return


def _crash(store: ChannelStore) -> None:
    """Lose the process: nothing more is written, no clean stop."""
    p = store.proposer
    p._stopped = p.driver._stopped = True
    if p.driver._ticker.running:
        p.driver._ticker.stop()
    for loop in store._loops:
        if loop.running:
            loop.stop()
    p.storage.close()
    store.machine.close()


def _started_solo(tmp_path: Path, clock: Clock, io: _HeldIO) -> ChannelStore:
    """A one-member store on ``tmp_path`` (new or restarted), started."""
    store = _solo_store(tmp_path, clock, io)
    started: list = []
    store.start().addBoth(started.append)
    _settle(clock, io)
    assert started == [None]
    return store


def _solo_with_channel(tmp_path: Path, clock: Clock, io: _HeldIO) -> ChannelStore:
    store = _started_solo(tmp_path, clock, io)
    created: list = []
    store.create_channel("kafka.e").addBoth(created.append)
    _settle(clock, io)
    assert created == [True]
    return store


def test_one_member_writes_appends_through_and_its_raft_log_holds_them_elided(tmp_path):
    clock = Clock()
    clock.advance(1_700_000_000)
    io = _HeldIO()
    store = _solo_with_channel(tmp_path, clock, io)
    proposer = store.proposer
    ch = store.machine.channels["kafka.e"]
    acks: list = []
    for i in range(3):
        store.append_batch("kafka.e", batch(b"x%d" % i * 1000)).addBoth(acks.append)
    proposer.write_through = lambda: held  # the segment flush and checkpoint: held
    held: Deferred = Deferred()
    clock.advance(0)                   # the Ready is cut: applied, then both writes start
    assert proposer.staged_entries >= 1
    assert io.calls == []              # ELIDED entries alone: written inline, no fsync
    assert ch.next_sequence == 4       # applied to the segment page cache already...
    assert store.bounds("kafka.e").high_watermark == 1   # ...but neither visible...
    assert acks == []                  # ...nor answered
    del proposer.write_through
    proposer.write_through().chainDeferred(held)   # the real flush: segments + checkpoint
    clock.advance(0)
    assert [a.first_sequence for a in acks] == [1, 2, 3]
    assert store.bounds("kafka.e").high_watermark == 4
    assert store.machine.journal.durable_applied == store.machine.last_applied
    elided = [e for e in proposer.storage.entries if e.data == ELIDED]
    assert elided and proposer.driver.elided_entries == len(elided)
    # ...and neither does the core's in-memory log keep the batches until a compaction.
    in_core = {e.index: e.data for e in proposer.driver.node._log.entries}
    assert all(in_core[e.index] == ELIDED for e in elided)
    assert proposer.storage._direct is None  # its small log writes stay in the page cache
    assert proposer.storage.wal_bytes < 3000, "the records went to the Raft log as well as to the segment"
    _settle(clock, io)
    assert values(store, "kafka.e") == [b"x0" * 1000, b"x1" * 1000, b"x2" * 1000]


def _solo_with_one_record(tmp_path, clock):
    """A one-member store whose channel ``kafka.e`` holds b"kept" at Sequence 1, acknowledged."""
    io = _HeldIO()
    store = _solo_with_channel(tmp_path, clock, io)
    acked: list = []
    store.append_batch("kafka.e", batch(b"kept")).addBoth(acked.append)
    _settle(clock, io)
    assert acked[0].first_sequence == 1
    return store


def test_one_member_crash_after_the_raft_write_but_before_the_checkpoint(tmp_path):
    """The ELIDED entries are durable, the checkpoint is not: recovery cuts the segment back
    and the replayed ELIDED entries apply as nothing. They were never answered."""
    clock = Clock()
    clock.advance(1_700_000_000)
    store = _solo_with_one_record(tmp_path, clock)
    store.proposer.write_through = lambda: Deferred()  # the flush never returns
    lost: list = []
    store.append_batch("kafka.e", batch(b"lost")).addBoth(lost.append)
    clock.advance(0)                   # the Raft log now holds the ELIDED entry
    assert store.proposer.storage.entries[-1].data == ELIDED
    assert store.machine.channels["kafka.e"].next_sequence == 3
    _crash(store)
    assert lost == []
    io2 = _HeldIO()
    again = _started_solo(tmp_path, clock, io2)
    assert again.proposer.lost_elided == 1
    assert values(again, "kafka.e") == [b"kept"]
    r: list = []
    again.append_batch("kafka.e", batch(b"next")).addBoth(r.append)
    _settle(clock, io2)
    assert r[0].first_sequence == 2
    assert values(again, "kafka.e") == [b"kept", b"next"]


def test_one_member_crash_after_the_checkpoint_but_before_the_raft_write(tmp_path):
    """The checkpoint names entries the Raft log lost (its ELIDED write is not fsynced: an
    OS crash can drop it): the Raft log restarts at the checkpoint, the records it covers
    stay, and later appends continue after them, across further restarts."""
    clock = Clock()
    clock.advance(1_700_000_000)
    store = _solo_with_one_record(tmp_path, clock)
    answered: list = []
    storage = store.proposer.storage
    storage.save = lambda rd, sync_entries=True: None  # its unsynced write is lost
    store.append_batch("kafka.e", batch(b"durable")).addBoth(answered.append)
    clock.advance(0)                   # applied; the flush (inline here) and checkpoint ran
    assert store.machine.journal.durable_applied == store.machine.last_applied
    assert storage.last_index < store.machine.last_applied
    assert answered[0].first_sequence == 2
    _crash(store)
    for round_ in range(2):
        io2 = _HeldIO()
        again = _started_solo(tmp_path, clock, io2)
        if round_ == 0:  # the Raft log was restarted at the checkpoint
            assert again.proposer.storage.snapshot.data.startswith(b"kmq-checkpoint:")
        expect = [b"kept", b"durable"] + [b"next%d" % k for k in range(round_)]
        assert values(again, "kafka.e") == expect
        r: list = []
        again.append_batch("kafka.e", batch(b"next%d" % round_)).addBoth(r.append)
        _settle(clock, io2)
        assert r[0].first_sequence == len(expect) + 1
        stopped: list = []
        again.stop().addBoth(stopped.append)
        _settle(clock, io2)
        assert stopped == [None]


def test_one_member_refused_disk_write_fails_that_append_only(tmp_path, monkeypatch):
    """ENOSPC while a lone node writes a batch through: that append fails with StorageFailure
    (Kafka's KAFKA_STORAGE_ERROR), nothing of it is stored, and the node keeps serving."""
    import errno

    from kmqkafka.store import log as log_module
    from kmqkafka.store.errors import StorageFailure

    clock = Clock()
    clock.advance(1_700_000_000)
    io = _HeldIO()
    store = _solo_with_channel(tmp_path, clock, io)
    first: list = []
    store.append_batch("kafka.e", batch(b"a", b"b")).addBoth(first.append)
    _settle(clock, io)
    assert first[0].last_sequence == 2
    real = log_module.write_batch_at_offset

    def full(fd, base_offset, buf):
        real(fd, base_offset, buf[: len(buf) // 2])  # a short write, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(log_module, "write_batch_at_offset", full)
    refused: list = []
    store.append_batch("kafka.e", batch(b"lost")).addBoth(refused.append)
    _settle(clock, io)
    assert refused and refused[0].check(StorageFailure)
    monkeypatch.setattr(log_module, "write_batch_at_offset", real)
    after: list = []
    store.append_batch("kafka.e", batch(b"after")).addBoth(after.append)
    _settle(clock, io)
    assert after[0].first_sequence == 3 and not store.failed
    stopped: list = []
    store.stop().addBoth(stopped.append)
    _settle(clock, io)
    assert stopped == [None]
    again = _started_solo(tmp_path, clock, _HeldIO())
    assert values(again, "kafka.e") == [b"a", b"b", b"after"]


def test_one_member_failed_fsync_answers_no_write_and_refuses_later_ones(tmp_path, monkeypatch):
    import errno
    import os

    from kmqkafka.store.errors import StorageFailure, StoreError

    clock = Clock()
    clock.advance(1_700_000_000)
    io = _HeldIO()
    store = _solo_with_channel(tmp_path, clock, io)

    def broken(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken)
    answer: list = []
    store.append_batch("kafka.e", batch(b"x")).addBoth(answer.append)
    _settle(clock, io)
    monkeypatch.undo()
    assert answer and answer[0].check(StoreError), "an unsynced write was acknowledged"
    assert store.failed
    later: list = []
    store.append_batch("kafka.e", batch(b"y")).addBoth(later.append)
    _settle(clock, io)
    assert later[0].check(StorageFailure)
    # The failed write ended the Ready it belonged to: stopping (SIGTERM) must not wait for
    # it (it waited forever, and the daemon had to be killed).
    stopped: list = []
    store.stop().addBoth(stopped.append)
    _settle(clock, io)
    assert stopped == [None]


def _snapshot_trees(directory, indexes) -> None:
    for i in indexes:
        (directory / f"{i:020d}").mkdir()
        (directory / f"{i:020d}" / "snapshot.json").write_text("{}")


def test_pruning_snapshots_keeps_the_one_the_core_serves_and_files_in_transit(tmp_path):
    """Snapshot trees share their directory with tar files being sent or received; pruning
    removes only older numbered trees, never the one the core still sends to followers."""
    from types import SimpleNamespace

    cl = Cluster(tmp_path)
    p = cl.stores[cl.wait_leader()].proposer
    d = p.snapshot_dir
    _snapshot_trees(d, (5, 7, 9))
    (d / "snapshot-abc.tar").write_bytes(b"x")
    (d / "incoming-3.tar").write_bytes(b"y")
    driver, p.driver = p.driver, SimpleNamespace(node=SimpleNamespace(snapshot_index=5))
    try:
        p.prune_snapshots(keep=9)
    finally:
        p.driver = driver
    assert sorted(x.name for x in d.iterdir()) == [
        f"{5:020d}", f"{9:020d}", "incoming-3.tar", "snapshot-abc.tar"]


def test_a_snapshot_being_sent_to_a_follower_is_not_pruned_until_released(tmp_path):
    """The transport streams a snapshot tree from its files; a compaction meanwhile must not
    remove the tree under it (the follower would never finish a large transfer)."""
    from types import SimpleNamespace

    cl = Cluster(tmp_path)
    p = cl.stores[cl.wait_leader()].proposer
    d = p.snapshot_dir
    _snapshot_trees(d, (5, 7, 9))
    assert p.hold_snapshot(7) == d / f"{7:020d}" and p.hold_snapshot(7) is not None
    assert p.hold_snapshot(8) is None
    driver, p.driver = p.driver, SimpleNamespace(node=SimpleNamespace(snapshot_index=9))
    try:
        p.prune_snapshots(keep=9)
        assert sorted(x.name for x in d.iterdir()) == [f"{7:020d}", f"{9:020d}"]
        p.release_snapshot(7)
        p.prune_snapshots(keep=9)
        assert sorted(x.name for x in d.iterdir()) == [f"{7:020d}", f"{9:020d}"]  # one left
        p.release_snapshot(7)
        p.prune_snapshots(keep=9)
        assert sorted(x.name for x in d.iterdir()) == [f"{9:020d}"]
    finally:
        p.driver = driver


def test_a_cut_off_leader_answers_its_pending_writes_not_leader_soon(tmp_path):
    """A leader cut off from the majority steps down (check-quorum) and, an election timeout
    later, answers the writes it still holds NOT_LEADER; writes sent to it once it knows no
    leader get the same after two election timeouts. Both used to wait out the whole
    propose timeout (REQUEST_TIMED_OUT, retried by clients at the same broker)."""
    cl = Cluster(tmp_path, propose_timeout_s=10.0)
    leader = cl.wait_leader()
    cl.result(cl.stores[leader].create_channel("kafka.t"))
    cl.net.down = {i for i in cl.ids if i != leader}   # the majority is out of reach
    pending = cl.stores[leader].append_batch("kafka.t", batch(b"lost"))
    started = cl.clock.seconds()
    with pytest.raises(NotLeaderError):
        cl.result(pending, seconds=9)
    assert cl.clock.seconds() - started <= 3 * 1.0 + 0.5   # check-quorum + one election timeout
    assert not cl.stores[leader].is_leader()
    later = cl.stores[leader].append_batch("kafka.t", batch(b"later"))
    started = cl.clock.seconds()
    with pytest.raises(NoLeaderError):
        cl.result(later, seconds=9)
    assert cl.clock.seconds() - started <= 2 * 1.0 + 1.0


def test_a_leader_holds_proposals_rather_than_send_a_lagging_follower_a_snapshot(tmp_path):
    """A live follower that falls a whole compaction window behind (three nodes sharing two
    cores do that under load) used to be cut off by the forced compaction at twice the window
    and sent the whole store, which starved the leader into elections. The leader now holds
    new proposals once its log is 1.5 windows long and a snapshot waits for that follower,
    and lets them go as soon as it has caught up: no snapshot transfer, nothing lost."""
    cl, ls, slow, snapshots_sent = _cut_off_follower(tmp_path, "kafka.h",
                                                     compact_entries=100_000,
                                                     compact_bytes=60_000)
    acks = []
    for i in range(80):
        acks.append(ls.append_batch("kafka.h", batch(b"%04d" % i + b"x" * 2000)))
        cl.run()
    cl.run(0.3)
    driver = ls.proposer.driver
    held = [d for d in acks if not d.called]
    assert held, "nothing was held"
    assert driver.follower_backlogged()
    cl.net.down.discard(slow)
    cl.run(3.0)
    assert all(d.called for d in acks) and not snapshots_sent
    expect = values(ls, "kafka.h")
    assert len(expect) == 80 and values(cl.stores[slow], "kafka.h") == expect


class _Downloads:
    """A transport whose snapshot downloads finish when the test says (``Deferred``s)."""

    def __init__(self) -> None:
        self.started: list[tuple[int, int, Deferred]] = []

    def fetch_snapshot(self, frm: int, snapshot: Snapshot) -> Deferred:
        # Cancelled, it fails as the real transport's does (not with CancelledError).
        d: Deferred = Deferred(lambda d: d.errback(TransportError("the download was cancelled")))
        self.started.append((frm, snapshot.meta.index, d))
        return d

    def send(self, messages) -> None:  # noqa: ANN001 - unused here
        pass


def _lagging_follower(clock: Clock, transport: _Downloads):
    """A driver whose core (a stand-in) is far behind every snapshot offered to it."""
    from types import SimpleNamespace

    from kmqkafka.raft.driver import RaftDriver

    stepped: list = []
    node = SimpleNamespace(term=1, commit_index=0, step=stepped.append, voters={1, 2, 3})
    app = SimpleNamespace(has_snapshot=lambda snap: False)
    driver = RaftDriver(node, SimpleNamespace(), app, transport, clock, lambda f, *a: None)
    driver._kick = lambda: None
    return driver, node, stepped


def _install(frm: int, term: int, index: int) -> InstallSnapshot:
    return InstallSnapshot(frm=frm, to=2, term=term, snapshot=Snapshot(
        SnapshotMeta(index, term, frozenset({1, 2, 3})), b"kmq-snapshot:%d" % index))


def test_a_follower_downloads_one_snapshot_at_a_time(tmp_path):
    """The leader repeats InstallSnapshot every election timeout (naming newer snapshots as it
    compacts): a download for each filled the follower's disk with trees it never installed."""
    clock, transport = Clock(), _Downloads()
    driver, node, stepped = _lagging_follower(clock, transport)
    driver.step(_install(1, 1, 100))
    driver.step(_install(1, 1, 100))
    driver.step(_install(1, 1, 120))  # the same leader, a newer snapshot: wait for the first
    assert [(f, i) for f, i, _ in transport.started] == [(1, 100)]
    transport.started[0][2].callback(None)
    assert [m.snapshot.meta.index for m in stepped] == [100]
    driver.step(_install(1, 1, 120))  # the next one starts once the first is done
    assert [(f, i) for f, i, _ in transport.started] == [(1, 100), (1, 120)]


def test_a_newer_leaders_snapshot_replaces_a_stalled_download(tmp_path):
    clock, transport = Clock(), _Downloads()
    driver, node, stepped = _lagging_follower(clock, transport)
    driver.step(_install(1, 1, 100))
    node.term = 2
    driver.step(_install(3, 2, 100))  # node 1 froze; node 3 leads term 2 with the same index
    first, second = transport.started
    assert first[2].called and second[:2] == (3, 100)  # the old download was cancelled
    second[2].callback(None)
    assert [m.frm for m in stepped] == [3]


def test_a_failed_download_is_retried_after_a_growing_backoff(tmp_path):
    from kmqkafka.raft.driver import FETCH_BACKOFF_MIN_S

    clock, transport = Clock(), _Downloads()
    driver, node, stepped = _lagging_follower(clock, transport)
    for attempt in range(3):
        driver.step(_install(1, 1, 100))
        assert len(transport.started) == attempt + 1
        transport.started[-1][2].errback(OSError(28, "No space left on device"))
        driver.step(_install(1, 1, 100))  # at once: still waiting
        assert len(transport.started) == attempt + 1
        clock.advance(FETCH_BACKOFF_MIN_S * 2 ** attempt)
    assert stepped == []


def test_a_download_cut_short_leaves_nothing_behind_after_a_restart(tmp_path):
    cl = Cluster(tmp_path)
    cl.wait_leader()
    snapshots = cl.stores[2].proposer.snapshot_dir
    cl.crash(2)
    (snapshots / f"{367:020d}.part" / "channels").mkdir(parents=True)  # a killed download
    (snapshots / "incoming-300.tar").write_bytes(b"x")  # an older version's
    cl.boot(2)
    cl.run(1)
    assert sorted(p.name for p in snapshots.iterdir()) == []


def test_a_new_member_prepares_its_spare_raft_log_files_before_it_takes_part(
        tmp_path, monkeypatch):
    """As many spare files as the log rolls between two compactions (4 MiB / 1 MiB, plus one),
    written before the driver starts; a restarted member, whose log is not new, starts at once
    and tops them up in the background."""
    from kmqkafka.raft import driver as driver_module
    from kmqkafka.raft import storage as storage_module

    monkeypatch.setattr(storage_module, "PREPARE_STEP", 256 << 10)
    spare_at_start: dict[int, int] = {}
    original_start = driver_module.RaftDriver.start

    def start(self):
        spare_at_start[self.node.id] = len(self.storage._free)
        original_start(self)

    monkeypatch.setattr(driver_module.RaftDriver, "start", start)
    cl = Cluster(tmp_path, preallocate=True, wal_roll_bytes=1 << 20, compact_bytes=4 << 20)
    assert spare_at_start == {1: 5, 2: 5, 3: 5}
    for i in cl.ids:
        raft = tmp_path / f"n{i}" / "raft"
        free = sorted(p.name for p in raft.iterdir() if p.name.startswith("wal-free"))
        assert free == [f"wal-free.new-{n}" for n in range(1, 6)]
        assert all((raft / n).stat().st_size == 1 << 20 for n in free)
    ls = cl.stores[cl.wait_leader()]
    assert cl.result(ls.create_channel("kafka.t")) is True
    for i in range(8):  # rolls the log: spare files are used up
        cl.result(ls.append_batch("kafka.t", batch(b"x" * (300 << 10))))
    cl.run(1.0)
    follower = next(i for i in cl.ids if cl.stores[i] is not ls)
    cl.crash(follower)
    used = len(list((tmp_path / f"n{follower}" / "raft").glob("wal-free.*")))
    assert used < 5
    cl.boot(follower)
    assert spare_at_start[follower] == used  # started without writing new ones first
    cl.run(2.0)
    assert len(list((tmp_path / f"n{follower}" / "raft").glob("wal-free.*"))) == 5
    assert len(values(cl.stores[follower], "kafka.t")) == 8


def test_an_apply_waiter_its_caller_already_fired_is_not_fired_again():
    """A caller that gave up on ``wait_applied`` may fire its Deferred itself; the apply that
    comes later must not raise AlreadyCalledError (it failed the driver: the node stopped
    taking part for good)."""
    driver, node, _ = _lagging_follower(Clock(), _Downloads())
    node.applied_index = 4
    gave_up, waiting = driver.wait_applied(7), driver.wait_applied(7)
    gave_up.callback(None)
    node.applied_index = 7
    driver._release_applied()
    assert waiting.called and driver._applied_waiters == [] and driver.failed is None


def test_a_cancelled_apply_waiter_leaves_the_list():
    """A caller that stops waiting cancels its ``wait_applied`` Deferred: the waiter leaves
    the driver's list at once (a follower lagging for long gathered one per request), the
    others stay, and the apply fires only those."""
    driver, node, _ = _lagging_follower(Clock(), _Downloads())
    node.applied_index = 4
    given_up, waiting = driver.wait_applied(7), driver.wait_applied(7)
    given_up.addErrback(lambda f: f.trap(CancelledError))
    given_up.cancel()
    assert [d for _, d in driver._applied_waiters] == [waiting]
    node.applied_index = 7
    driver._release_applied()
    assert waiting.called and driver._applied_waiters == [] and driver.failed is None


def test_a_slow_snapshot_taken_on_every_node_at_once_keeps_the_leader(tmp_path):
    """Every member snapshots at the same applied index, so all pause their Raft loop at once
    while the store is copied. A pause longer than the election timeout (a loaded machine,
    a large store) must not read as a dead leader: Kafka's controllers write snapshots off
    their Raft thread, while here clients saw a re-election (COORDINATOR_NOT_AVAILABLE, a
    consumer's session timeout) every ``compact_entries`` entries."""
    cl = Cluster(tmp_path, compact_entries=20)
    leader = cl.wait_leader()
    ls = cl.stores[leader]
    term = ls.proposer.driver.node.term
    cl.result(ls.create_channel("kafka.s"))
    for i in cl.ids:
        p = cl.stores[i].proposer
        take = p.take_snapshot

        def slow(index, take=take):
            d = Deferred()
            cl.clock.callLater(5.0, lambda: take(index).chainDeferred(d))
            return d

        p.take_snapshot = slow
    for i in range(30):
        cl.result(ls.append_batch("kafka.s", batch(b"v%d" % i)), seconds=10.0)
    cl.run(10.0)
    assert all(cl.stores[i].proposer.driver.node.snapshot_index > 0 for i in cl.ids)
    assert cl.leader() == leader
    assert ls.proposer.driver.node.term == term
