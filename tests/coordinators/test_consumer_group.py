"""KIP-848 consumer groups, driven deterministically with ``task.Clock`` and simulated clients.

A ``Client`` behaves like a KIP-848 consumer: it adopts every assignment it receives (dropping
what is no longer in it, taking what is new) and reports what it owns on every heartbeat. The
invariant checked after every step is the protocol's promise: no partition is ever owned by two
clients at once, and the coordinator never hands out a partition another member still holds.
"""
from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from kio.schema.errors import ErrorCode as E
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from kmqkafka.coordinators.consumer_group import (
    ConsumerGroupCoordinator, HeartbeatRequest, HeartbeatResult,
)
from kmqkafka.coordinators.group import GroupCoordinator, JoinRequest

from .fakes import KeyedStore

SESSION_MS = 45000
INTERVAL_MS = 5000


@dataclass(frozen=True)
class FakeTopic:
    name: str
    topic_id: uuid.UUID
    partitions: int


class FakeTopics:
    """The TopicCatalog calls the coordinator makes: ``get(name)``, ``by_id`` and ``all()``."""

    def __init__(self, **counts: int) -> None:
        self.topics: dict[str, FakeTopic] = {}
        for name, n in counts.items():
            self.add(name, n)

    def add(self, name: str, partitions: int) -> None:
        old = self.topics.get(name)
        tid = old.topic_id if old else uuid.uuid5(uuid.NAMESPACE_DNS, name)
        self.topics[name] = FakeTopic(name, tid, partitions)

    def get(self, name: str) -> FakeTopic | None:
        return self.topics.get(name)

    def by_id(self, topic_id: uuid.UUID) -> FakeTopic | None:
        return next((t for t in self.topics.values() if t.topic_id == topic_id), None)

    def all(self) -> list[FakeTopic]:
        return sorted(self.topics.values(), key=lambda t: t.name)

    def tid(self, name: str) -> str:
        return str(self.topics[name].topic_id)


def result(d: Deferred) -> Any:
    out: list[Any] = []
    d.addBoth(out.append)
    assert out, "still waiting"
    return out[0]


class Harness:
    def __init__(self, store: KeyedStore | None = None, topics: FakeTopics | None = None,
                 **kw: Any) -> None:
        self.clock = Clock()
        self.store = store or KeyedStore()
        self.topics = topics or FakeTopics(t=6)
        self.classic = GroupCoordinator(self.clock, self.store)
        self.c = ConsumerGroupCoordinator(self.clock, self.store, self.topics, self.classic, **kw)
        self.classic.consumer_groups = self.c
        self.classic.load()
        self.c.load()

    def hb(self, **kw: Any) -> HeartbeatResult:
        kw.setdefault("group_id", "g")
        return result(self.c.heartbeat(HeartbeatRequest(**kw)))

    def client(self, member_id: str, topics: tuple[str, ...] = ("t",), **kw: Any) -> "Client":
        return Client(self, member_id, topics, **kw)

    def tps(self, c: "Client") -> set[tuple[str, int]]:
        return {(t, p) for t, ps in c.owned.items() for p in ps}


@dataclass
class Client:
    h: Harness
    member_id: str
    topics: tuple[str, ...]
    assignor: str | None = None
    instance: str | None = None
    regex: str | None = None
    epoch: int = 0
    owned: dict[str, frozenset[int]] = field(default_factory=dict)
    last: HeartbeatResult | None = None

    def heartbeat(self) -> HeartbeatResult:
        joining = self.epoch == 0
        r = self.h.hb(member_id=self.member_id, member_epoch=self.epoch,
                      instance_id=self.instance,
                      rebalance_timeout_ms=60000 if joining else -1,
                      subscribed_topic_names=self.topics if joining else None,
                      subscribed_topic_regex=self.regex if joining else None,
                      server_assignor=self.assignor if joining else None,
                      owned={} if joining else dict(self.owned))
        self.last = r
        if r.error is E.none:
            self.epoch = r.member_epoch
            if r.assignment is not None:
                self.owned = dict(r.assignment)
        return r

    def leave(self) -> HeartbeatResult:
        r = self.h.hb(member_id=self.member_id, member_epoch=-1, instance_id=self.instance)
        self.owned, self.epoch = {}, -1
        return r

    def partitions(self) -> set[tuple[str, int]]:
        return {(t, p) for t, ps in self.owned.items() for p in ps}


