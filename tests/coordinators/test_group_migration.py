"""Online migration between classic and KIP-848 groups, driven with ``task.Clock``.

A ``ClassicClient`` behaves like an eager classic consumer (it drops everything before it joins
and takes what SyncGroup hands it) or a cooperative one (it reports what it owns in its
subscription and drops only what the new assignment leaves out). The invariant of the KIP-848
tests holds across both kinds of member: no partition is ever owned by two clients.
"""
from __future__ import annotations

import io
import random
import struct
from dataclasses import dataclass, field
from typing import Any

import pytest

from kio.schema.consumer_protocol_subscription.v1.data import (
    ConsumerProtocolSubscription as Sub, TopicPartition as SubTP,
)
from kio.schema.errors import ErrorCode as E
from kio.serial import entity_writer
from kio.static.primitive import i32

from kmqkafka.coordinators.consumer_protocol import decode_assignment, encode_assignment
from kmqkafka.coordinators.group import GroupLog, GroupState, JoinRequest

from .test_consumer_group import Client, Harness, all_partitions, assert_no_overlap, result

REBALANCE_MS = 20000
CLASSIC_SESSION_MS = 10000


def subscription(topics: tuple[str, ...], owned: dict[str, set[int]]) -> bytes:
    out = io.BytesIO()
    out.write(struct.pack(">h", 1))
    entity_writer(Sub)(out, Sub(topics=topics, user_data=None, owned_partitions=tuple(
        SubTP(topic=t, partitions=tuple(i32(p) for p in sorted(ps)))
        for t, ps in sorted(owned.items()) if ps)))
    return out.getvalue()


@dataclass
class ClassicClient:
    h: Harness
    member_id: str = ""
    topics: tuple[str, ...] = ("t",)
    instance: str | None = None
    cooperative: bool = False
    generation: int = -1
    owned: dict[str, set[int]] = field(default_factory=dict)  # topic name -> partitions

    def join(self) -> Any:
        if not self.cooperative:
            self.owned = {}
        # Both assignors, the client's own first (as librdkafka lists what it is configured
        # with): a group's classic members need one protocol in common.
        metadata = subscription(self.topics, self.owned)
        names = ("cooperative-sticky", "range") if self.cooperative else (
            "range", "cooperative-sticky")
        req = JoinRequest("g", self.member_id, self.instance, "consumer",
                          tuple((n, metadata) for n in names), CLASSIC_SESSION_MS, REBALANCE_MS)
        r = result(self.h.classic.join(req))
        if r.error is E.member_id_required:
            self.member_id = r.member_id
            return self.join()
        if r.error is E.none:
            self.member_id, self.generation = r.member_id, r.generation_id
        return r

    def sync(self, assignments: dict[str, bytes] | None = None) -> Any:
        r = result(self.h.classic.sync("g", self.member_id, self.instance, self.generation,
                                       "consumer", None, assignments or {}))
        if r.error is E.none:
            self.owned = {t: set(ps) for t, ps in decode_assignment(r.assignment).items()}
        return r

    def heartbeat(self) -> E:
        return self.h.classic.heartbeat("g", self.member_id, self.instance, self.generation)

    def step(self) -> E:
        """What a classic consumer does on its heartbeat: rejoin when told, then sync."""
        code = self.heartbeat()
        if code is E.rebalance_in_progress:
            assert self.join().error is E.none
            assert self.sync().error is E.none
            return E.none
        return code

    def partitions(self) -> set[tuple[str, int]]:
        return {(self.h.topics.tid(t), p) for t, ps in self.owned.items() for p in ps}


def classic_group(h: Harness, **kw: Any) -> ClassicClient:
    """A Stable classic group with one member that owns all of ``t``."""
    a = ClassicClient(h, **kw)
    assert a.join().error is E.none
    everything = encode_assignment({"t": frozenset(range(6))}, 1)
    assert a.sync({a.member_id: everything}).error is E.none
    assert h.classic.groups["g"].state is GroupState.STABLE
    return a


