"""Kafka semantics in less-trodden corners, driven by unmodified clients over real sockets.

Each test names a behaviour of Apache Kafka that a client can observe and kmqkafka once got
wrong. One daemon serves the whole module; every test uses its own topic and group names.
Every wait is bounded.
"""
from __future__ import annotations

import uuid
from typing import Any, Iterator

import pytest
from confluent_kafka import KafkaError as ConfluentKafkaError
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, ResourceType
from confluent_kafka.admin import NewTopic as ConfluentNewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import InvalidRecordError, KafkaError
from kafka.structs import OffsetAndMetadata

from conftest import BrokerProcess

WAIT = 15.0


@pytest.fixture(scope="module")
def kafka(shared_broker: BrokerProcess) -> BrokerProcess:
    return shared_broker


@pytest.fixture(scope="module")
def admin(kafka: BrokerProcess) -> Iterator[Any]:
    client = KafkaAdminClient(bootstrap_servers=kafka.bootstrap, request_timeout_ms=10_000)
    yield client
    client.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def outcome(future: Any) -> BaseException | None:
    """The exception a kafka-python send future failed with, None if it succeeded."""
    try:
        future.get(WAIT)
    except KafkaError as exc:
        return exc
    return None


def test_only_the_keyless_record_of_a_batch_is_blamed_on_a_compacted_topic(
        kafka: BrokerProcess, admin: Any) -> None:
    """Kafka names each refused record in ``record_errors``: kafka-python fails the keyless
    record with Kafka's message and its batch mates as members of a refused batch."""
    topic = unique("rec-errors")
    admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"cleanup.policy": "compact"})])
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=200, retries=0,
                             enable_idempotence=False)
    try:
        sent = [producer.send(topic, key=key, value=b"v") for key in (b"a", None, b"c")]
        producer.flush(WAIT)
        errors = [outcome(f) for f in sent]
    finally:
        producer.close(WAIT)
    assert isinstance(errors[1], InvalidRecordError)
    assert "Compacted topic cannot accept message without key" in str(errors[1])
    for innocent in (errors[0], errors[2]):
        assert type(innocent) is KafkaError
        assert "part of a batch which had one more more invalid records" in str(innocent)


def committing_consumer(kafka: BrokerProcess, admin: Any,
                        prefix: str) -> tuple[Any, str, Any]:
    """A fresh one-partition topic, a group id and a kafka-python consumer that commits by
    hand: (partition, group, consumer)."""
    topic, group = unique(prefix), unique(prefix + "-group")
    admin.create_topics([NewTopic(topic, 1, 1)])
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=group,
                             enable_auto_commit=False, request_timeout_ms=10_000)
    return KafkaTopicPartition(topic, 0), group, consumer


def test_a_commit_without_metadata_reads_back_empty_metadata(
        kafka: BrokerProcess, admin: Any) -> None:
    """Kafka stores a null commit metadata as "" (OffsetAndMetadata.NO_METADATA): committed()
    and the admin listing never show None for a committed partition."""
    tp, group, consumer = committing_consumer(kafka, admin, "no-meta")
    try:
        consumer.commit({tp: OffsetAndMetadata(4, None, -1)})
        assert consumer.committed(tp, metadata=True) == OffsetAndMetadata(4, "", -1)
    finally:
        consumer.close()
    assert admin.list_group_offsets({group: None})[group][tp].metadata == ""


def confluent_error(future: Any) -> tuple[int, str]:
    """(code, message) a confluent-kafka admin future failed with."""
    with pytest.raises(KafkaException) as info:
        future.result(WAIT)
    return info.value.args[0].code(), info.value.args[0].str()


def test_the_longest_topic_name_takes_any_partition_count_and_can_be_deleted(
        kafka: BrokerProcess) -> None:
    """Kafka takes 249-character names at any partition count. A partition's directory
    (``kafka.T~p``, plus ``.deleted-N`` on its way out) would pass NAME_MAX, which used to
    fail the create half way (KAFKA_STORAGE_ERROR) and the delete after the catalog change
    (a failed store write); the store shortens such directory names now."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    longest = unique("long").ljust(249, "x")
    admin.create_topics([ConfluentNewTopic(longest, 12)])[longest].result(WAIT)
    admin.create_partitions([NewPartitions(longest, 14)])[longest].result(WAIT)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for p in (0, 13):
        producer.produce(longest, b"v%d" % p, partition=p)
    assert producer.flush(WAIT) == 0
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": unique("g"),
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(longest, 13, 0)])
    msg = consumer.poll(WAIT)
    assert msg is not None and msg.error() is None and msg.value() == b"v13"
    consumer.close()
    admin.delete_topics([longest], operation_timeout=WAIT)[longest].result(WAIT)
    assert longest not in admin.list_topics(timeout=WAIT).topics
    # The store still takes writes: a new topic works after the delete.
    other = unique("after-delete")
    producer.produce(other, b"ok")
    assert producer.flush(WAIT) == 0


def delivery_errors(bootstrap: str, topic: str, timestamps: list[int]) -> list[Any]:
    """Per-record delivery errors (None for success), one produce request per record."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "retries": 0})
    errors: list[Any] = []
    for ts in timestamps:
        producer.produce(topic, b"v", timestamp=ts, on_delivery=lambda e, _m: errors.append(e))
        producer.flush(WAIT)
    return [e if e is None else e.code() for e in errors]


