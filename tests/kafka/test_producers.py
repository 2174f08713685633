"""InitProducerId: idempotent producers of every client library get unique, restart-safe ids."""

import datetime


from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest

from conftest import start_broker
from rawkafka import RawClient


def init(port, pid=-1, epoch=-1, txn=None):
    with RawClient(port) as c:
        return c.call(InitProducerIdRequest(transactional_id=txn,
                                            transaction_timeout=datetime.timedelta(seconds=60),
                                            producer_id=pid, producer_epoch=epoch))


def test_ids_are_unique_and_never_reused_after_restart(tmp_path):
    b = start_broker(tmp_path)
    try:
        first = [init(b.kafka_port) for _ in range(3)]
        assert all(r.error_code == ErrorCode.none and r.producer_epoch == 0 for r in first)
        ids = [r.producer_id for r in first]
        assert len(set(ids)) == 3
        b.kill()  # no graceful shutdown: the reserved block must already be durable
        b.restart()
        later = init(b.kafka_port)
        assert later.producer_id not in ids and later.producer_id > max(ids)
    finally:
        b.stop()


def test_naming_an_existing_producer_gets_a_new_id_as_in_kafka(broker):
    """Kafka's InitProducerId without a transactional id always answers a new producer id at
    epoch 0, whatever id and epoch it names: no client can fence another's producer."""
    r = init(broker.kafka_port)
    again = init(broker.kafka_port, pid=r.producer_id, epoch=r.producer_epoch)
    assert again.producer_id != r.producer_id and again.producer_epoch == 0
    claimed = init(broker.kafka_port, pid=987654321, epoch=7)
    assert claimed.producer_id not in (987654321, r.producer_id, again.producer_id)
    assert claimed.producer_epoch == 0


def test_a_half_named_producer_is_an_invalid_request_as_in_kafka(broker):
    """KafkaApis answers INVALID_REQUEST when only one of producer id and epoch is -1, and
    hands out no id; naming both, or neither, is served."""
    for pid, epoch in ((-1, 3), (42, -1)):
        r = init(broker.kafka_port, pid=pid, epoch=epoch)
        assert (r.error_code, r.producer_id, r.producer_epoch) == (
            ErrorCode.invalid_request, -1, -1)
    assert init(broker.kafka_port, pid=42, epoch=3).error_code == ErrorCode.none
    assert init(broker.kafka_port).error_code == ErrorCode.none


def test_default_kafka_python_producer_is_idempotent_and_works(broker):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    p = KafkaProducer(bootstrap_servers=broker.bootstrap)  # enable_idempotence defaults to True
    metas = [p.send("idem", value=b"v%d" % i).get(timeout=15) for i in range(20)]
    p.close()
    assert [m.offset for m in metas] == list(range(20))
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                      consumer_timeout_ms=5000)
    c.assign([TopicPartition("idem", 0)])
    got = [m.value for m in c]
    c.close()
    assert got == [b"v%d" % i for i in range(20)]


def test_confluent_idempotent_producer_works(broker):
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    errors, offsets = [], []
    for i in range(50):
        p.produce("idem2", value=b"x%d" % i,
                  on_delivery=lambda e, m: errors.append(e) if e else offsets.append(m.offset()))
    assert p.flush(20) == 0
    assert errors == [] and sorted(offsets) == list(range(50))