def assert_no_overlap(h: Harness, clients: list[Client]) -> None:
    seen: dict[tuple[str, int], str] = {}
    for c in clients:
        for tp in c.partitions():
            assert tp not in seen, f"{tp} owned by {seen[tp]} and {c.member_id}"
            seen[tp] = c.member_id
    held: dict[tuple[str, int], str] = {}
    for group in h.c.groups.values():
        for m in group.members.values():
            for tp in m.holds():
                assert tp not in held, f"coordinator gave {tp} to {held[tp]} and {m.member_id}"
                held[tp] = m.member_id


def settle(h: Harness, clients: list[Client], rng: random.Random, rounds: int = 40) -> None:
    """Heartbeat clients in a seeded random order, checking the invariant after every call."""
    for _ in range(rounds):
        c = rng.choice(clients)
        assert c.heartbeat().error is E.none
        assert_no_overlap(h, clients)
    for _ in range(4):  # then a few orderly passes so everyone converges
        for c in clients:
            assert c.heartbeat().error is E.none
            assert_no_overlap(h, clients)


def all_partitions(h: Harness, *topics: str) -> set[tuple[str, int]]:
    return {(h.topics.tid(t), p) for t in topics for p in range(h.topics.get(t).partitions)}


# --- joining and assignment -----------------------------------------------------------


def test_first_member_creates_the_group_and_gets_every_partition() -> None:
    h = Harness()
    a = h.client("a")
    r = a.heartbeat()
    assert r.error is E.none and r.member_epoch == 1 and r.heartbeat_interval_ms == INTERVAL_MS
    assert a.partitions() == all_partitions(h, "t")
    assert h.c.describe("g").state == "Stable"
    # A heartbeat that changes nothing carries no assignment and writes nothing.
    puts = h.store.puts
    r = a.heartbeat()
    assert r.assignment is None and r.member_epoch == 1 and h.store.puts == puts


@pytest.mark.parametrize("seed", range(6))
def test_one_to_three_members_reconcile_without_overlap(seed: int) -> None:
    """Members join one by one; partitions move only after their owner revoked them."""
    h = Harness()
    rng = random.Random(seed)
    clients = [h.client("a")]
    clients[0].heartbeat()
    for name in ("b", "c"):
        clients.append(h.client(name))
        clients[-1].heartbeat()
        assert_no_overlap(h, clients)
        settle(h, clients, rng)
    owned = [c.partitions() for c in clients]
    assert set().union(*owned) == all_partitions(h, "t")
    assert sorted(len(o) for o in owned) == [2, 2, 2]
    group = h.c.groups["g"]
    assert group.epoch == 3 and all(c.epoch == 3 for c in clients)
    assert h.c.describe("g").state == "Stable"


def test_revocation_comes_before_assignment() -> None:
    h = Harness()
    a, b = h.client("a"), h.client("b")
    a.heartbeat()
    b.heartbeat()
    assert b.partitions() == set(), "b must wait: a still owns everything"
    assert b.epoch == 2
    r = a.heartbeat()  # a learns to give up three partitions, keeping its epoch
    assert r.member_epoch == 1 and len(a.partitions()) == 3
    assert h.c.describe("g").state == "Reconciling"
    a.heartbeat()  # a reports the smaller set: it now moves to epoch 2
    assert a.epoch == 2
    b.heartbeat()
    assert len(b.partitions()) == 3 and not a.partitions() & b.partitions()


def test_leave_gives_partitions_to_the_others() -> None:
    h = Harness()
    a, b = h.client("a"), h.client("b")
    clients = [a, b]
    settle(h, clients, random.Random(1), rounds=10)
    r = a.leave()
    assert r.error is E.none and r.member_epoch == -1
    b.heartbeat()
    assert b.partitions() == all_partitions(h, "t")
    assert list(h.c.groups["g"].members) == ["b"]
    b.leave()
    assert h.c.describe("g").state == "Empty"


# --- fencing and errors ---------------------------------------------------------------


