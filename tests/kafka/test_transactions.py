"""Transactions (KIP-98) with real clients: what commits is seen by read_committed consumers
and what aborts is not, across confluent-kafka, kafka-python and aiokafka (each filters aborted
records with the broker's aborted-transaction list); an open transaction holds the last stable
offset back; consume-transform-produce commits its offsets only with the transaction; a second
producer with the same transactional id fences the first; a forgotten transaction is aborted
after its timeout; and all of it survives kill -9.
"""
from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerProcess, start_broker
from kio.schema.add_partitions_to_txn.v3.request import (
    AddPartitionsToTxnRequest, AddPartitionsToTxnTopic,
)
from kio.schema.end_txn.v3.request import EndTxnRequest
from kio.schema.errors import ErrorCode as E
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.list_offsets.v4.request import (
    ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic,
)
from kio.schema.offset_fetch.v7.request import OffsetFetchRequest, OffsetFetchRequestTopic
from rawkafka import RawClient

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

LATEST = -1


@pytest.fixture(scope="module")
def shared(shared_broker: BrokerProcess) -> BrokerProcess:
    return shared_broker


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def create(bootstrap: str, topic: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def txn_producer(bootstrap: str, tid: str, **conf: Any) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 1,
                  **conf})
    p.init_transactions(30)
    return p


