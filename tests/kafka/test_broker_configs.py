"""Dynamic broker configs with real admin clients: the log-config defaults (``log.retention.ms``,
``message.max.bytes``, ``log.cleanup.policy``, ...) changed at runtime on this broker
(``kafka-configs --entity-type brokers --entity-name 1``) or cluster-wide (the ``""``
resource), applying at once to every topic that does not override them, described with
Kafka's sources and synonyms, replicated and kept across a restart. Retention runs every
100 ms here.
"""
from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from conftest import BrokerProcess, start_broker

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, NewPartitions,
    NewTopic, ResourceType,
)

WAIT = 20.0
DYNAMIC_BROKER = ConfigSource.DYNAMIC_BROKER_CONFIG.value
DYNAMIC_DEFAULT = ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
TOPIC = ConfigSource.DYNAMIC_TOPIC_CONFIG.value
DEFAULT = ConfigSource.DEFAULT_CONFIG.value


@pytest.fixture(scope="module")
def kmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = start_broker(tmp_path_factory.mktemp("brokercfg"),
                     env={"CONNECTORS_KAFKA_LOG_RETENTION_CHECK_INTERVAL_MS": "100"})
    try:
        yield b
    finally:
        b.stop()


def admin(b: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": b.bootstrap})


def topic(b: BrokerProcess, **config: str) -> str:
    name = f"bc-{uuid.uuid4().hex[:8]}"
    client = admin(b)  # kept referenced until the future resolves
    client.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(WAIT)
    return name


def set_broker(b: BrokerProcess, broker: str, **changes: str | None) -> None:
    entries = [ConfigEntry(k.replace("_", "."), v, incremental_operation=(
        AlterConfigOpType.SET if v is not None else AlterConfigOpType.DELETE))
        for k, v in changes.items()]
    client = admin(b)
    for f in client.incremental_alter_configs(
            [ConfigResource(ResourceType.BROKER, broker, incremental_configs=entries)]).values():
        f.result(WAIT)


def describe(b: BrokerProcess, kind: str, name: str) -> dict:
    client = admin(b)
    (f,) = client.describe_configs([ConfigResource(kind, name)]).values()
    return f.result(WAIT)


def produce(b: BrokerProcess, name: str, value: bytes, *, key: bytes | None = b"k",
            timestamp: int = 0, partition: int = 0) -> KafkaError | None:
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
    errors: list = []
    p.produce(name, value, key, partition=partition, timestamp=timestamp,
              on_delivery=lambda e, m: errors.append(e))
    p.flush(WAIT)
    return errors[0]


def low_watermark(b: BrokerProcess, name: str, partition: int = 0) -> int:
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "bc"})
    try:
        return c.get_watermark_offsets(TopicPartition(name, partition), timeout=WAIT)[0]
    finally:
        c.close()


def test_a_broker_default_applies_to_topics_without_their_own(kmq: BrokerProcess) -> None:
    plain, own = topic(kmq), topic(kmq, **{"max.message.bytes": "100000"})
    try:
        set_broker(kmq, "1", message_max_bytes="2000")
        big = produce(kmq, plain, b"x" * 5000)
        assert big is not None and big.code() == KafkaError.MSG_SIZE_TOO_LARGE
        assert produce(kmq, own, b"x" * 5000) is None, "its own max.message.bytes wins"
        entry = describe(kmq, "topic", plain)["max.message.bytes"]
        assert (entry.value, entry.source) == ("2000", DYNAMIC_BROKER)
        entry = describe(kmq, "topic", own)["max.message.bytes"]
        assert (entry.value, entry.source) == ("100000", TOPIC)
        entry = describe(kmq, "broker", "1")["message.max.bytes"]
        assert (entry.value, entry.source, entry.is_read_only) == ("2000", DYNAMIC_BROKER, False)
    finally:
        set_broker(kmq, "1", message_max_bytes=None)
    assert produce(kmq, plain, b"x" * 5000) is None
    entry = describe(kmq, "topic", plain)["max.message.bytes"]
    assert entry.source == DEFAULT