def test_epochs_are_fenced() -> None:
    h = Harness()
    a = h.client("a")
    a.heartbeat()
    assert h.hb(member_id="a", member_epoch=5).error is E.fenced_member_epoch
    h.client("b").heartbeat()  # group epoch 2
    a.heartbeat()
    a.heartbeat()
    assert a.epoch == 2
    # The previous epoch is accepted when what it owns is part of the assignment (lost ack).
    assert h.hb(member_id="a", member_epoch=1, owned=dict(a.owned)).error is E.none
    assert h.hb(member_id="a", member_epoch=0, owned={}).error is E.invalid_request
    assert h.hb(member_id="zz", member_epoch=3).error is E.unknown_member_id
    assert h.hb(group_id="nope", member_id="x", member_epoch=1).error is E.group_id_not_found


def test_a_fenced_member_rejoins_with_epoch_zero_and_drops_everything() -> None:
    h = Harness()
    a = h.client("a")
    a.heartbeat()
    a.epoch = 0
    r = a.heartbeat()
    assert r.error is E.none and r.member_epoch == 1 and a.partitions() == all_partitions(h, "t")


@pytest.mark.parametrize("kw,code", [
    (dict(group_id="", member_id="a", member_epoch=0), E.invalid_request),
    (dict(member_id="", member_epoch=0, rebalance_timeout_ms=1, subscribed_topic_names=("t",),
          owned={}), E.invalid_request),
    (dict(member_id="a", member_epoch=0, subscribed_topic_names=("t",), owned={}),
     E.invalid_request),
    (dict(member_id="a", member_epoch=0, rebalance_timeout_ms=1, owned={}), E.invalid_request),
    (dict(member_id="a", member_epoch=-3), E.invalid_request),
    (dict(member_id="a", member_epoch=-2), E.invalid_request),
    (dict(member_id="a", member_epoch=0, rebalance_timeout_ms=1, subscribed_topic_names=("t",),
          owned={}, server_assignor="sticky"), E.unsupported_assignor),
    (dict(member_id="a", member_epoch=0, rebalance_timeout_ms=1, subscribed_topic_regex="(",
          owned={}), E.invalid_regular_expression),
])
def test_invalid_requests(kw: dict[str, Any], code: E) -> None:
    r = Harness().hb(**kw)
    assert r.error is code and r.message


def test_v0_member_id_is_generated_by_the_coordinator() -> None:
    h = Harness(new_id=lambda: "generated")
    r = h.hb(member_id="", member_epoch=0, rebalance_timeout_ms=1,
             subscribed_topic_names=("t",), owned={}, client_generates_id=False)
    assert r.error is E.none and r.member_id == "generated"


def test_group_size_and_group_count_limits() -> None:
    h = Harness(max_group_size=1, max_groups=1)
    h.client("a").heartbeat()
    assert h.client("b").heartbeat().error is E.group_max_size_reached
    assert h.hb(group_id="g2", member_id="c", member_epoch=0, rebalance_timeout_ms=1,
                subscribed_topic_names=("t",), owned={}).error is E.group_max_size_reached


# --- timeouts -------------------------------------------------------------------------


def test_session_timeout_expels_a_silent_member() -> None:
    h = Harness()
    a, b = h.client("a"), h.client("b")
    settle(h, [a, b], random.Random(2), rounds=6)
    for _ in range(10):  # b keeps heartbeating, a falls silent
        h.clock.advance(INTERVAL_MS / 1000)
        b.heartbeat()
    assert "a" not in h.c.groups["g"].members
    assert b.partitions() == all_partitions(h, "t")
    assert h.hb(member_id="a", member_epoch=a.epoch).error is E.unknown_member_id


def test_member_that_does_not_revoke_is_removed_after_its_rebalance_timeout() -> None:
    h = Harness()
    a, b = h.client("a"), h.client("b")
    a.heartbeat()
    b.heartbeat()
    h.hb(member_id="a", member_epoch=1)  # told to revoke; never reports doing it
    assert h.c.groups["g"].members["a"].state == "unrevoked_partitions"
    h.clock.advance(30)
    b.heartbeat()
    h.clock.advance(31)  # 61 s > the 60 s rebalance timeout
    assert "a" not in h.c.groups["g"].members
    b.heartbeat()
    assert b.partitions() == all_partitions(h, "t")


# --- assignors ------------------------------------------------------------------------