def read(bootstrap: str, topic: str, partitions: int = 1, *, committed: bool = True,
         timeout: float = 20.0) -> list[tuple[int, int, bytes]]:
    """Every record a consumer of the given isolation reads up to each partition's end."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("reader"),
                  "isolation.level": "read_committed" if committed else "read_uncommitted",
                  "enable.partition.eof": True, "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[tuple[int, int, bytes]] = []
        ended: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(ended) < partitions and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    ended.add(m.partition())
                    continue
                raise KafkaException(m.error())
            got.append((m.partition(), m.offset(), m.value()))
        assert len(ended) == partitions, "the consumer never reached the end"
        return sorted(got)
    finally:
        c.close()


def list_offset(port: int, topic: str, partition: int = 0, *, committed: bool) -> int:
    with RawClient(port) as raw:
        r = raw.call(ListOffsetsRequest(
            replica_id=-1, isolation_level=1 if committed else 0, topics=(ListOffsetsTopic(
                name=topic, partitions=(ListOffsetsPartition(
                    partition_index=partition, current_leader_epoch=-1, timestamp=LATEST),)),)))
    p = r.topics[0].partitions[0]
    assert p.error_code is E.none
    return p.offset


def transaction(p: Producer, topic: str, prefix: bytes, n: int, *, partitions: int = 2,
                commit: bool = True) -> None:
    """One transaction of ``n`` records ``prefix-i`` spread over ``partitions``."""
    p.begin_transaction()
    for i in range(n):
        p.produce(topic, value=b"%s-%d" % (prefix, i), partition=i % partitions)
    if commit:
        p.commit_transaction(30)
    else:
        p.flush(30)
        p.abort_transaction(30)


def values(rows: list[tuple[int, int, bytes]]) -> list[bytes]:
    return [v for _p, _o, v in rows]


# --- commit and abort -------------------------------------------------------------------


def test_committed_records_are_read_and_aborted_ones_skipped(shared: BrokerProcess):
    bs, topic = shared.bootstrap, unique("commit-abort")
    create(bs, topic, 2)
    p = txn_producer(bs, unique("tid"))
    transaction(p, topic, b"c1", 6)
    transaction(p, topic, b"ab", 6, commit=False)
    transaction(p, topic, b"c2", 4, partitions=1)

    committed = read(bs, topic, 2)
    assert sorted(values(committed)) == sorted(
        [b"c1-%d" % i for i in range(6)] + [b"c2-%d" % i for i in range(4)])
    everything = read(bs, topic, 2, committed=False)
    assert sorted(values(everything)) == sorted(
        [b"c1-%d" % i for i in range(6)] + [b"ab-%d" % i for i in range(6)]
        + [b"c2-%d" % i for i in range(4)])
    # Each transaction ends with one marker per partition, which takes an offset: partition 0
    # holds c1 (3) + marker, ab (3) + marker, c2 (4) + marker.
    p0 = [(o, v) for part, o, v in everything if part == 0]
    assert [o for o, _v in p0] == [0, 1, 2, 4, 5, 6, 8, 9, 10, 11]
    assert list_offset(shared.kafka_port, topic, committed=True) == 13
    assert list_offset(shared.kafka_port, topic, committed=False) == 13


def test_an_open_transaction_holds_back_read_committed_readers(shared: BrokerProcess):
    bs, port, topic = shared.bootstrap, shared.kafka_port, unique("open")
    create(bs, topic)
    plain = Producer({"bootstrap.servers": bs})
    plain.produce(topic, value=b"before")
    plain.flush(30)
    p = txn_producer(bs, unique("tid"))
    p.begin_transaction()
    p.produce(topic, value=b"pending")
    p.flush(30)
    plain.produce(topic, value=b"after")  # not transactional, but behind the open one
    plain.flush(30)
    assert list_offset(port, topic, committed=False) == 3
    assert list_offset(port, topic, committed=True) == 1  # the open transaction's first offset
    assert values(read(bs, topic)) == [b"before"]
    assert values(read(bs, topic, committed=False)) == [b"before", b"pending", b"after"]
    p.commit_transaction(30)
    assert list_offset(port, topic, committed=True) == 4
    assert values(read(bs, topic)) == [b"before", b"pending", b"after"]


def test_a_parked_read_committed_fetch_wakes_when_the_transaction_commits(
        shared: BrokerProcess):
    bs, topic = shared.bootstrap, unique("wake")
    create(bs, topic)
    p = txn_producer(bs, unique("tid"))
    c = Consumer({"bootstrap.servers": bs, "group.id": unique("g"),
                  "isolation.level": "read_committed", "fetch.wait.max.ms": 5000})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        assert c.poll(1.0) is None
        p.begin_transaction()
        p.produce(topic, value=b"x")
        p.flush(30)
        assert c.poll(1.5) is None  # produced, but not committed
        p.commit_transaction(30)
        start = time.monotonic()
        m = None
        while m is None and time.monotonic() - start < 10:
            m = c.poll(0.2)
        assert m is not None and m.error() is None and m.value() == b"x"
        # A parked fetch answers as soon as the marker lands, not after fetch.wait.max.ms.
        assert time.monotonic() - start < 3.0
    finally:
        c.close()


def test_kafka_python_and_aiokafka_transactions_are_filtered_by_every_client(
        shared: BrokerProcess):
    kafka = pytest.importorskip("kafka")
    aiokafka = pytest.importorskip("aiokafka")
    bs, topic = shared.bootstrap, unique("clients")
    create(bs, topic)

    kp = kafka.KafkaProducer(bootstrap_servers=bs, transactional_id=unique("kp"))
    kp.init_transactions()
    kp.begin_transaction()
    kp.send(topic, b"kp-commit")
    kp.commit_transaction()
    kp.begin_transaction()
    kp.send(topic, b"kp-abort")
    kp.flush()
    kp.abort_transaction()
    kp.close()

    async def aio() -> list[bytes]:
        ap = aiokafka.AIOKafkaProducer(bootstrap_servers=bs, transactional_id=unique("ap"))
        await ap.start()
        try:
            async with ap.transaction():
                await ap.send_and_wait(topic, b"aio-commit")
            await ap.begin_transaction()
            await ap.send_and_wait(topic, b"aio-abort")
            await ap.abort_transaction()
        finally:
            await ap.stop()
        consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=bs,
                                             isolation_level="read_committed",
                                             auto_offset_reset="earliest")
        await consumer.start()
        try:
            tp = aiokafka.TopicPartition(topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            got: list[bytes] = []
            deadline = time.monotonic() + 15
            while len(got) < 2 and time.monotonic() < deadline:
                batch = await consumer.getmany(tp, timeout_ms=500)
                got += [m.value for m in batch.get(tp, [])]
            return got
        finally:
            await consumer.stop()

    assert asyncio.run(aio()) == [b"kp-commit", b"aio-commit"]
    kc = kafka.KafkaConsumer(bootstrap_servers=bs, isolation_level="read_committed",
                             auto_offset_reset="earliest", consumer_timeout_ms=3000)
    kc.assign([kafka.TopicPartition(topic, 0)])
    assert [m.value for m in kc] == [b"kp-commit", b"aio-commit"]
    kc.close()
    assert values(read(bs, topic)) == [b"kp-commit", b"aio-commit"]
    assert values(read(bs, topic, committed=False)) == [
        b"kp-commit", b"kp-abort", b"aio-commit", b"aio-abort"]


# --- consume-transform-produce ----------------------------------------------------------


def test_offsets_sent_to_a_transaction_commit_only_with_it(shared: BrokerProcess):
    bs, port = shared.bootstrap, shared.kafka_port
    src, dst, group = unique("src"), unique("dst"), unique("ctp")
    create(bs, src)
    create(bs, dst)
    plain = Producer({"bootstrap.servers": bs})
    for i in range(10):
        plain.produce(src, value=b"in-%d" % i)
    plain.flush(30)

    consumer = Consumer({"bootstrap.servers": bs, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    p = txn_producer(bs, unique("ctp"))
    try:
        consumer.subscribe([src])
        taken: list[Any] = []
        deadline = time.monotonic() + 20
        while len(taken) < 5 and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                taken.append(m)
        assert len(taken) == 5

        def transform(batch: list[Any], commit: bool) -> None:
            p.begin_transaction()
            for m in batch:
                p.produce(dst, value=m.value().replace(b"in", b"out"))
            p.send_offsets_to_transaction(
                [TopicPartition(src, 0, batch[-1].offset() + 1)],
                consumer.consumer_group_metadata(), 30)
            if commit:
                p.commit_transaction(30)
            else:
                p.flush(30)
                # While it is open, a stable-offset fetch is told to retry (KIP-447).
                with RawClient(port) as raw:
                    r = raw.call(OffsetFetchRequest(
                        group_id=group, require_stable=True,
                        topics=(OffsetFetchRequestTopic(name=src, partition_indexes=(0,)),)))
                assert r.topics[0].partitions[0].error_code is E.unstable_offset_commit
                p.abort_transaction(30)

        transform(taken[:3], commit=True)
        assert consumer.committed([TopicPartition(src, 0)], 10)[0].offset == 3
        transform(taken[3:], commit=False)
        assert consumer.committed([TopicPartition(src, 0)], 10)[0].offset == 3
        with RawClient(port) as raw:
            r = raw.call(OffsetFetchRequest(
                group_id=group, require_stable=True,
                topics=(OffsetFetchRequestTopic(name=src, partition_indexes=(0,)),)))
        assert (r.topics[0].partitions[0].error_code,
                r.topics[0].partitions[0].committed_offset) == (E.none, 3)
    finally:
        consumer.close()
    assert values(read(bs, dst)) == [b"out-0", b"out-1", b"out-2"]


# --- fencing and time-outs --------------------------------------------------------------


def test_a_second_producer_with_the_same_id_fences_the_first(shared: BrokerProcess):
    bs, topic, tid = shared.bootstrap, unique("fence"), unique("tid")
    create(bs, topic)
    zombie = txn_producer(bs, tid)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie")
    zombie.flush(30)
    successor = txn_producer(bs, tid)  # aborts the zombie's open transaction
    with pytest.raises(KafkaException) as info:
        zombie.commit_transaction(30)
    assert info.value.args[0].fatal() or info.value.args[0].code() in (
        confluent_kafka.KafkaError._FENCED, confluent_kafka.KafkaError.PRODUCER_FENCED,
        confluent_kafka.KafkaError.INVALID_PRODUCER_EPOCH)
    successor.begin_transaction()
    successor.produce(topic, value=b"successor")
    successor.commit_transaction(30)
    assert values(read(bs, topic)) == [b"successor"]
    assert values(read(bs, topic, committed=False)) == [b"zombie", b"successor"]


def test_raw_transaction_calls_refuse_what_kafka_refuses(shared: BrokerProcess):
    port, topic, tid = shared.kafka_port, unique("raw"), unique("tid")
    create(shared.bootstrap, topic)
    second = datetime.timedelta(seconds=1)
    with RawClient(port) as raw:
        def init(**kw: Any) -> Any:
            fields = {"transactional_id": tid, "transaction_timeout": 60 * second,
                      "producer_id": -1, "producer_epoch": -1, **kw}
            return raw.call(InitProducerIdRequest(**fields))

        assert init(transactional_id="").error_code is E.invalid_request
        assert init(transaction_timeout=3600 * second).error_code is (
            E.invalid_transaction_timeout)
        first = init()
        assert first.error_code is E.none and first.producer_epoch == 0
        again = init()
        assert (again.producer_id, again.producer_epoch) == (first.producer_id, 1)
        pid = again.producer_id

        def add(p_id: int, epoch: int, partitions: tuple[int, ...], name: str = topic) -> Any:
            r = raw.call(AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=tid, v3_and_below_producer_id=p_id,
                v3_and_below_producer_epoch=epoch, v3_and_below_topics=(
                    AddPartitionsToTxnTopic(name=name, partitions=partitions),)))
            return [(x.partition_index, x.partition_error_code)
                    for t in r.results_by_topic_v3_and_below for x in t.results_by_partition]

        assert add(pid + 1000, 1, (0,)) == [(0, E.invalid_producer_id_mapping)]
        assert add(pid, 0, (0,)) == [(0, E.producer_fenced)]
        assert add(pid, 1, (0, 7)) == [(0, E.operation_not_attempted),
                                       (7, E.unknown_topic_or_partition)]

        def end(commit: bool, epoch: int = 1) -> E:
            return raw.call(EndTxnRequest(transactional_id=tid, producer_id=pid,
                                          producer_epoch=epoch, committed=commit)).error_code

        assert end(True) is E.invalid_txn_state  # nothing was ever added
        assert add(pid, 1, (0,)) == [(0, E.none)]
        assert end(False, epoch=0) is E.producer_fenced
        assert end(True) is E.none
        assert end(True) is E.none  # a retry of the call that ended it
        assert end(False) is E.invalid_txn_state
        # A stale epoch named through KIP-360 is fenced too.
        assert init(producer_id=pid, producer_epoch=0).error_code is E.producer_fenced
    # The committed transaction held nothing but its marker.
    assert list_offset(port, topic, committed=True) == 1
    assert read(shared.bootstrap, topic) == []


def test_a_transaction_left_open_is_aborted_after_its_timeout(shared: BrokerProcess):
    bs, port, topic = shared.bootstrap, shared.kafka_port, unique("timeout")
    create(bs, topic)
    p = txn_producer(bs, unique("tid"), **{"transaction.timeout.ms": 2000})
    p.begin_transaction()
    p.produce(topic, value=b"forgotten")
    p.flush(30)
    assert list_offset(port, topic, committed=True) == 0
    deadline = time.monotonic() + 15
    while list_offset(port, topic, committed=True) == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list_offset(port, topic, committed=True) == 2  # the record and an ABORT marker
    with pytest.raises(KafkaException):
        p.commit_transaction(10)
    assert read(bs, topic) == []


# --- durability -------------------------------------------------------------------------


def test_transactions_survive_kill_9(tmp_path: Path):
    b = start_broker(tmp_path)
    topic, tid = "durable-txn", "durable-tid"
    try:
        bs = b.bootstrap
        create(bs, topic, 2)
        p = txn_producer(bs, tid)
        transaction(p, topic, b"ok", 4)
        transaction(p, topic, b"no", 4, commit=False)
        p.begin_transaction()
        p.produce(topic, value=b"open", partition=0)
        p.flush(30)
        before = read(bs, topic, 2, committed=False)
        b.kill()
        b.restart()
        bs = b.bootstrap
        # Same records at the same offsets; aborted ones still skipped; the open
        # transaction still holds read_committed readers back.
        assert read(bs, topic, 2, committed=False) == before
        assert sorted(values(read(bs, topic, 2))) == [b"ok-%d" % i for i in range(4)]
        assert list_offset(b.kafka_port, topic, committed=True) == [
            o for part, o, v in before if v == b"open"][0]
        # The old producer is gone; its successor fences it and aborts what it left open.
        successor = txn_producer(bs, tid)
        successor.begin_transaction()
        successor.produce(topic, value=b"after", partition=0)
        successor.commit_transaction(30)
        assert sorted(values(read(bs, topic, 2))) == sorted(
            [b"ok-%d" % i for i in range(4)] + [b"after"])
    finally:
        b.stop()


def test_describe_and_list_transactions(shared: BrokerProcess):
    from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
    from kio.schema.list_transactions.v1.request import ListTransactionsRequest

    bs, topic, tid = shared.bootstrap, unique("describe"), unique("tid")
    create(bs, topic, 2)
    p = txn_producer(bs, tid, **{"transaction.timeout.ms": 45000})
    p.begin_transaction()
    p.produce(topic, value=b"x", partition=1)
    p.flush(30)
    with RawClient(shared.kafka_port) as raw:
        r = raw.call(DescribeTransactionsRequest(transactional_ids=(tid, "no-such-id")))
        found, missing = r.transaction_states
        assert (found.error_code, found.transaction_state, found.transaction_timeout) == (
            E.none, "Ongoing", datetime.timedelta(seconds=45))
        assert [(t.topic, t.partitions) for t in found.topics] == [(topic, (1,))]
        assert abs(found.transaction_start_time.timestamp() - time.time()) < 60
        assert missing.error_code is E.transactional_id_not_found
        listed = raw.call(ListTransactionsRequest(state_filters=("Ongoing",),
                                                  producer_id_filters=(found.producer_id,),
                                                  duration_filter=-1))
        assert [(x.transactional_id, x.transaction_state)
                for x in listed.transaction_states] == [(tid, "Ongoing")]
        p.commit_transaction(30)
        r = raw.call(DescribeTransactionsRequest(transactional_ids=(tid,)))
        assert r.transaction_states[0].transaction_state == "CompleteCommit"
        assert raw.call(ListTransactionsRequest(
            state_filters=("Ongoing",), producer_id_filters=(found.producer_id,),
            duration_filter=-1)).transaction_states == ()


def test_a_transactional_batch_must_belong_to_the_ids_open_transaction(shared: BrokerProcess):
    """KIP-890's verification: a batch for a partition the transaction never added, or from
    an epoch that is not the id's current one, is refused, so it cannot open a transaction
    that no marker will ever end (the last stable offset would stay behind it for good)."""
    from kio.schema.produce.v9.request import (
        PartitionProduceData, ProduceRequest, TopicProduceData,
    )

    from kmqkafka import records

    port, topic, tid = shared.kafka_port, unique("verify"), unique("tid")
    create(shared.bootstrap, topic, 2)
    minute = datetime.timedelta(seconds=60)
    with RawClient(port) as raw:
        init = raw.call(InitProducerIdRequest(transactional_id=tid, transaction_timeout=minute,
                                              producer_id=-1, producer_epoch=-1))
        pid, epoch = init.producer_id, init.producer_epoch
        raw.call(AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=(AddPartitionsToTxnTopic(name=topic, partitions=(0,)),)))

        def produce(partition: int, p_epoch: int, seq: int) -> E:
            batch = records.build_batch(
                [records.NewRecord(value=b"v", timestamp=1_700_000_000_000)],
                now_ms=1_700_000_000_000, attributes=records.TRANSACTIONAL_FLAG,
                producer_id=pid, producer_epoch=p_epoch, base_sequence=seq)
            r = raw.call(ProduceRequest(transactional_id=tid, acks=-1, timeout=minute,
                                        topic_data=(TopicProduceData(name=topic, partition_data=(
                                            PartitionProduceData(index=partition,
                                                                 records=batch),)),)))
            return r.responses[0].partition_responses[0].error_code

        assert produce(1, epoch, 0) is E.invalid_txn_state  # never added
        assert produce(0, epoch + 1, 0) is E.invalid_producer_epoch
        assert produce(0, epoch, 0) is E.none
        assert list_offset(port, topic, 1, committed=True) == 0
        assert list_offset(port, topic, 1, committed=False) == 0  # nothing was stored there
        assert raw.call(EndTxnRequest(transactional_id=tid, producer_id=pid,
                                      producer_epoch=epoch, committed=True)).error_code is E.none
        assert produce(0, epoch, 1) is E.invalid_txn_state  # the transaction has ended
    assert values(read(shared.bootstrap, topic, 2)) == [b"v"]


def test_consume_transform_produce_is_exactly_once_across_kill_9(tmp_path: Path):
    """Two kafka-python workers copy an input topic to an output topic, each batch in one
    transaction with its consumer offsets, and abort every fifth batch after writing it (then
    rewind to the committed offsets); the broker is killed (-9) and restarted midway. A
    read_committed reader of the output then finds every input record exactly once."""
    import collections
    import threading

    kafka = pytest.importorskip("kafka")
    n, workers = 8000, 2
    b = start_broker(tmp_path)
    try:
        bs = b.bootstrap
        create(bs, "in", 4)
        create(bs, "out", 4)
        plain = Producer({"bootstrap.servers": bs, "linger.ms": 5})
        for i in range(n):
            plain.produce("in", b"i-%d" % i, partition=i % 4)
        plain.flush(60)
        stop = threading.Event()
        committed = collections.Counter()

        def worker(k: int) -> None:
            c = kafka.KafkaConsumer("in", bootstrap_servers=bs, group_id="copy",
                                    isolation_level="read_committed", enable_auto_commit=False,
                                    auto_offset_reset="earliest", max_poll_records=100)
            p = None
            batches = 0

            def rewind() -> None:
                for tp in c.assignment():
                    c.seek(tp, c.committed(tp) or 0)

            while not stop.is_set():
                try:
                    if p is None:
                        p = kafka.KafkaProducer(bootstrap_servers=bs, transactional_id=f"copy-{k}",
                                                linger_ms=5)
                        p.init_transactions()
                    msgs = [m for recs in c.poll(500).values() for m in recs]
                    if not msgs:
                        continue
                    p.begin_transaction()
                    for m in msgs:
                        p.send("out", m.value.replace(b"i-", b"o-"), partition=m.partition)
                    batches += 1
                    if batches % 5 == 0:  # a failure after writing: abort, do it again
                        p.flush()
                        p.abort_transaction()
                        rewind()
                        continue
                    p.send_offsets_to_transaction(
                        {kafka.TopicPartition(m.topic, m.partition):
                         kafka.OffsetAndMetadata(m.offset + 1, "", -1) for m in msgs}, "copy")
                    p.commit_transaction()
                    committed[k] += len(msgs)
                except Exception:  # noqa: BLE001 - abort if it can, else start over; rewind
                    try:
                        if p is not None:
                            p.abort_transaction()
                    except Exception:  # noqa: BLE001
                        p = None
                    try:
                        rewind()
                    except Exception:  # noqa: BLE001
                        time.sleep(0.2)
            c.close()

        threads = [threading.Thread(target=worker, args=(k,), daemon=True)
                   for k in range(workers)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while sum(committed.values()) < n // 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        b.kill()
        b.restart()
        while sum(committed.values()) < n and time.monotonic() < deadline + 60:
            time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join(30)
        out = collections.Counter(values(read(b.bootstrap, "out", 4, timeout=60)))
        assert len(out) == n and set(out.values()) == {1}, (
            f"{len(out)} distinct of {n}, duplicated: {sum(v > 1 for v in out.values())}")
    finally:
        b.stop()
