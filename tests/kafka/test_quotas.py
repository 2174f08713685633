"""CONNECTORS_KAFKA_PRODUCE_BYTE_RATE / _FETCH_BYTE_RATE slow a client down to its quota."""

import time

from confluent_kafka import Consumer, Producer, TopicPartition

from conftest import start_broker

RATE = 200_000  # bytes/s
TOTAL = 1_000_000


def produce(bootstrap, topic, throttles, client_id="rdkafka"):
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                  "client.id": client_id,
                  "throttle_cb": lambda event: throttles.append(event.throttle_time)})
    start = time.monotonic()
    for _ in range(TOTAL // 1000):
        p.produce(topic, value=b"x" * 1000)
        p.poll(0)
    assert p.flush(60) == 0
    return time.monotonic() - start


def consume(bootstrap, topic):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "q", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    start, got = time.monotonic(), 0
    while got < TOTAL // 1000 and time.monotonic() - start < 60:
        msg = c.poll(0.5)
        if msg is not None and msg.error() is None:
            got += 1
    c.close()
    assert got == TOTAL // 1000
    return time.monotonic() - start


def test_produce_and_fetch_byte_rates_hold_clients_to_the_quota(tmp_path):
    b = start_broker(tmp_path, env={"CONNECTORS_KAFKA_PRODUCE_BYTE_RATE": str(RATE),
                                    "CONNECTORS_KAFKA_FETCH_BYTE_RATE": str(RATE)})
    try:
        throttles = []
        took = produce(b.bootstrap, "slow", throttles)
        # One second of burst, then the rest at RATE: at least ~4 s for 1 MB.
        assert took >= (TOTAL - RATE) / RATE * 0.8, took
        assert any(t > 0 for t in throttles), "responses must report throttle_time_ms"
        took = consume(b.bootstrap, "slow")
        assert took >= (TOTAL - RATE) / RATE * 0.8, took
    finally:
        b.stop()


def test_without_quotas_the_same_traffic_is_fast(broker):
    assert produce(broker.bootstrap, "fast", []) < 3.0
    assert consume(broker.bootstrap, "fast") < 3.0


def _alter_quota(port, entity, key, value, *, remove=False, validate_only=False):
    """AlterClientQuotas as ``kafka-configs --alter --entity-type ...`` sends it (no Python
    client exposes it)."""
    from kio.schema.alter_client_quotas.v1.request import (
        AlterClientQuotasRequest, EntityData, EntryData, OpData,
    )
    from kio.static.primitive import f64
    from rawkafka import RawClient

    with RawClient(port) as raw:
        return raw.call(AlterClientQuotasRequest(entries=(EntryData(
            entity=tuple(EntityData(entity_type=t, entity_name=n) for t, n in entity),
            ops=(OpData(key=key, value=f64(float(value)), remove=remove),)),),
            validate_only=validate_only)).entries[0]


def _describe_quotas(port, entity_type, name):
    from kio.schema.describe_client_quotas.v1.request import (
        ComponentData, DescribeClientQuotasRequest,
    )
    from kio.static.primitive import i8
    from rawkafka import RawClient

    with RawClient(port) as raw:
        response = raw.call(DescribeClientQuotasRequest(components=(ComponentData(
            entity_type=entity_type, match_type=i8(0), match=name),), strict=False))
    assert response.error_code == 0, response
    return {(tuple((e.entity_type, e.entity_name) for e in entry.entity)):
            {v.key: v.value for v in entry.values} for entry in response.entries}


def test_a_client_quota_set_at_runtime_holds_that_client_alone(tmp_path):
    """kafka-configs --alter --entity-type clients --entity-name slowpoke --add-config
    producer_byte_rate=...: that client is slowed at once, others are not; the quota is
    described, survives a restart, and removing it lifts it."""
    b = start_broker(tmp_path)
    try:
        entity = (("client-id", "slowpoke"),)
        dry = _alter_quota(b.kafka_port, entity, "producer_byte_rate", RATE, validate_only=True)
        assert dry.error_code == 0 and _describe_quotas(b.kafka_port, "client-id",
                                                        "slowpoke") == {}
        assert _alter_quota(b.kafka_port, entity, "producer_byte_rate", RATE).error_code == 0
        assert _describe_quotas(b.kafka_port, "client-id", "slowpoke") == {
            entity: {"producer_byte_rate": RATE}}
        bad = _alter_quota(b.kafka_port, entity, "producer_byte_rate", 1.5)
        assert (bad.error_code, bad.error_message) == (
            42, "Configuration producer_byte_rate must be a Long value")
        throttles = []
        took = produce(b.bootstrap, "q-runtime", throttles, "slowpoke")
        assert took >= (TOTAL - RATE) / RATE * 0.8, took
        assert any(t > 0 for t in throttles)
        assert produce(b.bootstrap, "q-runtime", [], "speedy") < 3.0
        b.stop()
        b.restart()
        assert _describe_quotas(b.kafka_port, "client-id", "slowpoke") == {
            entity: {"producer_byte_rate": RATE}}
        assert _alter_quota(b.kafka_port, entity, "producer_byte_rate", 0,
                            remove=True).error_code == 0
        assert _describe_quotas(b.kafka_port, "client-id", "slowpoke") == {}
        assert produce(b.bootstrap, "q-runtime", [], "slowpoke") < 3.0
    finally:
        b.stop()
