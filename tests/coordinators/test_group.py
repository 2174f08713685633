"""The classic group state machine, driven deterministically with ``task.Clock``."""
from __future__ import annotations

import io
import struct
from typing import Any

import pytest
from kio.schema.consumer_protocol_subscription.v1.data import ConsumerProtocolSubscription
from kio.schema.errors import ErrorCode as E
from kio.serial import entity_writer
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from kmqkafka.coordinators.group import (
    GroupCoordinator, GroupState, JoinRequest, JoinResult, SyncResult, subscription_topics,
)
from kmqkafka.coordinators.offsets import CommittedOffset

from .fakes import KeyedStore

SESSION = 10_000
REBALANCE = 30_000


def subscription(*topics: str) -> bytes:
    buf = io.BytesIO()
    entity_writer(ConsumerProtocolSubscription)(
        buf, ConsumerProtocolSubscription(topics=tuple(topics), user_data=None,
                                          owned_partitions=()))
    return struct.pack(">h", 1) + buf.getvalue()


def result(d: Deferred) -> Any:
    """The result a Deferred already has (fails the test if it is still parked)."""
    out: list[Any] = []
    d.addBoth(out.append)
    assert out, "still parked"
    return out[0]


def parked(d: Deferred) -> bool:
    out: list[Any] = []
    d.addBoth(lambda r: (out.append(r), r)[1])
    return not out


class Harness:
    def __init__(self, **kw: Any) -> None:
        self.clock = Clock()
        self.store = KeyedStore()
        self.c = GroupCoordinator(self.clock, self.store, new_id=self._ids(), **kw)
        self.c.load()

    @staticmethod
    def _ids() -> Any:
        n = iter(range(1, 10**6))
        return lambda: f"id{next(n)}"

    def join(self, member_id: str = "", group: str = "g", instance: str | None = None,
             protocols: tuple[tuple[str, bytes], ...] | None = None, ptype: str = "consumer",
             session: int = SESSION, rebalance: int = REBALANCE, version4: bool = True,
             client: str = "c") -> Deferred:
        return self.c.join(JoinRequest(
            group_id=group, member_id=member_id, group_instance_id=instance, protocol_type=ptype,
            protocols=protocols if protocols is not None else (("range", subscription("t")),),
            session_timeout_ms=session, rebalance_timeout_ms=rebalance, client_id=client,
            client_host="/127.0.0.1", require_known_member_id=version4))

    def new_member(self, group: str = "g", **kw: Any) -> tuple[str, Deferred]:
        """KIP-394 two-step join; returns (member id, parked-or-done Deferred)."""
        first = result(self.join("", group=group, **kw))
        assert first.error is E.member_id_required
        return first.member_id, self.join(first.member_id, group=group, **kw)

    def sync(self, member_id: str, generation: int, assignments: dict[str, bytes] | None = None,
             group: str = "g", instance: str | None = None) -> Deferred:
        return self.c.sync(group, member_id, instance, generation, None, None, assignments or {})

    def state(self, group: str = "g") -> GroupState:
        return self.c.groups[group].state

    def stable_pair(self) -> tuple[str, str, int]:
        """Two dynamic members in a Stable group; returns (leader, follower, generation)."""
        a, ja = self.new_member()
        ra = result(ja)
        result(self.sync(a, ra.generation_id, {a: b"A"}))
        b, jb = self.new_member()
        assert parked(jb)
        assert self.c.heartbeat("g", a, None, ra.generation_id) is E.rebalance_in_progress
        ja2 = self.join(a)
        ra2, rb = result(ja2), result(jb)
        assert ra2.generation_id == rb.generation_id == ra.generation_id + 1
        sb = self.sync(b, rb.generation_id)
        assert parked(sb)
        sa = result(self.sync(a, ra2.generation_id, {a: b"A2", b: b"B2"}))
        assert sa.assignment == b"A2" and result(sb).assignment == b"B2"
        return a, b, ra2.generation_id


def test_single_member_join_sync_becomes_stable() -> None:
    h = Harness()
    member, d = h.new_member()
    r: JoinResult = result(d)
    assert r.error is E.none and r.member_id == member and r.leader == member
    assert r.generation_id == 1 and r.protocol_name == "range"
    assert [m.member_id for m in r.members] == [member]
    assert h.state() is GroupState.COMPLETING_REBALANCE
    s: SyncResult = result(h.sync(member, 1, {member: b"assign"}))
    assert s.error is E.none and s.assignment == b"assign" and s.protocol_type == "consumer"
    assert h.state() is GroupState.STABLE
    assert h.c.heartbeat("g", member, None, 1) is E.none