def settle(h: Harness, clients: list[Any], rng: random.Random, rounds: int = 40) -> None:
    for _ in range(rounds):
        c = rng.choice(clients)
        code = c.step() if isinstance(c, ClassicClient) else c.heartbeat().error
        assert code is E.none
        assert_no_overlap(h, clients)
    for _ in range(4):
        for c in clients:
            code = c.step() if isinstance(c, ClassicClient) else c.heartbeat().error
            assert code is E.none
            assert_no_overlap(h, clients)


def test_a_kip848_member_upgrades_a_classic_group_that_keeps_its_member() -> None:
    h = Harness()
    a = classic_group(h)
    b = h.client("b")
    r = b.heartbeat()
    assert r.error is E.none
    assert h.c.owns("g") and "g" not in h.classic.groups
    group = h.c.groups["g"]
    member = group.members[a.member_id]
    # The classic member keeps its generation as its epoch and what it was assigned; b waits
    # for a to give up half.
    assert member.classic is not None and member.previous_epoch == 1
    assert member.assigned == {h.topics.tid("t"): frozenset(range(6))}
    assert group.epoch == 2 and b.partitions() == set()
    assert a.heartbeat() is E.rebalance_in_progress
    settle(h, [a, b], random.Random(1))
    assert a.partitions() | b.partitions() == all_partitions(h, "t")
    assert len(a.partitions()) == len(b.partitions()) == 3
    view = h.c.describe("g")
    assert view.state == "Stable" and {m.member_id: m.classic for m in view.members} == {
        a.member_id: True, "b": False}
    # The classic generation is the member epoch: commits check it as ILLEGAL_GENERATION, at
    # any OffsetCommit version.
    assert h.c.validate_commit("g", a.member_id, a.generation, api_version=2) is E.none
    assert h.c.validate_commit("g", a.member_id, a.generation - 1, api_version=2) is (
        E.illegal_generation)


def test_cooperative_classic_members_revoke_before_the_new_member_gets_anything() -> None:
    h = Harness()
    a = classic_group(h, cooperative=True)
    b = h.client("b")
    b.heartbeat()
    assert a.heartbeat() is E.rebalance_in_progress
    assert a.join().error is E.none
    assert a.sync().error is E.none
    kept = a.partitions()
    assert len(kept) == 3, "the answer takes away what b is to get"
    assert b.heartbeat().error is E.none and b.partitions() == set(), "a still reports them"
    assert a.heartbeat() is E.rebalance_in_progress  # it must say it let them go
    assert a.step() is E.none and a.partitions() == kept
    assert b.heartbeat().error is E.none
    assert b.partitions() == all_partitions(h, "t") - kept


def test_classic_members_join_a_consumer_group_and_the_last_kip848_leaver_downgrades_it() -> None:
    h = Harness()
    b = h.client("b")
    b.heartbeat()
    a = ClassicClient(h)
    assert a.join().error is E.none and a.member_id  # MEMBER_ID_REQUIRED first, then in
    assert a.sync().error is E.none
    assert a.partitions() == set() and a.heartbeat() is E.none
    settle(h, [a, b], random.Random(2))
    assert len(a.partitions()) == 3
    epoch = h.c.groups["g"].epoch
    assert b.leave().error is E.none
    assert not h.c.owns("g")
    group = h.classic.groups["g"]
    # A Stable classic group at generation = group epoch, rebalancing at once; its record
    # holds the member and its target assignment.
    assert group.generation_id == epoch and group.state is GroupState.PREPARING_REBALANCE
    key, value = GroupLog.record(group)
    stored = h.store.families["groups"][key]
    replayed = GroupLog.replay(stored, "g")
    assert [m.member_id for m in replayed.members.values()] == [a.member_id]
    assert decode_assignment(replayed.members[a.member_id].assignment) == {
        "t": frozenset(p for _, p in a.partitions())}
    assert a.heartbeat() is E.rebalance_in_progress
    r = a.join()
    assert r.error is E.none and r.leader == a.member_id and r.generation_id == epoch + 1