def test_configs_kafka_4_removed_are_refused_as_unknown(kafka: BrokerProcess) -> None:
    """Kafka 4.0 dropped ``message.format.version`` (KIP-724) and
    ``message.timestamp.difference.max.ms`` (KIP-937, replaced by the before/after bounds):
    CreateTopics refuses them as unknown configs, and DescribeConfigs no longer lists them."""
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for name, value in (("message.format.version", "3.0"),
                        ("message.timestamp.difference.max.ms", "60000")):
        topic = unique("removed")
        f = admin.create_topics([ConfluentNewTopic(topic, 1, config={name: value})])[topic]
        with pytest.raises(KafkaException) as e:
            f.result(WAIT)
        assert e.value.args[0].code() == ConfluentKafkaError.INVALID_CONFIG, name
    topic = unique("listed")
    admin.create_topics([ConfluentNewTopic(topic, 1)])[topic].result(WAIT)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    described = admin.describe_configs([resource])[resource].result(WAIT)
    assert "message.timestamp.before.max.ms" in described
    assert not {"message.format.version", "message.timestamp.difference.max.ms"} & set(described)


def test_a_default_topic_takes_timestamps_up_to_an_hour_ahead_as_kafka_4(
        kafka: BrokerProcess) -> None:
    """KIP-1030: ``message.timestamp.after.max.ms`` defaults to one hour from Kafka 4.0 on;
    ``before`` stays unbounded."""
    import time

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    topic = unique("ts-default")
    admin.create_topics([ConfluentNewTopic(topic, 1)])[topic].result(WAIT)
    now = int(time.time() * 1000)
    stamps = [now - 10 * 365 * 86_400_000, now + 1_800_000, now + 7_200_000]
    assert delivery_errors(kafka.bootstrap, topic, stamps) == [None, None, 32]


def test_min_compaction_lag_above_max_is_an_invalid_config(kafka: BrokerProcess) -> None:
    """Kafka's one cross-config rule: min.compaction.lag.ms may not exceed
    max.compaction.lag.ms, on create and on alter (checked against the resulting set)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    topic = unique("lags")
    code, message = confluent_error(admin.create_topics([ConfluentNewTopic(
        topic, 1, config={"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"})])[topic])
    assert code == 40 and "min.compaction.lag.ms (10) > max.compaction.lag.ms (5)" in message
    admin.create_topics([ConfluentNewTopic(topic, 1, config={"max.compaction.lag.ms": "5"})]
                        )[topic].result(WAIT)
    resource = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("min.compaction.lag.ms", "10",
                    incremental_operation=AlterConfigOpType.SET)])
    code, _ = confluent_error(admin.incremental_alter_configs([resource])[resource])
    assert code == 40  # INVALID_CONFIG


def test_commit_metadata_is_bounded_in_java_characters(kafka: BrokerProcess,
                                                       admin: Any) -> None:
    """Kafka bounds commit metadata by ``String.length()`` (offset.metadata.max.bytes, 4096):
    4096 'é' (8192 bytes of UTF-8) are taken, 4097 ASCII characters are
    OFFSET_METADATA_TOO_LARGE."""
    from kafka.errors import OffsetMetadataTooLargeError

    tp, _group, consumer = committing_consumer(kafka, admin, "meta-size")
    try:
        consumer.commit({tp: OffsetAndMetadata(1, "é" * 4096, -1)})
        assert consumer.committed(tp, metadata=True).metadata == "é" * 4096
        with pytest.raises(OffsetMetadataTooLargeError):
            consumer.commit({tp: OffsetAndMetadata(2, "m" * 4097, -1)})
        assert consumer.committed(tp) == 1
    finally:
        consumer.close()


def test_offset_delete_on_a_kip848_group_keeps_only_subscribed_topics(
        kafka: BrokerProcess, admin: Any) -> None:
    """OffsetDelete treats a consumer (KIP-848) group as Kafka does: while members subscribe,
    their topics are GROUP_SUBSCRIBED_TO_TOPIC and other topics' offsets go; once the group
    is empty everything goes. (It used to answer GROUP_ID_NOT_FOUND for such a group.)"""
    import time

    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as ConfluentTopicPartition
    from kafka.errors import GroupSubscribedToTopicError, NoError

    topic, group = unique("od848"), unique("od848-group")
    other = topic + "-other"
    admin.create_topics([NewTopic(topic, 1, 1), NewTopic(other, 1, 1)])
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group,
                         "group.protocol": "consumer", "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + WAIT
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.1)
        assert consumer.assignment()
        consumer.commit(offsets=[ConfluentTopicPartition(topic, 0, 1),
                                 ConfluentTopicPartition(other, 0, 2)], asynchronous=False)
        mine, theirs = KafkaTopicPartition(topic, 0), KafkaTopicPartition(other, 0)
        assert admin.delete_group_offsets(group, [mine, theirs]) == {
            mine: GroupSubscribedToTopicError, theirs: NoError}
        assert set(admin.list_group_offsets({group: None})[group]) == {mine}
    finally:
        consumer.close()
    assert admin.delete_group_offsets(group, [mine]) == {mine: NoError}
    assert admin.list_group_offsets({group: None})[group] == {}