def test_old_join_version_adds_member_without_member_id_required() -> None:
    h = Harness()
    r = result(h.join("", version4=False))
    assert r.error is E.none and r.member_id.startswith("c-")


def test_second_member_rebalance_leader_gets_members_follower_waits_for_leader() -> None:
    h = Harness()
    a, b, gen = h.stable_pair()
    assert gen == 2 and h.state() is GroupState.STABLE
    desc = h.c.describe("g")
    assert desc is not None and desc.state == "Stable" and len(desc.members) == 2


def test_follower_only_gets_member_list_if_leader() -> None:
    h = Harness()
    a, ja = h.new_member()
    result(h.sync(a, result(ja).generation_id, {a: b""}))
    b, jb = h.new_member()
    ra = result(h.join(a))
    rb = result(jb)
    assert len(ra.members) == 2 and rb.members == () and rb.leader == a


def test_rebalance_timeout_removes_members_that_did_not_rejoin() -> None:
    h = Harness()
    a, ja = h.new_member()
    result(h.sync(a, 1, {a: b""}))
    b, jb = h.new_member(rebalance=5000)
    assert parked(jb)
    for _ in range(5):  # a still heartbeats, but never rejoins
        h.clock.advance(5)
        assert h.c.heartbeat("g", a, None, 1) is E.rebalance_in_progress
    assert parked(jb)
    h.clock.advance(5)
    rb = result(jb)
    assert rb.error is E.none and rb.leader == b and rb.generation_id == 2
    assert a not in h.c.groups["g"].members
    assert h.c.heartbeat("g", a, None, 1) is E.unknown_member_id


def test_session_timeout_expels_member_and_rebalances() -> None:
    h = Harness()
    a, b, gen = h.stable_pair()
    for _ in range(3):  # a keeps heart-beating, b is silent
        h.clock.advance(SESSION / 1000 / 2)
        h.c.heartbeat("g", a, None, gen)
    assert b not in h.c.groups["g"].members
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert h.c.heartbeat("g", a, None, gen) is E.rebalance_in_progress
    r = result(h.join(a))
    assert r.generation_id == gen + 1 and [m.member_id for m in r.members] == [a]


def test_leave_triggers_rebalance_and_empty_group_bumps_generation() -> None:
    h = Harness()
    a, b, gen = h.stable_pair()
    top, errors = h.c.leave("g", [(b, None), ("nope", None)])
    assert top is E.none and errors == [E.none, E.unknown_member_id]
    assert h.state() is GroupState.PREPARING_REBALANCE
    result(h.join(a))
    h.c.leave("g", [(a, None)])
    # a was awaiting sync in CompletingRebalance; leaving empties the group.
    assert h.state() is GroupState.PREPARING_REBALANCE or h.state() is GroupState.EMPTY
    h.clock.advance(REBALANCE)
    assert h.state() is GroupState.EMPTY


def test_leave_unknown_group() -> None:
    h = Harness()
    assert h.c.leave("nope", [("m", None)])[0] is E.unknown_member_id


def test_protocol_selected_by_votes() -> None:
    h = Harness()
    m = subscription("t")
    a, ja = h.new_member(protocols=(("range", m), ("roundrobin", m)))
    result(h.sync(a, 1, {}))
    b, jb = h.new_member(protocols=(("roundrobin", m), ("range", m)))
    c, jc = h.new_member(protocols=(("roundrobin", m), ("range", m), ("sticky", m)))
    ra = result(h.join(a, protocols=(("range", m), ("roundrobin", m))))
    assert ra.protocol_name == "roundrobin" and result(jc).protocol_name == "roundrobin"


def test_inconsistent_group_protocol() -> None:
    h = Harness()
    a, ja = h.new_member()
    result(h.sync(a, 1, {}))
    assert result(h.join("", ptype="connect")).error is E.inconsistent_group_protocol
    r = result(h.join("", protocols=(("roundrobin", b""),)))
    assert r.error is E.inconsistent_group_protocol
    assert result(h.join("", group="new", protocols=())).error is E.inconsistent_group_protocol
    assert result(h.join("", group="new2", ptype="")).error is E.inconsistent_group_protocol