def test_a_mixed_group_survives_a_restart() -> None:
    h = Harness()
    a = classic_group(h)
    b = h.client("b")
    b.heartbeat()
    settle(h, [a, b], random.Random(3))
    h.c.stop()
    h.classic.stop()
    h2 = Harness(store=h.store, topics=h.topics)
    member = h2.c.groups["g"].members[a.member_id]
    assert member.classic is not None and member.classic.session_timeout_ms == CLASSIC_SESSION_MS
    a.h = b.h = h2
    assert a.heartbeat() is E.none and b.heartbeat().error is E.none
    # Its own session timeout, not the KIP-848 one, applies after the restart.
    h2.clock.advance(CLASSIC_SESSION_MS / 1000 + 1)
    assert a.member_id not in h2.c.groups["g"].members


def test_classic_calls_are_checked_as_kafka_checks_them() -> None:
    h = Harness()
    a = classic_group(h, instance="ia")
    h.client("b").heartbeat()
    gen = a.generation
    assert h.classic.heartbeat("g", "nobody", None, gen) is E.unknown_member_id
    assert h.classic.heartbeat("g", "b", None, 2) is E.unknown_member_id  # not classic
    assert h.classic.heartbeat("g", a.member_id, "other", gen) is E.unknown_member_id
    assert h.classic.heartbeat("g", "x", "ia", gen) is E.fenced_instance_id
    assert h.classic.heartbeat("g", a.member_id, "ia", gen + 5) is E.illegal_generation
    sync = result(h.classic.sync("g", a.member_id, "ia", gen, "consumer", "roundrobin", {}))
    assert sync.error is E.inconsistent_group_protocol
    sync = result(h.classic.sync("g", a.member_id, "ia", gen, "consumer", "range", {}))
    assert sync.error is E.rebalance_in_progress  # the group epoch moved past it
    bad = JoinRequest("g", "", None, "consumer", (("roundrobin", subscription(("t",), {})),),
                      CLASSIC_SESSION_MS, REBALANCE_MS)
    assert result(h.classic.join(bad)).error is E.inconsistent_group_protocol
    garbled = JoinRequest("g", "", None, "consumer", (("range", b"\x00"),),
                          CLASSIC_SESSION_MS, REBALANCE_MS)
    assert result(h.classic.join(garbled)).error is E.inconsistent_group_protocol


def test_a_classic_member_that_does_not_rejoin_or_sync_in_time_is_fenced() -> None:
    h = Harness()
    a = classic_group(h)
    b = h.client("b")
    b.heartbeat()
    assert a.heartbeat() is E.rebalance_in_progress
    for _ in range(3):  # heartbeats alone keep the session, not the rebalance
        h.clock.advance(REBALANCE_MS / 1000 / 4)
        a.heartbeat()
    h.clock.advance(REBALANCE_MS / 1000)
    assert a.member_id not in h.c.groups["g"].members
    b.heartbeat()
    assert b.heartbeat().error is E.none and b.partitions() == all_partitions(h, "t")
    c = ClassicClient(h)
    assert c.join().error is E.none
    h.clock.advance(REBALANCE_MS / 1000 + 1)  # never syncs
    assert c.member_id not in h.c.groups["g"].members


def test_the_policy_can_refuse_conversions() -> None:
    h = Harness(migration_policy="disabled")
    a = classic_group(h)
    r = h.client("b").heartbeat()
    assert r.error is E.group_id_not_found
    assert "online upgrade is disabled" in r.message and a.heartbeat() is E.none
    h = Harness(migration_policy="upgrade")
    a = classic_group(h)
    b = h.client("b")
    b.heartbeat()
    settle(h, [a, b], random.Random(4))
    b.leave()
    assert h.c.owns("g") and h.c.describe("g").state != "Empty", "no downgrade"


def test_a_custom_assignors_user_data_refuses_the_upgrade() -> None:
    from kio.schema.consumer_protocol_assignment.v1.data import (
        ConsumerProtocolAssignment as A, TopicPartition as TP,
    )
    h = Harness()
    a = ClassicClient(h)
    a.join()
    out = io.BytesIO()
    out.write(struct.pack(">h", 1))
    entity_writer(A)(out, A(assigned_partitions=(TP(topic="t", partitions=(i32(0),)),),
                            user_data=b"mine"))
    assert result(h.classic.sync("g", a.member_id, None, a.generation, "consumer", None,
                                 {a.member_id: out.getvalue()})).error is E.none
    r = h.client("b").heartbeat()
    assert r.error is E.group_id_not_found and "user data" in r.message
    assert "g" in h.classic.groups and a.heartbeat() is E.none


