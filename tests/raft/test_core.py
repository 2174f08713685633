"""Scenario scripts for the Raft core on a tiny in-test network (no reactor, no clock)."""
from __future__ import annotations

import random

import pytest

from kmqkafka.raft import (
    ConfChange, ConfChangeInProgress, ConfChangeOp, DecodeError, Entry, EntryKind, MemoryStorage,
    NotLeader, ProposalDropped, RaftNode, Role, Snapshot, SnapshotMeta, decode, encode,
)
from kmqkafka.raft.messages import (
    Append, AppendResp, Heartbeat, HeartbeatResp, InstallSnapshot, InstallSnapshotResp, PreVote,
    PreVoteResp, TimeoutNow, Vote, VoteResp,
)


class Cluster:
    """Nodes wired through a message queue; the driver loop is persist, send, apply, advance."""

    def __init__(self, n: int = 3, **options: object) -> None:
        self.ids = set(range(1, n + 1))
        self.options = {"election_ticks": 10, **options}
        self.storage = {i: MemoryStorage() for i in self.ids}
        self.nodes: dict[int, RaftNode] = {}
        self.applied: dict[int, list[Entry]] = {}
        self.reads: dict[int, list] = {i: [] for i in self.ids}
        self.queue: list = []
        self.sent: list = []
        self.cut: set[int] = set()  # isolated nodes
        self.down: set[int] = set()
        self.drop = lambda m: False
        for i in self.ids:
            self.start(i, self.ids)

    def start(self, i: int, voters: set[int]) -> RaftNode:
        self.storage.setdefault(i, MemoryStorage())
        self.nodes[i] = RaftNode(i, voters, self.storage[i], rng=random.Random(i),
                                 **self.options)
        self.applied[i] = []
        self.reads.setdefault(i, [])
        self.ids.add(i)
        return self.nodes[i]

    def process(self, i: int) -> None:
        node = self.nodes[i]
        while (rd := node.ready()) is not None:
            self.storage[i].save(rd)
            self.queue.extend(rd.messages)
            self.sent.extend(rd.messages)
            if rd.snapshot is not None:
                self.applied[i] = [Entry(rd.snapshot.meta.index, 0, data=rd.snapshot.data)]
            self.applied[i].extend(rd.committed_entries)
            self.reads[i].extend(rd.read_states)
            node.advance(rd)

    def deliver(self, rounds: int = 100) -> None:
        for i in self.ids - self.down:
            self.process(i)
        for _ in range(rounds):
            if not self.queue:
                return
            batch, self.queue = self.queue, []
            for m in batch:
                if {m.frm, m.to} & (self.cut | self.down) or self.drop(m):
                    continue
                self.nodes[m.to].step(m)
                self.process(m.to)

    def tick(self, n: int = 1, only: set[int] | None = None) -> None:
        for _ in range(n):
            for i in sorted((only or self.ids) - self.down):
                self.nodes[i].tick()
            self.deliver()

    def elect(self, i: int) -> RaftNode:
        """Time out node ``i`` alone so it wins the election."""
        for _ in range(40):
            if self.nodes[i].role is Role.LEADER:
                return self.nodes[i]
            self.tick(only={i})
        raise AssertionError(f"node {i} did not become leader")

    def leaders(self) -> list[int]:
        return [i for i in self.ids - self.down if self.nodes[i].role is Role.LEADER]

    def data(self, i: int) -> list[bytes]:
        return [e.data for e in self.applied[i] if e.kind is EntryKind.NORMAL]

    def crash(self, i: int) -> None:
        self.down.add(i)

    def restart(self, i: int) -> None:
        self.down.discard(i)
        self.start(i, set(self.nodes[i].voters) if not self.storage[i].entries else self.ids)


def test_three_nodes_elect_exactly_one_leader() -> None:
    c = Cluster()
    c.tick(30)
    assert len(c.leaders()) == 1
    leader = c.nodes[c.leaders()[0]]
    assert all(n.leader == leader.id and n.term == leader.term for n in c.nodes.values())


def test_a_new_leader_commits_a_noop_then_proposals_everywhere() -> None:
    c = Cluster()
    leader = c.elect(1)
    assert [e.kind for e in c.applied[1]] == [EntryKind.NO_OP]
    assert leader.propose(b"a") == 2
    assert leader.propose(b"b") == 3
    c.deliver()
    c.tick()  # the heartbeat carries the new commit index to followers
    assert c.data(1) == c.data(2) == c.data(3) == [b"a", b"b"]


