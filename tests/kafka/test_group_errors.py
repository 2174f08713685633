"""Group and offset APIs on the wire, for error paths real clients rarely take (raw kio frames)."""
from __future__ import annotations

import datetime
import importlib
import io
import struct
from pathlib import Path
from typing import Any, Iterator

import pytest
from conftest import BrokerProcess, start_broker
from kio.schema.errors import ErrorCode as E
from kio.schema.consumer_protocol_subscription.v1.data import ConsumerProtocolSubscription
from kio.serial import entity_writer
from rawkafka import RawClient


def subscription(*topics: str) -> bytes:
    """ConsumerProtocolSubscription v1 as a consumer sends it (int16 version + body)."""
    buf = io.BytesIO()
    entity_writer(ConsumerProtocolSubscription)(
        buf, ConsumerProtocolSubscription(topics=topics, user_data=None, owned_partitions=()))
    return struct.pack(">h", 1) + buf.getvalue()


def req(api: str, version: int, name: str) -> Any:
    return getattr(importlib.import_module(f"kio.schema.{api}.v{version}.request"), name)


def ms(n: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=n)


@pytest.fixture(scope="module")
def broker(shared_broker: BrokerProcess) -> BrokerProcess:
    return shared_broker


@pytest.fixture
def raw(broker: BrokerProcess) -> Iterator[RawClient]:
    with RawClient(broker.kafka_port) as c:
        yield c


def create_topic(raw: RawClient, name: str, partitions: int = 1) -> None:
    mod = importlib.import_module("kio.schema.create_topics.v5.request")
    r = raw.call(mod.CreateTopicsRequest(
        topics=(mod.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1,
                                   assignments=(), configs=()),),
        timeout=ms(5000), validate_only=False))
    assert r.topics[0].error_code in (E.none, E.topic_already_exists)


def join(raw: RawClient, group: str, member_id: str = "", version: int = 5,
         session: int = 6000, ptype: str = "consumer", topics: tuple[str, ...] = ("t",),
         instance: str | None = None, protocol: str = "range") -> Any:
    Req = req("join_group", version, "JoinGroupRequest")
    Proto = req("join_group", version, "JoinGroupRequestProtocol")
    kw: dict[str, Any] = dict(group_id=group, session_timeout=ms(session),
                              rebalance_timeout=ms(10000), member_id=member_id,
                              protocol_type=ptype,
                              protocols=(Proto(name=protocol, metadata=subscription(*topics)),))
    if version >= 5:
        kw["group_instance_id"] = instance
    return raw.call(Req(**kw))


def joined_member(raw: RawClient, group: str, topics: tuple[str, ...] = ("t",)) -> tuple[str, int]:
    """A single-member Stable group: (member id, generation)."""
    first = join(raw, group, topics=topics)
    assert first.error_code is E.member_id_required and first.member_id
    r = join(raw, group, first.member_id, topics=topics)
    assert r.error_code is E.none and r.leader == r.member_id
    Sync = req("sync_group", 3, "SyncGroupRequest")
    Assign = req("sync_group", 3, "SyncGroupRequestAssignment")
    s = raw.call(Sync(group_id=group, generation_id=r.generation_id, member_id=r.member_id,
                      group_instance_id=None,
                      assignments=(Assign(member_id=r.member_id, assignment=b"x"),)))
    assert s.error_code is E.none and s.assignment == b"x"
    return r.member_id, r.generation_id


def heartbeat(raw: RawClient, group: str, member: str, generation: int,
              instance: str | None = None) -> E:
    Hb = req("heartbeat", 4, "HeartbeatRequest")
    return raw.call(Hb(group_id=group, generation_id=generation, member_id=member,
                       group_instance_id=instance)).error_code


