"""CONNECTORS_KAFKA_PRODUCE_BYTE_RATE / _FETCH_BYTE_RATE slow a client down to its quota."""

import time

from confluent_kafka import Consumer, Producer, TopicPartition

from conftest import start_broker

RATE = 200_000  # bytes/s
TOTAL = 1_000_000


def produce(bootstrap, topic, throttles):
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
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