def test_followers_refuse_proposals_and_name_the_leader() -> None:
    c = Cluster()
    c.elect(1)
    with pytest.raises(NotLeader) as err:
        c.nodes[2].propose(b"x")
    assert err.value.leader == 1


def test_leader_crash_elects_a_new_leader_that_keeps_committed_entries() -> None:
    c = Cluster()
    c.elect(1).propose(b"kept")
    c.deliver()
    c.crash(1)
    c.tick(40)
    assert len(c.leaders()) == 1 and c.leaders()[0] in (2, 3)
    new = c.nodes[c.leaders()[0]]
    new.propose(b"after")
    c.tick(2)
    c.restart(1)
    c.tick(3)
    assert c.data(1) == c.data(2) == c.data(3) == [b"kept", b"after"]


def test_a_follower_with_a_divergent_log_is_truncated() -> None:
    c = Cluster()
    old = c.elect(1)
    c.cut = {1}
    old.propose(b"lost-1")
    old.propose(b"lost-2")  # never reach a quorum
    c.deliver()
    assert old.last_index == 3 and old.commit_index == 1
    c.tick(40, only={2, 3})  # followers must outlive their leader lease before electing
    new = c.nodes[next(i for i in c.leaders() if i != 1)]
    new.propose(b"won")
    c.tick(2, only={2, 3})
    c.cut = set()
    c.tick(3)
    assert old.role is Role.FOLLOWER and old.leader == new.id
    assert [old.term_at(i) for i in range(1, 4)] == [new.term_at(i) for i in range(1, 4)]
    assert c.data(1) == c.data(2) == [b"won"]


def test_pre_vote_keeps_a_partitioned_node_from_inflating_terms() -> None:
    c = Cluster()
    c.elect(1)
    term = c.nodes[1].term
    c.cut = {3}
    c.tick(100)
    assert c.nodes[3].term == term  # it kept asking, but pre-votes change no term
    c.cut = set()
    c.tick(5)
    assert c.leaders() == [1] and c.nodes[1].term == term


def test_without_pre_vote_a_partitioned_node_does_inflate_its_term() -> None:
    c = Cluster(pre_vote=False)
    c.elect(1)
    term = c.nodes[1].term
    c.cut = {3}
    c.tick(100)
    assert c.nodes[3].term > term + 3


def test_check_quorum_makes_an_isolated_leader_step_down() -> None:
    c = Cluster()
    c.elect(1)
    c.cut = {1}
    c.tick(25, only={1})
    assert c.nodes[1].role is Role.FOLLOWER


def test_without_check_quorum_an_isolated_leader_stays_leader() -> None:
    c = Cluster(check_quorum=False)
    c.elect(1)
    c.cut = {1}
    c.tick(25, only={1})
    assert c.nodes[1].role is Role.LEADER


def test_read_index_needs_a_quorum_heartbeat_round() -> None:
    c = Cluster()
    leader = c.elect(1)
    leader.propose(b"x")
    c.deliver()
    c.cut = {2, 3}
    leader.read_index(b"read-1")
    c.deliver()
    assert c.reads[1] == []  # nobody confirmed leadership
    c.cut = set()
    leader.read_index(b"read-2")
    c.deliver()
    assert [(r.context, r.index) for r in c.reads[1]] == [(b"read-1", 2), (b"read-2", 2)]


def test_read_index_is_refused_by_followers() -> None:
    c = Cluster()
    c.elect(1)
    with pytest.raises(NotLeader):
        c.nodes[2].read_index(b"r")