def test_find_coordinator_every_version(broker: BrokerProcess, raw: RawClient) -> None:
    for v in (0, 1, 2, 3):
        Req = req("find_coordinator", v, "FindCoordinatorRequest")
        r = raw.call(Req(key="g") if v == 0 else Req(key="g", key_type=0))
        assert r.error_code is E.none and r.port == broker.kafka_port
    txn = raw.call(req("find_coordinator", 3, "FindCoordinatorRequest")(key="tx", key_type=1))
    assert txn.error_code is E.none and txn.port == broker.kafka_port
    Req = req("find_coordinator", 4, "FindCoordinatorRequest")
    r = raw.call(Req(key_type=0, coordinator_keys=("a", "b")))
    assert [(c.key, c.error_code, c.port) for c in r.coordinators] == [
        ("a", E.none, broker.kafka_port), ("b", E.none, broker.kafka_port)]
    r = raw.call(Req(key_type=1, coordinator_keys=("tx",)))
    assert (r.coordinators[0].error_code, r.coordinators[0].port) == (E.none, broker.kafka_port)


def test_session_timeout_bounds_are_settings(tmp_path: Path) -> None:
    """Kafka's group.min/max.session.timeout.ms: test rigs lower the minimum to run groups
    with short session timeouts (kafka-python's own suite asks for 3 s)."""
    b = start_broker(tmp_path, env={"CONNECTORS_KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS": "1000",
                                    "CONNECTORS_KAFKA_GROUP_MAX_SESSION_TIMEOUT_MS": "20000"})
    try:
        with RawClient(b.kafka_port) as raw:
            assert join(raw, "short", session=1000).error_code is E.member_id_required
            assert join(raw, "short", session=999).error_code is E.invalid_session_timeout
            assert join(raw, "long", session=20001).error_code is E.invalid_session_timeout
    finally:
        b.stop()


def test_join_errors(raw: RawClient) -> None:
    assert join(raw, "").error_code is E.invalid_group_id
    assert join(raw, "e1", session=1000).error_code is E.invalid_session_timeout
    assert join(raw, "e1", member_id="ghost").error_code is E.unknown_member_id
    first = join(raw, "e1")
    assert first.error_code is E.member_id_required and first.member_id
    old = join(raw, "e0", version=3)  # before v4 a member id is handed out directly
    assert old.error_code is E.none and old.member_id
    member, gen = joined_member(raw, "e2")
    assert join(raw, "e2", ptype="connect").error_code is E.inconsistent_group_protocol
    assert join(raw, "e2", protocol="other").error_code is E.inconsistent_group_protocol
    assert heartbeat(raw, "e2", member, gen) is E.none
    assert heartbeat(raw, "e2", member, gen + 5) is E.illegal_generation
    assert heartbeat(raw, "e2", "ghost", gen) is E.unknown_member_id
    assert heartbeat(raw, "nope", "ghost", 1) is E.unknown_member_id


def test_static_member_fenced(raw: RawClient) -> None:
    r = join(raw, "st", instance="inst-1")
    assert r.error_code is E.none  # static members skip MEMBER_ID_REQUIRED
    Sync = req("sync_group", 3, "SyncGroupRequest")
    s = raw.call(Sync(group_id="st", generation_id=r.generation_id, member_id=r.member_id,
                      group_instance_id="inst-1", assignments=()))
    assert s.error_code is E.none
    again = join(raw, "st", instance="inst-1")
    assert again.error_code is E.none and again.member_id != r.member_id
    assert again.generation_id == r.generation_id  # no rebalance
    assert heartbeat(raw, "st", r.member_id, r.generation_id, "inst-1") is E.fenced_instance_id
    assert heartbeat(raw, "st", again.member_id, r.generation_id, "inst-1") is E.none


def test_leave_group_versions(raw: RawClient) -> None:
    member, gen = joined_member(raw, "lv")
    Leave0 = req("leave_group", 1, "LeaveGroupRequest")
    assert raw.call(Leave0(group_id="lv", member_id="ghost")).error_code is E.unknown_member_id
    Leave = req("leave_group", 4, "LeaveGroupRequest")
    Ident = req("leave_group", 4, "MemberIdentity")
    r = raw.call(Leave(group_id="lv", members=(Ident(member_id=member),
                                               Ident(member_id="ghost"))))
    assert r.error_code is E.none
    assert [m.error_code for m in r.members] == [E.none, E.unknown_member_id]