def test_invalid_group_id_and_session_timeout() -> None:
    h = Harness()
    assert result(h.join("", group="")).error is E.invalid_group_id
    assert result(h.join("", session=5999)).error is E.invalid_session_timeout
    assert result(h.join("", session=1_800_001)).error is E.invalid_session_timeout
    assert h.c.heartbeat("", "m", None, 1) is E.invalid_group_id


def test_unknown_member_and_illegal_generation() -> None:
    h = Harness()
    assert result(h.join("someone", group="fresh")).error is E.unknown_member_id
    assert result(h.sync("someone", 1, group="fresh")).error is E.unknown_member_id
    assert h.c.heartbeat("fresh", "someone", None, 1) is E.unknown_member_id
    a, ja = h.new_member()
    result(ja)
    assert result(h.join("bogus")).error is E.unknown_member_id
    assert h.c.heartbeat("g", "bogus", None, 1) is E.unknown_member_id
    assert h.c.heartbeat("g", a, None, 7) is E.illegal_generation
    assert result(h.sync(a, 7)).error is E.illegal_generation
    s = h.c.sync("g", a, None, 1, "consumer", "roundrobin", {})
    assert result(s).error is E.inconsistent_group_protocol


def test_sync_during_preparing_rebalance_is_rebalance_in_progress() -> None:
    h = Harness()
    a, ja = h.new_member()
    result(h.sync(a, 1, {a: b""}))
    b, jb = h.new_member()
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert result(h.sync(a, 1)).error is E.rebalance_in_progress


def test_parked_sync_is_told_rebalance_in_progress_when_a_new_member_arrives() -> None:
    h = Harness()
    a, ja = h.new_member()
    b = None
    result(h.sync(a, 1, {}))
    b, jb = h.new_member()
    result(h.join(a))
    sb = h.sync(b, result(jb).generation_id)
    assert parked(sb)
    c, jc = h.new_member()
    assert result(sb).error is E.rebalance_in_progress


def test_member_id_required_pending_member_expires() -> None:
    h = Harness()
    a, ja = h.new_member()
    result(h.sync(a, 1, {}))
    pending = result(h.join(""))
    assert pending.error is E.member_id_required and pending.member_id
    assert pending.member_id in h.c.groups["g"].pending_members
    h.clock.advance(SESSION / 1000 / 2)
    assert h.c.heartbeat("g", a, None, 1) is E.none
    h.clock.advance(SESSION / 1000 / 2 + 1)
    assert pending.member_id not in h.c.groups["g"].pending_members
    assert h.state() is GroupState.STABLE and h.c.heartbeat("g", a, None, 1) is E.none
    assert result(h.join(pending.member_id)).error is E.unknown_member_id


def test_group_max_size_reached() -> None:
    h = Harness(max_group_size=2)
    a, ja = h.new_member()
    result(h.sync(a, 1, {}))
    b, jb = h.new_member()
    result(h.join(a))  # both joined (CompletingRebalance): the group is full
    assert result(h.join("")).error is E.group_max_size_reached
    assert result(h.join("", instance="static")).error is E.group_max_size_reached


def test_max_groups_setting_refuses_a_new_group() -> None:
    h = Harness(max_groups=1)
    a, ja = h.new_member(group="one")
    assert result(h.join("", group="two")).error is E.group_max_size_reached
    assert h.c.validate_commit("three", -1, "", None)[0] is E.group_max_size_reached
    assert result(h.join("", group="one")).error is E.member_id_required


