"""``__consumer_offsets`` as Kafka shows it, with real clients: it appears (internal, 50
partitions, empty here: offsets live in the store's coordinator channels) once a group has
looked for its coordinator, a consumer that does not exclude internal topics subscribes to it
by pattern and reads it without errors, and no client may produce to it."""
from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer

from conftest import start_broker

OFFSETS = "__consumer_offsets"


def _topics(bootstrap: str) -> dict:
    return AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics


def _until(check, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_the_offsets_topic_appears_once_a_group_looks_for_its_coordinator(tmp_path) -> None:
    # No initial rebalance delay: two groups join here, and the delay is not what it tests.
    b = start_broker(tmp_path, env={"CONNECTORS_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0"})
    try:
        topic = f"t-{uuid.uuid4().hex[:8]}"
        p = Producer({"bootstrap.servers": b.bootstrap})
        p.produce(topic, b"v")
        p.flush(10)
        assert OFFSETS not in _topics(b.bootstrap)  # as on a fresh Kafka: no group yet

        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g1",
                      "auto.offset.reset": "earliest"})
        c.subscribe([topic])
        msg = c.poll(15)
        assert msg is not None and msg.value() == b"v"
        c.close()
        assert _until(lambda: OFFSETS in _topics(b.bootstrap))
        md = _topics(b.bootstrap)[OFFSETS]
        assert len(md.partitions) == 50 and md.error is None

        # kafka-python learns it is internal: left out of topics(), listed when asked for.
        k = KafkaConsumer(bootstrap_servers=b.bootstrap)
        assert topic in k.topics() and OFFSETS not in k.topics()
        cluster = k._client.cluster
        assert OFFSETS in cluster.internal_topics
        assert OFFSETS in cluster.topics(exclude_internal_topics=False)
        k.close()

        # A pattern subscriber that does not exclude it is assigned it and reads it cleanly.
        k = KafkaConsumer(bootstrap_servers=b.bootstrap, group_id="g2",
                          exclude_internal_topics=False, auto_offset_reset="earliest",
                          consumer_timeout_ms=4000)
        k.subscribe(pattern="^.*$")
        got = [(m.topic, m.value) for m in k]
        assert OFFSETS in k.subscription() and got == [(topic, b"v")]
        assert any(tp.topic == OFFSETS for tp in k.assignment())
        k.close()

        # Nobody produces to it, whatever the client (INVALID_TOPIC_EXCEPTION, as Kafka).
        errors: list = []
        p = Producer({"bootstrap.servers": b.bootstrap, "message.timeout.ms": 5000,
                      "on_delivery": lambda err, _m: errors.append(err)})
        p.produce(OFFSETS, b"x")
        p.flush(10)
        assert errors and errors[0].code() == KafkaError.TOPIC_EXCEPTION
        # The client must outlive its future: destroying it purges the unserved answer.
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        created = admin.create_topics([NewTopic(OFFSETS, 1, 1)])[OFFSETS]
        assert created.exception(10) is not None
        assert "Traceback" not in b.log()
    finally:
        b.stop()