def test_range_assignor_gives_contiguous_ranges_per_topic() -> None:
    h = Harness(topics=FakeTopics(x=5, y=2))
    a = h.client("a", ("x", "y"), assignor="range")
    b = h.client("b", ("x", "y"), assignor="range")
    settle(h, [a, b], random.Random(3), rounds=10)
    x, y = h.topics.tid("x"), h.topics.tid("y")
    assert a.owned == {x: frozenset({0, 1, 2}), y: frozenset({0})}
    assert b.owned == {x: frozenset({3, 4}), y: frozenset({1})}
    assert h.c.describe("g").assignor == "range"


def test_uniform_assignor_balances_mixed_subscriptions_and_is_sticky() -> None:
    h = Harness(topics=FakeTopics(x=4, y=4))
    a, b = h.client("a", ("x",)), h.client("b", ("x", "y"))
    settle(h, [a, b], random.Random(4), rounds=10)
    assert {t for t, _ in a.partitions()} == {h.topics.tid("x")}
    assert len(a.partitions()) == 4 and len(b.partitions()) == 4
    before = b.partitions()
    c = h.client("c", ("x", "y"))
    settle(h, [a, b, c], random.Random(5), rounds=20)
    sizes = sorted(len(x.partitions()) for x in (a, b, c))
    assert sizes[-1] - sizes[0] <= 1 and sum(sizes) == 8
    assert b.partitions() <= before, "b only gave partitions away"


# --- topic changes --------------------------------------------------------------------


def test_partition_growth_bumps_the_group_and_hands_out_new_partitions() -> None:
    h = Harness(topics=FakeTopics(t=2))
    a, b = h.client("a"), h.client("b")
    settle(h, [a, b], random.Random(6), rounds=10)
    epoch = h.c.groups["g"].epoch
    h.topics.add("t", 6)
    assert h.c.partitions_added("t") == ["g"]
    assert h.c.partitions_added("t") == []  # idempotent
    assert h.c.groups["g"].epoch == epoch + 1
    settle(h, [a, b], random.Random(7), rounds=10)
    assert a.partitions() | b.partitions() == all_partitions(h, "t")
    assert len(a.partitions()) == len(b.partitions()) == 3


def test_classic_hook_also_bumps_consumer_groups() -> None:
    h = Harness(topics=FakeTopics(t=1))
    h.client("a").heartbeat()
    h.topics.add("t", 3)
    assert h.classic.rebalance_groups_subscribed_to("t") == ["g"]


def test_regex_subscription_follows_new_topics() -> None:
    h = Harness(topics=FakeTopics(**{"logs-a": 1, "other": 1}))
    a = h.client("a", ("other",), regex="logs-.*")
    a.heartbeat()
    # As Kafka: the heartbeat bringing a new regex is assigned the literal topics; the regex
    # is resolved right after, and the next heartbeat gets what it matches.
    assert a.partitions() == all_partitions(h, "other")
    h.clock.advance(0)
    a.heartbeat()
    assert a.partitions() == all_partitions(h, "logs-a", "other")
    h.topics.add("logs-b", 2)
    a.heartbeat()  # the next heartbeat notices the new matching topic
    assert a.partitions() == all_partitions(h, "logs-a", "logs-b", "other")


# --- static members -------------------------------------------------------------------


def test_static_member_leaves_temporarily_and_rejoins_with_its_assignment() -> None:
    h = Harness()
    a, b = h.client("a", instance="i-a"), h.client("b")
    settle(h, [a, b], random.Random(8), rounds=10)
    mine, epoch = a.partitions(), h.c.groups["g"].epoch
    r = h.hb(member_id="a", member_epoch=-2, instance_id="i-a")
    assert r.error is E.none and r.member_epoch == -2
    b.heartbeat()
    assert not b.partitions() & mine, "a's partitions are kept for it"
    assert h.client("a2", instance="i-x").heartbeat().error is E.none  # someone else is fine
    a2 = h.client("a-new", instance="i-a")
    r = a2.heartbeat()
    assert r.error is E.none and r.assignment is not None
    assert set(r.assignment) and a2.partitions() <= mine
    assert "a" not in h.c.groups["g"].members


def test_static_instance_in_use_is_unreleased_and_fenced() -> None:
    h = Harness()
    a = h.client("a", instance="i")
    a.heartbeat()
    assert h.client("b", instance="i").heartbeat().error is E.unreleased_instance_id
    assert h.hb(member_id="b", member_epoch=1, instance_id="i").error is E.fenced_instance_id