def test_static_member_restart_keeps_assignment_without_rebalance() -> None:
    h = Harness()
    ra = result(h.join("", instance="ia"))
    a = ra.member_id
    result(h.sync(a, 1, {a: b"A"}, instance="ia"))
    rb_first = h.join("", instance="ib")
    ra2 = result(h.join(a, instance="ia"))
    rb = result(rb_first)
    b = rb.member_id
    gen = ra2.generation_id
    result(h.sync(a, gen, {a: b"A2", b: b"B2"}, instance="ia"))
    assert h.state() is GroupState.STABLE
    # ib restarts: same instance id, empty member id.
    restarted = result(h.join("", instance="ib"))
    assert restarted.error is E.none and restarted.member_id != b
    assert restarted.generation_id == gen and restarted.leader == a and restarted.members == ()
    assert h.state() is GroupState.STABLE
    assert h.c.heartbeat("g", a, "ia", gen) is E.none  # no rebalance for the others
    s = result(h.sync(restarted.member_id, gen, instance="ib"))
    assert s.error is E.none and s.assignment == b"B2"
    # the old member id is fenced
    assert h.c.heartbeat("g", b, "ib", gen) is E.fenced_instance_id
    assert result(h.sync(b, gen, instance="ib")).error is E.fenced_instance_id
    assert result(h.join(b, instance="ib")).error is E.fenced_instance_id
    assert h.c.leave("g", [(b, "ib")])[1] == [E.fenced_instance_id]


def test_static_leader_restart_skips_assignment_v9() -> None:
    h = Harness()
    ra = result(h.join("", instance="ia"))
    result(h.sync(ra.member_id, 1, {ra.member_id: b"A"}, instance="ia"))
    again = result(h.join("", instance="ia"))
    assert again.leader == again.member_id and again.skip_assignment
    assert [m.member_id for m in again.members] == [again.member_id]
    assert h.state() is GroupState.STABLE


def test_static_member_leave_is_a_real_leave() -> None:
    h = Harness()
    ra = result(h.join("", instance="ia"))
    result(h.sync(ra.member_id, 1, {}, instance="ia"))
    top, errors = h.c.leave("g", [("", "ia"), ("", "unknown")])
    assert errors == [E.none, E.unknown_member_id]
    assert h.state() in (GroupState.PREPARING_REBALANCE, GroupState.EMPTY)


def test_static_member_not_rejoined_is_kept_at_rebalance_timeout() -> None:
    h = Harness()
    ra = result(h.join("", instance="ia", session=60_000))
    a = ra.member_id
    result(h.sync(a, 1, {}, instance="ia"))
    b, jb = h.new_member(rebalance=5_000)
    h.clock.advance(REBALANCE / 1000 + 1)
    rb = result(jb)
    assert rb.error is E.none and a in h.c.groups["g"].members and rb.leader == b


def test_cooperative_extra_rejoin_rounds() -> None:
    """KIP-429: after a rebalance a member that revoked partitions rejoins at once."""
    h = Harness()
    t = subscription("t")
    a, b, gen = h.stable_pair()
    revoked = subscription("t") + b"\x00"  # owned partitions changed: metadata differs
    jb = h.join(b, protocols=(("range", revoked),))
    assert parked(jb) and h.state() is GroupState.PREPARING_REBALANCE
    ra = result(h.join(a, protocols=(("range", t),)))
    rb = result(jb)
    assert ra.generation_id == rb.generation_id == gen + 1
    result(h.sync(a, gen + 1, {a: b"A", b: b"B"}))
    assert result(h.sync(b, gen + 1)).assignment == b"B"
    # follower rejoining with the same metadata in Stable gets the current generation back
    same = result(h.join(b, protocols=(("range", revoked),)))
    assert same.generation_id == gen + 1 and h.state() is GroupState.STABLE


def test_join_cancelled_by_connection_loss() -> None:
    h = Harness()
    a, ja = h.new_member()
    result(h.sync(a, 1, {}))
    b, jb = h.new_member()
    assert parked(jb)
    jb.cancel()
    assert b not in h.c.groups["g"].members
    ra = result(h.join(a))
    assert ra.generation_id == 2 and len(ra.members) == 1


def test_leader_sync_not_durable_keeps_followers_parked() -> None:
    h = Harness()
    a, ja = h.new_member()
    result(ja)
    h.store.hold = True
    s = h.sync(a, 1, {a: b"x"})
    assert parked(s) and h.state() is GroupState.COMPLETING_REBALANCE
    h.store.release()
    assert result(s).assignment == b"x" and h.state() is GroupState.STABLE


def test_pending_sync_expiry_removes_member_that_never_synced() -> None:
    h = Harness()
    a, ja = h.new_member()
    result(h.sync(a, 1, {}))
    b, jb = h.new_member()
    result(h.join(a))
    result(jb)
    result(h.sync(a, 2, {}))
    h.c.heartbeat("g", b, None, 2)
    h.clock.advance(REBALANCE / 1000 + 1)
    assert b not in h.c.groups["g"].members


