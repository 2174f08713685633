"""/metrics tells the truth about requests, connections, storage and partition ends."""

import re

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import http_get


def metric(text, name, **labels):
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_metrics_cover_requests_latency_connections_store_and_log_end(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("obs", 2)])["obs"].result(15)
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for i in range(10):
        p.produce("obs", value=b"v" * 100, partition=i % 2)
    assert p.flush(15) == 0
    text = http_get(broker.http_port, "/metrics").decode()
    assert metric(text, "kmqkafka_partition_log_end_offset", topic="obs", partition="0") == 5
    assert metric(text, "kmqkafka_partition_log_end_offset", topic="obs", partition="1") == 5
    assert metric(text, "kmqkafka_partition_log_start_offset", topic="obs", partition="0") == 0
    assert metric(text, "kmqkafka_store_size_bytes", channel="kafka.obs~1") > 500
    assert metric(text, "kmqkafka_kafka_requests_total", api="produce") >= 1
    assert metric(text, "kmqkafka_kafka_request_latency_seconds_count", api="produce") >= 1
    assert re.search(r"kmqkafka_kafka_connections(_open)?\S* [1-9]", text), "open connections gauge"
    assert metric(text, "kmqkafka_kafka_topic_bytes_in_total", topic="obs") > 1000


def test_a_deleted_topic_leaves_metrics(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("obs-gone", 1)])["obs-gone"].result(15)
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    p.produce("obs-gone", value=b"v" * 100)
    assert p.flush(15) == 0
    text = http_get(broker.http_port, "/metrics").decode()
    assert metric(text, "kmqkafka_kafka_topic_bytes_in_total", topic="obs-gone") > 100
    admin.delete_topics(["obs-gone"])["obs-gone"].result(15)
    text = http_get(broker.http_port, "/metrics").decode()
    assert 'topic="obs-gone"' not in text and "kafka.obs-gone" not in text


def test_bytes_in_counts_only_stored_batches(broker):
    """As Kafka's bytesInRate, marked after the append: a batch refused when applied (here
    an idempotent producer's sequence gap) adds nothing."""
    import time

    from kio.schema.errors import ErrorCode as E

    from kmqkafka import records
    from tests.raft.test_kafka_cluster import ms, req
    from tests.rawkafka import RawClient

    Pr, Td, Pd = (req("produce", 9, n) for n in
                  ("ProduceRequest", "TopicProduceData", "PartitionProduceData"))

    def produce(raw, seq):
        batch = records.build_batch([records.NewRecord(value=b"v" * 200)],
                                    now_ms=int(time.time() * 1000), producer_id=7,
                                    producer_epoch=0, base_sequence=seq)
        r = raw.call(Pr(transactional_id=None, acks=-1, timeout=ms(10000), topic_data=(
            Td(name="obs-in", partition_data=(Pd(index=0, records=batch),)),)))
        return r.responses[0].partition_responses[0].error_code, len(batch)

    with RawClient(broker.kafka_port) as raw:
        code, size = produce(raw, 0)
        assert code == E.none
        assert produce(raw, 5)[0] == E.out_of_order_sequence_number
    text = http_get(broker.http_port, "/metrics").decode()
    assert metric(text, "kmqkafka_kafka_topic_bytes_in_total", topic="obs-in") == size