def test_describe_list_delete_groups(raw: RawClient) -> None:
    member, gen = joined_member(raw, "dg")
    D5 = req("describe_groups", 5, "DescribeGroupsRequest")
    r = raw.call(D5(groups=("dg", "missing"), include_authorized_operations=False))
    dg, missing = r.groups
    assert dg.group_state == "Stable" and dg.protocol_type == "consumer"
    assert dg.protocol_data == "range" and dg.members[0].member_id == member
    assert dg.members[0].member_assignment == b"x"
    assert missing.error_code is E.none and missing.group_state == "Dead"
    D6 = req("describe_groups", 6, "DescribeGroupsRequest")
    r = raw.call(D6(groups=("missing",), include_authorized_operations=False))
    assert r.groups[0].error_code is E.group_id_not_found
    L4 = req("list_groups", 4, "ListGroupsRequest")
    stable = {g.group_id for g in raw.call(L4(states_filter=("Stable",))).groups}
    assert "dg" in stable
    assert "dg" not in {g.group_id for g in raw.call(L4(states_filter=("Empty",))).groups}
    Del = req("delete_groups", 2, "DeleteGroupsRequest")
    r = raw.call(Del(groups_names=("dg", "missing")))
    assert [(x.group_id, x.error_code) for x in r.results] == [
        ("dg", E.non_empty_group), ("missing", E.group_id_not_found)]
    Leave = req("leave_group", 4, "LeaveGroupRequest")
    Ident = req("leave_group", 4, "MemberIdentity")
    raw.call(Leave(group_id="dg", members=(Ident(member_id=member),)))
    assert raw.call(Del(groups_names=("dg",))).results[0].error_code is E.none


def commit(raw: RawClient, group: str, topic: str, offsets: dict[int, int],
           generation: int = -1, member: str = "", version: int = 8) -> list[E]:
    Req = req("offset_commit", version, "OffsetCommitRequest")
    T = req("offset_commit", version, "OffsetCommitRequestTopic")
    P = req("offset_commit", version, "OffsetCommitRequestPartition")
    kw: dict[str, Any] = dict(group_id=group, generation_id_or_member_epoch=generation,
                              member_id=member,
                              topics=(T(name=topic, partitions=tuple(
                                  P(partition_index=p, committed_offset=o, committed_metadata="m")
                                  for p, o in offsets.items())),))
    if version >= 7:
        kw["group_instance_id"] = None
    if version < 5:
        kw["retention_time"] = datetime.timedelta(milliseconds=-1)
    r = raw.call(Req(**kw))
    return [p.error_code for p in r.topics[0].partitions]