def test_add_a_node_then_remove_the_leader() -> None:
    c = Cluster()
    leader = c.elect(1)
    leader.propose(b"before")
    c.deliver()
    joiner = c.start(4, set())  # joins empty; learns the configuration from the leader
    leader.propose_conf_change(ConfChangeOp.ADD, 4)
    assert leader.voters == {1, 2, 3, 4}  # in force as soon as appended
    with pytest.raises(ConfChangeInProgress):
        leader.propose_conf_change(ConfChangeOp.ADD, 5)
    c.tick(3)
    assert joiner.voters == {1, 2, 3, 4} and c.data(4) == [b"before"]
    leader.propose_conf_change(ConfChangeOp.REMOVE, 1)
    c.deliver()
    assert leader.role is Role.FOLLOWER  # stepped down once its removal committed
    c.tick(40, only={2, 3, 4})
    assert len(c.leaders()) == 1 and c.leaders()[0] != 1
    new = c.nodes[c.leaders()[0]]
    assert new.voters == {2, 3, 4}
    new.propose(b"after")
    c.tick(2, only={2, 3, 4})
    assert c.data(2) == c.data(4) == [b"before", b"after"]


def test_a_new_leader_refuses_conf_changes_until_it_commits_in_its_term() -> None:
    c = Cluster()
    c.drop = lambda m: isinstance(m, AppendResp)  # the no-op cannot commit yet
    leader = c.elect(1)
    assert leader.commit_index == 0
    with pytest.raises(ConfChangeInProgress):
        leader.propose_conf_change(ConfChangeOp.REMOVE, 3)
    c.drop = lambda m: False
    c.tick()
    assert leader.commit_index == 1
    leader.propose_conf_change(ConfChangeOp.REMOVE, 3)
    assert leader.voters == {1, 2}


def test_leadership_transfer_catches_up_the_target_and_hands_over() -> None:
    c = Cluster()
    leader = c.elect(1)
    c.cut = {3}
    for n in range(5):
        leader.propose(b"%d" % n)
    c.deliver()
    c.cut = set()
    leader.transfer_leadership(3)
    with pytest.raises(ProposalDropped):
        leader.propose(b"during")
    c.tick(2)  # heartbeats reveal what 3 lacks; it catches up, gets TimeoutNow and wins
    assert c.leaders() == [3] and c.nodes[3].term == leader.term
    assert any(isinstance(m, TimeoutNow) and m.to == 3 for m in c.sent)


def test_a_lagging_follower_receives_a_snapshot() -> None:
    c = Cluster()
    leader = c.elect(1)
    c.cut = {3}
    for n in range(10):
        leader.propose(b"%d" % n)
    c.deliver()
    snap = leader.compact(leader.applied_index, b"state@%d" % leader.applied_index)
    c.storage[1].compact(snap)
    assert leader.snapshot_index == 11 and leader.entries(1, 12) is None
    c.cut = set()
    c.tick(3)
    assert c.storage[3].snapshot == snap
    assert c.applied[3][0].data == b"state@11"
    leader.propose(b"next")
    c.tick(2)
    assert c.data(3)[-1] == b"next" and c.nodes[3].applied_index == 12
    assert any(isinstance(m, InstallSnapshot) and m.to == 3 for m in c.sent)


@pytest.mark.parametrize("compacted", [False, True])
def test_a_follower_whose_log_was_wiped_is_caught_up_by_the_same_leader(compacted: bool) -> None:
    """A node restarted with an empty data dir under its old id: the leader's progress still
    says it holds everything. The leader used to probe at that match forever (until another
    leader took over); now the probe's answer lowers the match and the follower is sent the
    log again, or the snapshot once the log is compacted."""
    c = Cluster()
    leader = c.elect(1)
    for n in range(10):
        leader.propose(b"%d" % n)
    c.tick(2)
    assert c.nodes[3].applied_index == leader.applied_index == 11
    if compacted:
        snap = leader.compact(leader.applied_index, b"state@%d" % leader.applied_index)
        c.storage[1].compact(snap)
    c.crash(3)
    c.storage[3] = MemoryStorage()          # the data dir is gone
    c.restart(3)
    c.nodes[3] = c.start(3, c.ids)
    for n in range(3):
        leader.propose(b"after-%d" % n)
        c.tick(3)
    assert c.leaders() == [1] and leader.term == c.nodes[3].term
    assert c.nodes[3].applied_index == leader.applied_index == 14
    if compacted:
        assert c.applied[3][0].data == b"state@11"
        assert c.data(3)[-3:] == [b"after-0", b"after-1", b"after-2"]
    else:
        assert c.data(3) == c.data(1)