def test_assignments_round_trip_in_every_embedded_version() -> None:
    for version in range(4):
        data = encode_assignment({"t": frozenset({0, 2}), "u": frozenset({1})}, version)
        assert struct.unpack_from(">h", data)[0] == version
        assert decode_assignment(data) == {"t": frozenset({0, 2}), "u": frozenset({1})}
    assert decode_assignment(b"") == {}


_ = Client  # the KIP-848 client type used through Harness.client


def _leave(h: Harness, c: Any) -> None:
    """A client leaves: a KIP-848 member by heartbeat, a classic one by LeaveGroup (which
    the LeaveGroup handler sends to the consumer group while the group is one)."""
    if isinstance(c, ClassicClient):
        errors, written = h.c.leave_members("g", [(c.member_id, c.instance)])
        assert errors == [E.none] and result(written) is None
        c.owned, c.generation = {}, -1
    else:
        assert c.leave().error is E.none


@pytest.mark.parametrize("seed", range(20))
def test_random_mixed_membership_never_gives_a_partition_to_two_members(seed: int) -> None:
    """Classic members (eager and cooperative) and KIP-848 members join, heartbeat, rejoin and
    leave in a seeded random order while one KIP-848 member stays; after every call no
    partition is owned by two clients, and once calm the group converges on a full split."""
    rng = random.Random(seed)
    h = Harness()
    first = classic_group(h, cooperative=rng.random() < 0.5)
    anchor = h.client("anchor")
    anchor.heartbeat()
    live: list[Any] = [first, anchor]
    names = iter(f"m{i}" for i in range(1000))
    for _ in range(120):
        roll = rng.random()
        if roll < 0.12 and len(live) < 6:
            if rng.random() < 0.5:
                c: Any = ClassicClient(h, cooperative=rng.random() < 0.5)
                assert c.join().error is E.none and c.sync().error is E.none
            else:
                c = h.client(next(names))
                assert c.heartbeat().error is E.none
            live.append(c)
        elif roll < 0.2 and len(live) > 2:
            c = rng.choice([x for x in live if x is not anchor])
            _leave(h, c)
            live.remove(c)
        else:
            c = rng.choice(live)
            code = c.step() if isinstance(c, ClassicClient) else c.heartbeat().error
            assert code is E.none
        assert h.c.owns("g")
        assert_no_overlap(h, live)
    settle(h, live, rng, rounds=0)
    settle(h, live, rng, rounds=0)
    owned = [c.partitions() for c in live]
    assert set().union(*owned) == all_partitions(h, "t")
    assert sum(map(len, owned)) == 6


def test_a_static_member_rolled_back_to_classic_in_place_of_the_last_kip848_one_downgrades() -> None:
    """Kafka's validateOnlineDowngradeWithReplacedMember: the KIP-848 static member ``i`` comes
    back as a classic member (JoinGroup, same instance id, no member id); the group turns
    classic and its coordinator takes the join."""
    h = Harness()
    a = classic_group(h)
    s = h.client("s", instance="i")
    s.heartbeat()
    settle(h, [a, s], random.Random(5))
    assert h.c.owns("g")
    back = ClassicClient(h, instance="i")
    pending = h.classic.join(JoinRequest(
        "g", "", "i", "consumer", (("range", subscription(("t",), {})),),
        CLASSIC_SESSION_MS, REBALANCE_MS))
    assert not h.c.owns("g") and "g" in h.classic.groups
    assert h.classic.groups["g"].state is GroupState.PREPARING_REBALANCE
    assert a.heartbeat() is E.rebalance_in_progress
    joined = a.join()  # the last member to rejoin completes the classic rebalance
    assert joined.error is E.none
    r = result(pending)
    assert r.error is E.none and r.generation_id == joined.generation_id
    back.member_id, back.generation = r.member_id, r.generation_id
    leader = a if joined.leader == a.member_id else back
    assert leader.member_id == joined.leader