def test_state_survives_reload() -> None:
    h = Harness()
    a, b, gen = h.stable_pair()
    h.c.commit_offsets("g", [("t", 0, CommittedOffset(42, 0, "m", 1))])
    again = GroupCoordinator(h.clock, h.store)
    again.load()
    g = again.groups["g"]
    assert g.state is GroupState.STABLE and g.generation_id == gen and set(g.members) == {a, b}
    assert again.heartbeat("g", a, None, gen) is E.none
    assert result(again.sync("g", b, None, gen, None, None, {})).assignment == b"B2"
    assert again.fetch_offsets("g")[("t", 0)].offset == 42
    # a member that never comes back is expelled after its session timeout
    for _ in range(3):
        h.clock.advance(SESSION / 1000 / 2)
        again.heartbeat("g", a, None, gen)
    assert b not in again.groups["g"].members


def test_describe_list_delete() -> None:
    h = Harness()
    a, ja = h.new_member()
    result(h.sync(a, 1, {a: b"A"}))
    assert h.c.describe("missing") is None
    assert h.c.list_groups() == [("g", "consumer", "Stable")]
    assert result(h.c.delete_groups(["g", "missing", ""])) == {
        "g": E.non_empty_group, "missing": E.group_id_not_found, "": E.group_id_not_found}
    h.c.leave("g", [(a, None)])
    assert h.state() is GroupState.EMPTY
    assert result(h.c.delete_groups(["g"])) == {"g": E.none}
    assert "g" not in h.c.groups


def test_offset_commit_validation() -> None:
    h = Harness()
    assert h.c.validate_commit("simple", -1, "", None)[0] is E.none
    assert h.c.validate_commit("unknown", 3, "m", None)[0] is E.group_id_not_found
    assert h.c.validate_commit("unknown", 3, "m", None, api_version=8)[0] is \
        E.illegal_generation
    assert h.c.validate_commit("lone", -1, "m", None)[0] is E.none  # a simple group, as Kafka
    a, ja = h.new_member()
    result(ja)
    assert h.c.validate_commit("g", 1, a, None)[0] is E.rebalance_in_progress
    result(h.sync(a, 1, {}))
    assert h.c.validate_commit("g", 1, a, None)[0] is E.none
    assert h.c.validate_commit("g", 0, a, None)[0] is E.illegal_generation
    assert h.c.validate_commit("g", 1, "x", None)[0] is E.unknown_member_id
    assert h.c.validate_commit("g", -1, "", None)[0] is E.unknown_member_id


def test_offset_delete_refuses_subscribed_topics() -> None:
    h = Harness()
    a, ja = h.new_member()
    result(h.sync(a, 1, {}))
    h.c.commit_offsets("g", [("t", 0, CommittedOffset(1)), ("u", 0, CommittedOffset(2))])
    top, per = result(h.c.delete_offsets("g", [("t", 0), ("u", 0)]))
    assert top is E.none and per == {("t", 0): E.group_subscribed_to_topic, ("u", 0): E.none}
    assert set(h.c.fetch_offsets("g")) == {("t", 0)}
    assert result(h.c.delete_offsets("nope", []))[0] is E.group_id_not_found


def test_rebalance_groups_subscribed_to_topic() -> None:
    h = Harness()
    a, ja = h.new_member()
    result(h.sync(a, 1, {}))
    assert h.c.rebalance_groups_subscribed_to("other") == []
    assert h.c.rebalance_groups_subscribed_to("t") == ["g"]
    assert h.state() is GroupState.PREPARING_REBALANCE
    assert h.c.heartbeat("g", a, None, 1) is E.rebalance_in_progress


def test_subscription_decoding() -> None:
    assert subscription_topics(subscription("a", "b")) == {"a", "b"}
    assert subscription_topics(b"\x00") is None


@pytest.mark.parametrize("delay", [3000])
def test_initial_rebalance_delay_gathers_members(delay: int) -> None:
    h = Harness(initial_rebalance_delay_ms=delay)
    a, ja = h.new_member()
    b, jb = h.new_member()
    assert parked(ja) and parked(jb)
    h.clock.advance(delay / 1000)
    assert parked(ja) and parked(jb)  # b came during the delay: Kafka waits one more
    h.clock.advance(delay / 1000)
    ra, rb = result(ja), result(jb)
    assert ra.generation_id == rb.generation_id == 1


