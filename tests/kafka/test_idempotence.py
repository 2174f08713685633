"""Idempotent producers on the wire: a retried batch is stored once and answered with its
original offset, a sequence gap is OUT_OF_ORDER_SEQUENCE_NUMBER (45), an old epoch is
INVALID_PRODUCER_EPOCH (47), also after a restart, a crash, and a Raft leader change; a real
idempotent client produces exactly what it sent."""
from __future__ import annotations

import datetime
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerProcess, _wait_healthy, free_port, start_broker
from kio.schema.create_topics.v5.request import (
    CreatableTopic, CreatableTopicConfig, CreateTopicsRequest,
)
from kio.schema.errors import ErrorCode as E
from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from rawkafka import RawClient

from kmqkafka import records

MS = datetime.timedelta(milliseconds=1)


@pytest.fixture(scope="module")
def shared(shared_broker: BrokerProcess) -> BrokerProcess:
    return shared_broker


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def idem(pid: int, epoch: int, seq: int, n: int = 1, tag: bytes = b"v") -> bytes:
    return records.build_batch(
        [records.NewRecord(value=tag + b"%d" % (seq + i), timestamp=1_700_000_000_000 + i)
         for i in range(n)],
        now_ms=1_700_000_000_000, producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def produce_request(topic: str, batch: bytes, acks: int = -1) -> ProduceRequest:
    return ProduceRequest(transactional_id=None, acks=acks, timeout=5000 * MS, topic_data=(
        TopicProduceData(name=topic, partition_data=(
            PartitionProduceData(index=0, records=batch),)),))


def produce(port: int, topic: str, batch: bytes) -> Any:
    with RawClient(port) as c:
        (t,) = c.call(produce_request(topic, batch)).responses
    (p,) = t.partition_responses
    return p


def init_producer(port: int, pid: int = -1, epoch: int = -1) -> tuple[int, int]:
    with RawClient(port) as c:
        r = c.call(InitProducerIdRequest(transactional_id=None,
                                         transaction_timeout=60_000 * MS,
                                         producer_id=pid, producer_epoch=epoch))
    assert r.error_code is E.none
    return r.producer_id, r.producer_epoch


def stored(port: int, topic: str) -> list[tuple[int, bytes, int, int]]:
    """(offset, value, producer id, base sequence) of every record of partition 0."""
    out: list[tuple[int, bytes, int, int]] = []
    with RawClient(port) as c:
        while True:
            r = c.call(FetchRequest(
                replica_id=-1, max_wait=0 * MS, min_bytes=1, max_bytes=1 << 20,
                isolation_level=0, session_id=0, session_epoch=-1,
                topics=(FetchTopic(topic=topic, partitions=(FetchPartition(
                    partition=0, current_leader_epoch=-1, fetch_offset=len(out),
                    log_start_offset=-1, partition_max_bytes=1 << 20),)),),
                forgotten_topics_data=(), rack_id=""))
            part = r.responses[0].partitions[0]
            assert part.error_code is E.none, part
            data = bytes(part.records or b"")
            if not data:
                return out
            for pos, header in records.split_batches(data):
                for rec in records.iter_records(data, pos):
                    out.append((rec.offset, rec.value, header.producer_id, header.base_sequence))


def test_a_retried_batch_is_stored_once_and_answered_with_its_offset(shared: BrokerProcess):
    port, topic = shared.kafka_port, unique("retry")
    pid, epoch = init_producer(port)
    first = produce(port, topic, idem(pid, epoch, 0, 3))
    assert (first.error_code, first.base_offset) == (E.none, 0)
    again = produce(port, topic, idem(pid, epoch, 0, 3))
    assert (again.error_code, again.base_offset, again.error_message) == (E.none, 0, None)
    assert produce(port, topic, idem(pid, epoch, 3, 2)).base_offset == 3
    assert produce(port, topic, idem(pid, epoch, 0, 3)).base_offset == 0  # still in the last 5
    got = stored(port, topic)
    assert [(o, v) for o, v, _p, _s in got] == [(i, b"v%d" % i) for i in range(5)]


def test_pipelined_requests_and_their_retries(shared: BrokerProcess):
    """Five requests in flight at once, then all five again (a client that lost its
    connection): the retries are answered with the first round's offsets, in order."""
    port, topic = shared.kafka_port, unique("inflight")
    pid, epoch = init_producer(port)
    batches = [idem(pid, epoch, 2 * i, 2) for i in range(5)]
    with RawClient(port) as c:
        for round_ in range(2):
            requests = [produce_request(topic, b) for b in batches]
            for r in requests:
                c.send(r)
            answers = [c.receive(r).responses[0].partition_responses[0] for r in requests]
            assert [(a.error_code, a.base_offset) for a in answers] == \
                [(E.none, 2 * i) for i in range(5)], round_
    assert [o for o, *_ in stored(port, topic)] == list(range(10))


def test_a_sequence_gap_is_out_of_order_and_stores_nothing(shared: BrokerProcess):
    port, topic = shared.kafka_port, unique("gap")
    pid, epoch = init_producer(port)
    produce(port, topic, idem(pid, epoch, 0, 2))
    gap = produce(port, topic, idem(pid, epoch, 5))
    assert gap.error_code is E.out_of_order_sequence_number
    # As Kafka's ReplicaManager answers OutOfOrderSequenceException: the log start offset,
    # no error message.
    assert (gap.base_offset, gap.log_start_offset, gap.error_message) == (-1, 0, None)
    assert produce(port, topic, idem(pid, epoch, 2)).base_offset == 2
    assert len(stored(port, topic)) == 3


def test_an_old_epoch_is_refused_and_a_new_epoch_restarts_at_zero(shared: BrokerProcess):
    port, topic = shared.kafka_port, unique("epoch")
    pid, epoch = init_producer(port)
    produce(port, topic, idem(pid, epoch, 0, 4))
    bumped = epoch + 1  # KIP-360: an idempotent producer bumps its own epoch
    not_zero = produce(port, topic, idem(pid, bumped, 4))
    assert not_zero.error_code is E.out_of_order_sequence_number
    assert produce(port, topic, idem(pid, bumped, 0, 2)).base_offset == 4
    old = produce(port, topic, idem(pid, epoch, 4))
    assert (old.error_code, old.log_start_offset, old.error_message) == (
        E.invalid_producer_epoch, 0, None)
    # A retry of an old-epoch batch is no duplicate any more: the epoch is checked.
    assert produce(port, topic, idem(pid, epoch, 0, 4)).error_code is E.invalid_producer_epoch
    assert len(stored(port, topic)) == 6


def test_a_duplicate_on_a_log_append_time_topic_reports_the_original_append_time(
        shared: BrokerProcess):
    port, topic = shared.kafka_port, unique("lat")
    with RawClient(port) as c:
        created = c.call(CreateTopicsRequest(topics=(CreatableTopic(
            name=topic, num_partitions=1, replication_factor=1, assignments=(),
            configs=(CreatableTopicConfig(name="message.timestamp.type",
                                          value="LogAppendTime"),)),),
            timeout=5000 * MS, validate_only=False))
    assert created.topics[0].error_code is E.none
    pid, epoch = init_producer(port)
    first = produce(port, topic, idem(pid, epoch, 0, 2))
    time.sleep(0.05)
    again = produce(port, topic, idem(pid, epoch, 0, 2))
    assert first.log_append_time is not None
    assert (again.error_code, again.base_offset) == (E.none, 0)
    assert again.log_append_time == first.log_append_time
    assert len(stored(port, topic)) == 2


def test_a_producer_id_without_a_sequence_is_an_invalid_record(shared: BrokerProcess):
    answer = produce(shared.kafka_port, unique("noseq"), idem(7, 0, -1))
    assert (answer.error_code, answer.error_message) == (E.invalid_record, None)


def test_a_transactional_batch_without_a_transactional_id_is_refused(shared: BrokerProcess):
    """Kafka checks the transactional id of a Produce carrying transactional batches before
    anything else: a request without one gets TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53), and
    the batch is never stored, where it would open a transaction no coordinator knows."""
    pid, epoch = init_producer(shared.kafka_port)
    topic = unique("txn-batch")
    txn = records.build_batch([records.NewRecord(value=b"t", timestamp=1_700_000_000_000)],
                              now_ms=1_700_000_000_000, attributes=records.TRANSACTIONAL_FLAG,
                              producer_id=pid, producer_epoch=epoch, base_sequence=0)
    answer = produce(shared.kafka_port, topic, txn)
    assert (answer.error_code, answer.base_offset) == (
        E.transactional_id_authorization_failed, -1)
    assert produce(shared.kafka_port, topic, idem(pid, epoch, 0)).base_offset == 0
    assert [v for _o, v, _p, _s in stored(shared.kafka_port, topic)] == [b"v0"]


def test_an_unknown_producer_may_start_anywhere_and_plain_batches_are_unchecked(
        shared: BrokerProcess):
    port, topic = shared.kafka_port, unique("unknown")
    assert produce(port, topic, idem(123456, 3, 777)).base_offset == 0  # e.g. state expired
    plain = records.build_batch([records.NewRecord(value=b"p")], now_ms=1)
    assert [produce(port, topic, plain).base_offset for _ in range(2)] == [1, 2]


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_retry_after_a_restart_is_still_a_duplicate(tmp_path: Path, how: str):
    """The producer state is rebuilt from the log's tail: after a clean stop or a kill -9,
    the retry of an acknowledged batch is answered with its offset and not stored again, and
    the producer's sequence and epoch are still checked."""
    b = start_broker(tmp_path)
    try:
        port, topic = b.kafka_port, "restart"
        pid, epoch = init_producer(port)
        for i in range(4):
            assert produce(port, topic, idem(pid, epoch, 3 * i, 3)).base_offset == 3 * i
        other = produce(port, topic, records.build_batch([records.NewRecord(value=b"o")],
                                                         now_ms=1))
        assert other.base_offset == 12
        b.kill() if how == "kill" else b.stop()
        b.restart()
        for i in range(4):
            again = produce(port, topic, idem(pid, epoch, 3 * i, 3))
            assert (again.error_code, again.base_offset) == (E.none, 3 * i)
        assert produce(port, topic, idem(pid, epoch, 13)).error_code \
            is E.out_of_order_sequence_number
        assert produce(port, topic, idem(pid, epoch - 1, 12)).error_code \
            is E.invalid_producer_epoch
        assert produce(port, topic, idem(pid, epoch, 12)).base_offset == 13
        assert [o for o, *_ in stored(port, topic)] == list(range(14))
    finally:
        b.stop()


def test_confluent_idempotent_producer_stores_exactly_what_it_sent(shared: BrokerProcess):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    topic, n = unique("exactly"), 2000
    p = confluent_kafka.Producer({"bootstrap.servers": shared.bootstrap,
                                  "enable.idempotence": True, "linger.ms": 2,
                                  "batch.num.messages": 50})
    errors: list = []
    for i in range(n):
        p.produce(topic, value=b"m%05d" % i, partition=0,
                  on_delivery=lambda e, _m: errors.append(e) if e else None)
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(30) == 0
    assert errors == []
    c = confluent_kafka.Consumer({"bootstrap.servers": shared.bootstrap,
                                  "group.id": unique("g"), "auto.offset.reset": "earliest",
                                  "enable.auto.commit": False})
    c.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append((m.offset(), m.value()))
    assert c.poll(1.0) is None  # and nothing more
    c.close()
    assert got == [(i, b"m%05d" % i) for i in range(n)]
    pids = {pid for _o, _v, pid, _s in stored(shared.kafka_port, topic)}
    assert len(pids) == 1 and pids.pop() >= 0  # it really was an idempotent producer


# --- a Raft cluster: every node decides alike --------------------------------------------------


def _controller(port: int) -> int:
    with RawClient(port, timeout=3) as c:
        r = c.call(MetadataRequest(topics=(MetadataRequestTopic(name="x", topic_id=None),),
                                   allow_auto_topic_creation=False,
                                   include_topic_authorized_operations=False))
    return r.controller_id


def _wait_leader(brokers: dict[int, BrokerProcess], not_: int | None = None) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        seen = set()
        for b in brokers.values():
            if b.proc.poll() is None:
                try:
                    seen.add(_controller(b.kafka_port))
                except OSError:
                    seen.add(None)
        if len(seen) == 1 and (leader := seen.pop()) not in (None, -1, not_):
            return leader
        time.sleep(0.2)
    raise AssertionError("no Raft leader agreed on")


def _stored_on(port: int, expected: list) -> list:
    """(offset, base sequence) of every record one node serves, once it has them all (a node
    that just restarted may take a moment to replay)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            got = [(o, s) for o, _v, _p, s in stored(port, "t")]
        except (AssertionError, OSError):
            got = []
        if len(got) >= len(expected) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_a_new_raft_leader_still_recognises_a_retry(tmp_path: Path):
    """Each node checks sequences when it applies a batch, from its own copy of the log: a
    retry sent to a follower (forwarded) or to the next leader after the first one was
    killed is a duplicate there too, and every node stores the batch once."""
    ids = (1, 2, 3)
    raft_ports = {i: free_port() for i in ids}
    kafka_ports = {i: free_port() for i in ids}
    peers = ",".join(f"{i}=127.0.0.1:{raft_ports[i]}/127.0.0.1:{kafka_ports[i]}" for i in ids)
    brokers: dict[int, BrokerProcess] = {}
    try:
        for i in ids:
            (tmp_path / f"n{i}").mkdir()
            brokers[i] = start_broker(tmp_path / f"n{i}", wait=False, env={
                "KMQKAFKA_NODE_ID": str(i), "KMQKAFKA_PEERS": peers,
                "CONNECTORS_KAFKA_PORT": str(kafka_ports[i]), "KMQKAFKA_RAFT_TICK_MS": "50"})
        for b in brokers.values():
            _wait_healthy(b, 30)
        leader = _wait_leader(brokers)
        follower = next(i for i in ids if i != leader)
        pid, epoch = init_producer(kafka_ports[leader])
        assert produce(kafka_ports[leader], "t", idem(pid, epoch, 0, 2)).base_offset == 0
        assert produce(kafka_ports[leader], "t", idem(pid, epoch, 2, 2)).base_offset == 2
        via_follower = produce(kafka_ports[follower], "t", idem(pid, epoch, 2, 2))
        assert (via_follower.error_code, via_follower.base_offset) == (E.none, 2)
        gap = produce(kafka_ports[follower], "t", idem(pid, epoch, 9))
        assert gap.error_code is E.out_of_order_sequence_number
        time.sleep(2.5)  # past the applied-index checkpoint (1 s): restart replays no append
        brokers[leader].kill()
        new_leader = _wait_leader(brokers, not_=leader)
        retry = produce(kafka_ports[new_leader], "t", idem(pid, epoch, 2, 2))
        assert (retry.error_code, retry.base_offset) == (E.none, 2)
        assert produce(kafka_ports[new_leader], "t", idem(pid, epoch, 4)).base_offset == 4
        brokers[leader].restart()  # rebuilds from its own log, then catches up
        expected = [(0, 0), (1, 0), (2, 2), (3, 2), (4, 4)]
        assert all(_stored_on(kafka_ports[i], expected) == expected for i in ids)
        # Sent to the restarted node (a follower now): every node, the restarted one included,
        # applies it as the duplicate it is; a node that had forgotten would store it again.
        again = produce(kafka_ports[leader], "t", idem(pid, epoch, 4))
        assert (again.error_code, again.base_offset) == (E.none, 4)
        marker = produce(kafka_ports[new_leader], "t", idem(pid, epoch, 5))
        assert marker.base_offset == 5
        expected.append((5, 5))
        assert all(_stored_on(kafka_ports[i], expected) == expected for i in ids)
    finally:
        for b in brokers.values():
            if b.proc.poll() is None:
                b.kill()


def test_describe_producers_lists_the_idempotent_producers(shared: BrokerProcess):
    """kafka-python's describe_producers (DescribeProducers v0): each idempotent producer of
    the partition with its epoch and last sequence; a plain producer leaves no trace."""
    from kafka.admin import KafkaAdminClient
    from kafka.structs import TopicPartition

    topic = unique("described")
    pid, epoch = init_producer(shared.kafka_port)
    assert produce(shared.kafka_port, topic, idem(pid, epoch, 0, n=3)).error_code == E.none
    assert produce(shared.kafka_port, topic, idem(pid, epoch, 3, n=2)).error_code == E.none
    plain = records.build_batch([records.NewRecord(value=b"plain")], now_ms=1_700_000_000_000)
    assert produce(shared.kafka_port, topic, plain).error_code == E.none
    admin = KafkaAdminClient(bootstrap_servers=shared.bootstrap)
    try:
        result = admin.describe_producers([TopicPartition(topic, 0)])
    finally:
        admin.close()
    (state,) = result.values()
    producers = state.active_producers
    assert [(p.producer_id, p.producer_epoch, p.last_sequence) for p in producers] == [
        (pid, epoch, 4)]
    assert producers[0].last_timestamp > 0