def test_a_single_node_cluster_elects_itself_on_the_first_tick_and_commits_at_once() -> None:
    c = Cluster(1)
    node = c.nodes[1]
    node.tick()
    assert node.role is Role.LEADER
    index = node.propose(b"solo")
    rd = node.ready()
    assert rd is not None
    assert [e.index for e in rd.entries] == [1, 2] and rd.entries[-1].index == index
    assert [e.data for e in rd.committed_entries] == [b"", b"solo"]
    assert rd.messages == ()
    node.advance(rd)
    node.read_index(b"r")
    assert node.ready().read_states[0].index == 2


def test_restart_recovers_term_vote_and_log_from_storage() -> None:
    c = Cluster()
    leader = c.elect(1)
    leader.propose(b"durable")
    c.tick(2)
    before = (c.nodes[2].term, c.nodes[2].vote, c.nodes[2].last_index)
    c.crash(2)
    c.restart(2)
    again = c.nodes[2]
    assert (again.term, again.vote, again.last_index) == before
    assert again.commit_index == 2 and again.applied_index == 0
    c.tick(1)
    assert c.data(2) == [b"durable"]  # re-applied from the log after restart


def test_flow_control_caps_appends_in_flight_and_batches_entries() -> None:
    c = Cluster(max_inflight_msgs=2, max_msg_bytes=1000)
    leader = c.elect(1)
    c.cut = {3}
    c.sent.clear()
    for n in range(20):
        leader.propose(b"x" * 100)  # about 121 bytes on the wire each
    c.deliver()
    to3 = [m for m in c.sent if isinstance(m, Append) and m.to == 3]
    assert len(to3) == 2  # the window is full; the rest waits for acknowledgements
    to2 = [m for m in c.sent if isinstance(m, Append) and m.to == 2 and m.entries]
    assert max(len(m.entries) for m in to2) > 1  # pipelined appends carry batches
    assert all(sum(e.size for e in m.entries) <= 1000 for m in to2)
    c.cut = set()
    c.tick(5)
    assert len(c.data(3)) == 20


def test_a_rejected_append_carries_a_hint_that_skips_a_whole_term() -> None:
    c = Cluster()
    c.elect(1)
    log = [Entry(i, 1) for i in range(1, 6)]
    c.storage[2].entries = log
    fresh = c.start(2, c.ids)
    fresh.step(Append(1, 2, 5, prev_index=9, prev_term=4, entries=(), commit=0))
    rd = fresh.ready()
    resp = [m for m in rd.messages if isinstance(m, AppendResp)][0]
    assert not resp.success and resp.reject_index == 9
    assert (resp.hint_index, resp.hint_term) == (5, 1)


MESSAGES = [
    PreVote(1, 2, 3, 10, 2), PreVoteResp(2, 1, 3, True), Vote(1, 2, 3, 10, 2, True),
    VoteResp(2, 1, 3, False),
    Append(1, 2, 3, 9, 2, (Entry(10, 3, EntryKind.NORMAL, b"\x00\xff"),
                           Entry(11, 3, EntryKind.CONF_CHANGE, b"cc"),
                           Entry(12, 3, EntryKind.NO_OP)), 8),
    AppendResp(2, 1, 3, False, 0, 9, 5, 1), AppendResp(2, 1, 3, True, 12),
    Heartbeat(1, 2, 3, 8, b"ctx"), HeartbeatResp(2, 1, 3, b""),
    InstallSnapshot(1, 2, 3, Snapshot(SnapshotMeta(100, 2, frozenset({1, 2, 3})), b"\x01" * 300)),
    InstallSnapshotResp(2, 1, 3, 100), TimeoutNow(1, 2, 3),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_type_round_trips_through_the_codec(message: object) -> None:
    assert decode(encode(message)) == message


def test_conf_change_payload_round_trips_with_the_whole_configuration() -> None:
    change = ConfChange.of(ConfChangeOp.ADD, 4, frozenset({1, 2, 3}))
    assert change.voters == {1, 2, 3, 4}
    assert ConfChange.decode(change.encode()) == change


def test_the_codec_rejects_truncated_and_trailing_bytes() -> None:
    frame = encode(MESSAGES[4])
    with pytest.raises(DecodeError):
        decode(frame[:-1])
    with pytest.raises(DecodeError):
        decode(frame + b"\x00")
    with pytest.raises(DecodeError):
        decode(b"\x01\x63" + frame[2:])