def test_offset_commit_fetch_delete(raw: RawClient) -> None:
    create_topic(raw, "ot", 2)
    assert commit(raw, "simple", "ot", {0: 5, 1: 7}) == [E.none, E.none]
    assert commit(raw, "simple", "ot", {9: 1}) == [E.unknown_topic_or_partition]
    assert commit(raw, "simple", "nope-topic", {0: 1}) == [E.unknown_topic_or_partition]
    assert commit(raw, "simple", "ot", {0: 6}, version=2) == [E.none]
    # A group that does not exist: ILLEGAL_GENERATION before v9, GROUP_ID_NOT_FOUND from v9,
    # and a commit with generation -1 creates a simple group whatever member id it names.
    assert commit(raw, "ghost-group", "ot", {0: 1}, generation=3, member="m") == [
        E.illegal_generation]
    assert commit(raw, "ghost-group", "ot", {0: 1}, generation=3, member="m", version=9) == [
        E.group_id_not_found]
    assert commit(raw, "lone-group", "ot", {0: 4}, generation=-1, member="m", version=9) == [
        E.none]
    member, gen = joined_member(raw, "managed", topics=("ot",))
    assert commit(raw, "managed", "ot", {0: 3}) == [E.unknown_member_id]
    assert commit(raw, "managed", "ot", {0: 3}, gen + 1, member) == [E.illegal_generation]
    assert commit(raw, "managed", "ot", {0: 3}, gen, "ghost") == [E.unknown_member_id]
    assert commit(raw, "managed", "ot", {0: 3}, gen, member) == [E.none]

    F1 = req("offset_fetch", 1, "OffsetFetchRequest")
    FT1 = req("offset_fetch", 1, "OffsetFetchRequestTopic")
    r = raw.call(F1(group_id="simple", topics=(FT1(name="ot", partition_indexes=(0, 1)),)))
    assert [(p.partition_index, p.committed_offset, p.metadata)
            for p in r.topics[0].partitions] == [(0, 6, "m"), (1, 7, "m")]
    F7 = req("offset_fetch", 7, "OffsetFetchRequest")
    r = raw.call(F7(group_id="simple", topics=None, require_stable=True))
    assert r.error_code is E.none
    assert {(t.name, p.partition_index, p.committed_offset, p.error_code)
            for t in r.topics for p in t.partitions} == {("ot", 0, 6, E.none),
                                                          ("ot", 1, 7, E.none)}
    F8 = req("offset_fetch", 8, "OffsetFetchRequest")
    G8 = req("offset_fetch", 8, "OffsetFetchRequestGroup")
    T8 = req("offset_fetch", 8, "OffsetFetchRequestTopics")
    r = raw.call(F8(groups=(G8(group_id="simple", topics=None),
                            G8(group_id="managed", topics=(T8(name="ot",
                                                              partition_indexes=(0, 1)),)),
                            G8(group_id="unknown", topics=(T8(name="ot",
                                                              partition_indexes=(0,)),))),
                    require_stable=True))
    got = {g.group_id: [(p.partition_index, p.committed_offset) for t in g.topics
                        for p in t.partitions] for g in r.groups}
    assert got == {"simple": [(0, 6), (1, 7)], "managed": [(0, 3), (1, -1)],
                   "unknown": [(0, -1)]}

    Del = req("offset_delete", 0, "OffsetDeleteRequest")
    DT = req("offset_delete", 0, "OffsetDeleteRequestTopic")
    DP = req("offset_delete", 0, "OffsetDeleteRequestPartition")
    r = raw.call(Del(group_id="managed", topics=(DT(name="ot", partitions=(DP(partition_index=0),)),)))
    assert r.error_code is E.none
    assert r.topics[0].partitions[0].error_code is E.group_subscribed_to_topic
    r = raw.call(Del(group_id="simple", topics=(DT(name="ot", partitions=(DP(partition_index=0),)),)))
    assert r.topics[0].partitions[0].error_code is E.none
    r = raw.call(Del(group_id="nobody", topics=(DT(name="ot", partitions=(DP(partition_index=0),)),)))
    assert r.error_code is E.group_id_not_found


def test_max_groups_setting(tmp_path: Path) -> None:
    """CONNECTORS_KAFKA_MAX_GROUPS: one group more answers GROUP_MAX_SIZE_REACHED."""
    b = start_broker(tmp_path, env={"CONNECTORS_KAFKA_MAX_GROUPS": "1"})
    try:
        with RawClient(b.kafka_port) as raw:
            joined_member(raw, "first")
            assert join(raw, "second").error_code is E.group_max_size_reached
            create_topic(raw, "mt")
            assert commit(raw, "third", "mt", {0: 1}) == [E.group_max_size_reached]
    finally:
        b.stop()


def test_create_partitions_rebalances_subscribed_groups(raw: RawClient) -> None:
    """Seed 004: a successful CreatePartitions rebalances every group subscribed to the topic."""
    create_topic(raw, "cpt", 1)
    member, gen = joined_member(raw, "cp-sub", topics=("cpt",))
    other, other_gen = joined_member(raw, "cp-other", topics=("elsewhere",))
    CP = req("create_partitions", 3, "CreatePartitionsRequest")
    CT = req("create_partitions", 3, "CreatePartitionsTopic")
    dry = raw.call(CP(topics=(CT(name="cpt", count=2, assignments=None),), timeout=ms(5000),
                      validate_only=True))
    assert dry.results[0].error_code is E.none
    assert heartbeat(raw, "cp-sub", member, gen) is E.none  # validate-only changes nothing
    r = raw.call(CP(topics=(CT(name="cpt", count=2, assignments=None),), timeout=ms(5000),
                    validate_only=False))
    assert r.results[0].error_code is E.none
    assert heartbeat(raw, "cp-sub", member, gen) is E.rebalance_in_progress
    assert heartbeat(raw, "cp-other", other, other_gen) is E.none