def test_the_initial_delay_waits_once_without_newcomers_and_never_past_the_rebalance_timeout():
    h = Harness(initial_rebalance_delay_ms=3000)
    _a, ja = h.new_member()
    h.clock.advance(2.9)
    assert parked(ja)
    h.clock.advance(0.2)
    assert result(ja).generation_id == 1
    slow = Harness(initial_rebalance_delay_ms=3000)
    joins = [slow.new_member()[1]]
    for _ in range(20):  # a member every 2.5 s would extend it forever
        slow.clock.advance(2.5)
        if not parked(joins[0]):
            break
        joins.append(slow.new_member()[1])
    assert not parked(joins[0]) and slow.clock.seconds() <= 60  # within the rebalance timeout


# --- offset expiry (offsets.retention.minutes) ------------------------------------------

DAY_MS = 86_400_000


def _commit(h: Harness, group: str, *partitions: tuple[str, int], age_ms: int = 0) -> None:
    now_ms = int(h.clock.seconds() * 1000) - age_ms
    result(h.c.commit_offsets(group, [(t, p, CommittedOffset(7, -1, "", now_ms))
                                      for t, p in partitions]))


def test_an_empty_groups_offsets_expire_from_when_it_emptied_then_the_group_goes() -> None:
    h = Harness()
    h.clock.advance(1_000)
    a, ja = h.new_member()
    generation = result(ja).generation_id
    result(h.sync(a, generation, {a: b"A"}))
    _commit(h, "g", ("t", 0))
    h.clock.advance(5 * DAY_MS / 1000)  # members still there: nothing expires
    assert result(h.c.expire_offsets(DAY_MS)) == []
    assert h.c.fetch_offsets("g")
    h.c.leave("g", [(a, None)])
    assert h.state() is GroupState.EMPTY
    h.clock.advance((DAY_MS - 1) / 1000)  # a day after the commit, not after it emptied
    assert result(h.c.expire_offsets(DAY_MS)) == []
    assert h.c.fetch_offsets("g")
    h.clock.advance(1)
    assert result(h.c.expire_offsets(DAY_MS)) == ["g"]
    assert h.c.fetch_offsets("g") == {}
    assert "g" not in h.c.groups
    assert b"g" not in h.store.families.get("groups", {})
    assert h.store.families.get("offsets", {}) == {}


def test_standalone_offsets_expire_each_from_its_own_commit() -> None:
    h = Harness()
    h.clock.advance(1_000)
    _commit(h, "solo", ("t", 0))
    h.clock.advance(DAY_MS / 2000)
    _commit(h, "solo", ("t", 1))
    h.clock.advance(DAY_MS / 2000)
    assert result(h.c.expire_offsets(DAY_MS)) == []
    assert list(h.c.fetch_offsets("solo")) == [("t", 1)]
    h.clock.advance(DAY_MS / 2000)
    assert result(h.c.expire_offsets(DAY_MS)) == ["solo"]


def test_a_stable_group_keeps_the_offsets_of_topics_it_subscribes_to() -> None:
    h = Harness()
    h.clock.advance(2 * DAY_MS / 1000)
    a, ja = h.new_member()  # subscribes to "t"
    generation = result(ja).generation_id
    result(h.sync(a, generation, {a: b"A"}))
    _commit(h, "g", ("t", 0), ("old", 0), age_ms=DAY_MS)  # committed a day ago
    assert result(h.c.expire_offsets(DAY_MS)) == []
    assert list(h.c.fetch_offsets("g")) == [("t", 0)]
    assert h.state() is GroupState.STABLE


def test_the_time_a_group_emptied_survives_a_restart() -> None:
    h = Harness()
    h.clock.advance(1_000)
    a, ja = h.new_member()
    result(h.sync(a, result(ja).generation_id, {a: b"A"}))
    _commit(h, "g", ("t", 0))
    h.clock.advance(3 * DAY_MS / 1000)
    h.c.leave("g", [(a, None)])
    again = GroupCoordinator(h.clock, h.store)
    again.load()
    h.clock.advance(DAY_MS / 2000)
    assert result(again.expire_offsets(DAY_MS)) == []
    h.clock.advance(DAY_MS / 2000)
    assert result(again.expire_offsets(DAY_MS)) == ["g"]
