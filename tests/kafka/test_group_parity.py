"""Consumer-group behaviour compared with Apache Kafka's, through real clients where they reach
it (confluent-kafka's AdminClient) and raw frames for exact per-partition codes."""
from __future__ import annotations

import importlib
import uuid
from typing import Any, Iterator

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import BrokerProcess
from kio.schema.errors import ErrorCode as E
from rawkafka import RawClient


@pytest.fixture(scope="module")
def broker(shared_broker: BrokerProcess) -> BrokerProcess:
    return shared_broker


@pytest.fixture
def admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


@pytest.fixture
def raw(broker: BrokerProcess) -> Iterator[RawClient]:
    with RawClient(broker.kafka_port) as c:
        yield c


def _topic(admin: AdminClient, partitions: int = 1) -> str:
    name = f"parity-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(10)
    return name


def _commit(raw: RawClient, group: str, offsets: dict[tuple[str, int], int],
            generation: int, member: str) -> dict[tuple[str, int], E]:
    """OffsetCommit v9; the per-partition error codes."""
    mod = importlib.import_module("kio.schema.offset_commit.v9.request")
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), offset in offsets.items():
        by_topic.setdefault(topic, []).append(mod.OffsetCommitRequestPartition(
            partition_index=partition, committed_offset=offset, committed_leader_epoch=-1,
            committed_metadata=""))
    r = raw.call(mod.OffsetCommitRequest(
        group_id=group, generation_id_or_member_epoch=generation, member_id=member,
        group_instance_id=None, topics=tuple(
            mod.OffsetCommitRequestTopic(name=t, partitions=tuple(ps))
            for t, ps in by_topic.items())))
    return {(t.name, p.partition_index): p.error_code for t in r.topics for p in t.partitions}


def test_commit_naming_only_unknown_partitions_creates_no_group(admin: AdminClient) -> None:
    """Kafka answers partitions of unknown topics before the coordinator sees the commit, so
    a commit (here the admin's alter_consumer_group_offsets) that names nothing else leaves
    no group behind: it was listed and described as an Empty group."""
    topic = _topic(admin)
    group = f"ghost-{uuid.uuid4().hex[:8]}"
    missing = f"no-such-topic-{uuid.uuid4().hex[:8]}"
    done = admin.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(missing, 0, 5)])])[group]
    parts = done.result(10).topic_partitions
    assert [p.error.code() for p in parts] == [KafkaError.UNKNOWN_TOPIC_OR_PART]
    listed = admin.list_consumer_groups().result(10).valid
    assert group not in {g.group_id for g in listed}
    described = admin.describe_consumer_groups([group])[group].result(10)
    assert described.state.name == "DEAD"
    # A commit that names one real partition still creates the simple group.
    parts = admin.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, 5)])])[group].result(10)
    assert [p.error for p in parts.topic_partitions] == [None]
    assert group in {g.group_id for g in admin.list_consumer_groups().result(10).valid}


def test_unknown_partitions_answer_unknown_topic_whatever_the_group_error(
        admin: AdminClient, raw: RawClient) -> None:
    """In Kafka the unknown partitions of a commit get UNKNOWN_TOPIC_OR_PARTITION and only the
    others carry the group's verdict (here GROUP_ID_NOT_FOUND, v9, for a group that does not
    exist); every partition carried the group's error."""
    topic = _topic(admin)
    group = f"absent-{uuid.uuid4().hex[:8]}"
    codes = _commit(raw, group, {(topic, 0): 1, (topic, 7): 1, ("nope-" + topic, 0): 1},
                    generation=3, member="m")
    assert codes == {(topic, 0): E.group_id_not_found, (topic, 7): E.unknown_topic_or_partition,
                     ("nope-" + topic, 0): E.unknown_topic_or_partition}
    # Only unknown partitions: the group is not consulted at all.
    assert _commit(raw, group, {(topic, 7): 1}, generation=3, member="m") == {
        (topic, 7): E.unknown_topic_or_partition}