def test_a_broker_retention_default_deletes_old_records_of_topics_that_follow_it(
        kmq: BrokerProcess) -> None:
    plain, own = topic(kmq), topic(kmq, **{"retention.ms": str(7 * 24 * 3600 * 1000)})
    hour_ago = int(time.time() * 1000) - 3600 * 1000
    for name in (plain, own):
        assert produce(kmq, name, b"old", timestamp=hour_ago) is None
        assert produce(kmq, name, b"old too", timestamp=hour_ago) is None
    try:
        set_broker(kmq, "1", log_retention_ms="60000")
        client = admin(kmq)  # a partition added afterwards follows the default too
        client.create_partitions([NewPartitions(plain, 2)])[plain].result(WAIT)
        for _ in range(2):
            assert produce(kmq, plain, b"old", timestamp=hour_ago, partition=1) is None
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline and (
                low_watermark(kmq, plain) < 2 or low_watermark(kmq, plain, 1) < 2):
            time.sleep(0.2)
        assert low_watermark(kmq, plain) == low_watermark(kmq, plain, 1) == 2
        assert low_watermark(kmq, own) == 0
    finally:
        set_broker(kmq, "1", log_retention_ms=None)


def test_a_broker_cleanup_policy_default_makes_topics_compacted(kmq: BrokerProcess) -> None:
    """Kafka refuses a record without a key on a compacted topic; so does a topic that is
    compacted through the broker's default."""
    name = topic(kmq)
    try:
        set_broker(kmq, "1", log_cleanup_policy="compact")
        entry = describe(kmq, "topic", name)["cleanup.policy"]
        assert (entry.value, entry.source) == ("compact", DYNAMIC_BROKER)
        keyless = produce(kmq, name, b"v", key=None)
        assert keyless is not None and keyless.code() == KafkaError.INVALID_RECORD
    finally:
        set_broker(kmq, "1", log_cleanup_policy=None)
    assert produce(kmq, name, b"v", key=None) is None


def test_only_the_log_defaults_can_change_and_bad_values_are_refused(kmq: BrokerProcess) -> None:
    with pytest.raises(ck.KafkaException) as info:
        set_broker(kmq, "1", num_io_threads="4")
    assert info.value.args[0].code() == KafkaError.INVALID_REQUEST
    assert "Cannot update these configs dynamically: num.io.threads" in str(info.value)
    with pytest.raises(ck.KafkaException) as info:
        set_broker(kmq, "1", log_retention_ms="soon")
    assert info.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert "log.retention.ms" not in describe(kmq, "broker", "1")


def test_the_cluster_wide_default_and_a_restart(tmp_path: Path) -> None:
    """The ``""`` broker resource (what ``--entity-default`` names; kafka-python and
    confluent-kafka cannot address it, so a raw IncrementalAlterConfigs does), beneath this
    broker's own value, both kept across a restart."""
    from kio.schema.incremental_alter_configs.v1.request import (
        AlterableConfig, AlterConfigsResource, IncrementalAlterConfigsRequest,
    )
    from kio.static.primitive import i8
    from rawkafka import RawClient

    b = start_broker(tmp_path)
    try:
        name = topic(b)
        with RawClient(b.kafka_port) as raw:
            response = raw.call(IncrementalAlterConfigsRequest(resources=(AlterConfigsResource(
                resource_type=i8(4), resource_name="", configs=(AlterableConfig(
                    name="log.retention.ms", config_operation=i8(0), value="3600000"),)),),
                validate_only=False))
        assert response.responses[0].error_code == 0
        entry = describe(b, "topic", name)["retention.ms"]
        assert (entry.value, entry.source) == ("3600000", DYNAMIC_DEFAULT)
        set_broker(b, "1", log_retention_ms="7200000")
        b.stop()
        b.restart()
        entry = describe(b, "topic", name)["retention.ms"]
        assert (entry.value, entry.source) == ("7200000", DYNAMIC_BROKER)
        set_broker(b, "1", log_retention_ms=None)
        entry = describe(b, "topic", name)["retention.ms"]
        assert (entry.value, entry.source) == ("3600000", DYNAMIC_DEFAULT)
    finally:
        b.stop()