def test_static_member_expires_after_its_session() -> None:
    h = Harness()
    a = h.client("a", instance="i")
    a.heartbeat()
    h.hb(member_id="a", member_epoch=-2, instance_id="i")
    h.clock.advance(SESSION_MS / 1000 + 1)
    assert h.c.describe("g").state == "Empty"


# --- durability and group types -------------------------------------------------------


def test_state_survives_a_restart() -> None:
    h = Harness()
    a, b = h.client("a"), h.client("b", instance="ib")
    settle(h, [a, b], random.Random(9), rounds=10)
    h.c.stop()
    h2 = Harness(store=h.store, topics=h.topics)
    g1, g2 = h.c.groups["g"], h2.c.groups["g"]
    assert (g2.epoch, g2.assignment_epoch, g2.target) == (g1.epoch, g1.assignment_epoch, g1.target)
    assert {m: x.assigned for m, x in g2.members.items()} == {
        m: x.assigned for m, x in g1.members.items()}
    assert g2.static_members == {"ib": "b"}
    a.h = b.h = h2
    assert a.heartbeat().error is E.none and a.last.assignment is None
    assert "g" not in h2.classic.groups


def test_group_kinds_convert_when_empty_and_refuse_undecodable_members() -> None:
    """Members of the other protocol join a non-empty group (``test_group_migration``), but
    only with a consumer-protocol subscription Kafka can read; an empty group converts."""
    h = Harness()
    a = h.client("a")
    a.heartbeat()
    join = JoinRequest("g", "", None, "consumer", (("range", b""),), 10000, 10000,
                       require_known_member_id=False)
    assert result(h.classic.join(join)).error is E.inconsistent_group_protocol
    # Once empty, a consumer group converts to a classic one, as in Kafka.
    h.hb(member_id="a", member_epoch=-1)
    assert h.c.describe("g").state == "Empty"
    assert result(h.classic.join(join)).error is E.none
    assert not h.c.owns("g") and "g" in h.classic.groups
    result(h.classic.join(JoinRequest("cg", "", None, "consumer", (("range", b""),), 10000,
                                      10000, require_known_member_id=False)))
    r = h.hb(group_id="cg", member_id="x", member_epoch=0, rebalance_timeout_ms=1,
             subscribed_topic_names=("t",), owned={})
    assert r.error is E.group_id_not_found


def test_offset_commit_and_fetch_checks() -> None:
    h = Harness()
    a = h.client("a")
    a.heartbeat()
    assert h.c.validate_commit("g", "a", 1) is E.none
    assert h.c.validate_commit("g", "a", 2) is E.stale_member_epoch  # any mismatch, as Kafka
    assert h.c.validate_fetch("g", "a", 2) is E.stale_member_epoch
    assert h.c.validate_commit("g", "a", 0) is E.stale_member_epoch
    assert h.c.validate_commit("g", "zz", 1) is E.unknown_member_id
    assert h.c.validate_commit("g", "a", 1, api_version=8) is E.unsupported_version
    assert h.c.validate_fetch("g", None, -1) is E.none
    assert h.c.validate_fetch("g", "a", 1) is E.none
    assert h.c.validate_fetch("g", "a", 0) is E.stale_member_epoch
    a.leave()
    assert h.c.validate_commit("g", "", -1) is E.none
    assert h.c.validate_commit("g", "someone", -1) is E.none  # empty group: any member id


def test_offset_expiry_keeps_subscribed_topics_and_removes_an_empty_group() -> None:
    """KIP-848 groups under offsets.retention: offsets of topics no member subscribes to
    expire from their commit; an empty group goes once its offsets have."""
    from kmqkafka.coordinators.offsets import CommittedOffset

    day_ms = 86_400_000
    h = Harness(topics=FakeTopics(t=6, u=1))
    h.clock.advance(3 * day_ms / 1000)
    a = h.client("a")
    a.heartbeat()
    old = int(h.clock.seconds() * 1000) - 2 * day_ms
    result(h.classic.commit_offsets("g", [("t", 0, CommittedOffset(5, -1, "", old)),
                                          ("u", 0, CommittedOffset(5, -1, "", old))]))
    assert result(h.classic.expire_offsets(day_ms)) == []
    assert list(h.classic.fetch_offsets("g")) == [("t", 0)]
    a.leave()
    assert result(h.classic.expire_offsets(day_ms)) == ["g"]
    assert h.c.describe("g") is None
    assert h.classic.fetch_offsets("g") == {}
