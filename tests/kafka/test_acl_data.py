"""ACLs on the data plane (Produce, Fetch, ListOffsets, OffsetForLeaderEpoch, Metadata,
DescribeTopicPartitions, DescribeCluster, DescribeLogDirs, InitProducerId, DescribeProducers),
as Kafka 4's KafkaApis enforces them, against one daemon with SASL users and ACLs on.

Every test starts with no bindings, shows the refusal a real client sees (the exact Kafka error
code), then grants the one binding that is missing and shows the same call succeed. confluent-kafka
is the main client; kafka-python shows its own exception; a raw client checks the per-partition
codes of the APIs clients hide behind metadata lookups."""
from __future__ import annotations

import datetime
import time
import uuid
from typing import Any, Iterator

import pytest
from confluent_kafka import (
    Consumer, KafkaError, KafkaException, Producer, TopicCollection, TopicPartition,
)
from confluent_kafka.admin import NewTopic, OffsetSpec
from kio.schema.errors import ErrorCode as E

from acl_support import (  # noqa: F401 -- acl_broker is a fixture
    WAIT, AclOperation, ResourcePatternType, ResourceType, acl_broker, admin_client, allow, deny,
    grant, revoke_all, sasl,
)
from conftest import HOST, BrokerProcess
from kmqkafka import records
from rawkafka import RawClient

ALICE = "User:alice"
TOPIC_, GROUP_, CLUSTER_, TXN_ = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.BROKER,
                                  ResourceType.TRANSACTIONAL_ID)
QUICK = {"message.timeout.ms": 6000, "socket.timeout.ms": 5000, "retry.backoff.ms": 100,
         "topic.metadata.refresh.interval.ms": 1000}


@pytest.fixture(autouse=True)
def no_bindings(acl_broker: BrokerProcess) -> Iterator[None]:
    """Each test starts from no ACL at all (only the super user may do anything)."""
    revoke_all(acl_broker)
    yield


def create_topics(b: BrokerProcess, *names: str, partitions: int = 1) -> None:
    admin = admin_client(b)
    for f in admin.create_topics([NewTopic(n, partitions, 1) for n in names]).values():
        f.result(WAIT)


def produce_as(b: BrokerProcess, user: str, topic: str, n: int = 1, **extra: Any) -> list:
    """Send ``n`` records with a fresh confluent-kafka producer; the delivery errors (None for
    each record delivered)."""
    outcomes: list = []
    p = Producer({**sasl(b, user), **QUICK, "acks": "all", **extra})
    for i in range(n):
        p.produce(topic, value=b"v%d" % i, on_delivery=lambda err, _msg: outcomes.append(err))
    p.flush(15)
    assert len(outcomes) == n
    return outcomes


def codes(errors: list) -> set:
    return {None if e is None else e.code() for e in errors}


def raw_client(b: BrokerProcess, user: str) -> RawClient:
    c = RawClient(b.kafka_port)
    assert c.authenticate("PLAIN", user, f"{user}-secret").error_code == 0
    return c


def topic_names(b: BrokerProcess, user: str) -> set[str]:
    return set(admin_client(b, user).list_topics(timeout=WAIT).topics)


# --- Produce -----------------------------------------------------------------------------------


def test_producer_is_refused_without_write_and_delivers_once_granted(acl_broker):
    create_topics(acl_broker, "d-produce")
    # DESCRIBE only: the metadata lookup passes, the Produce itself is refused.
    grant(acl_broker, allow(TOPIC_, "d-produce", ALICE, AclOperation.DESCRIBE))
    assert codes(produce_as(acl_broker, "alice", "d-produce", 3)) == {
        KafkaError.TOPIC_AUTHORIZATION_FAILED}
    grant(acl_broker, allow(TOPIC_, "d-produce", ALICE, AclOperation.WRITE))
    assert codes(produce_as(acl_broker, "alice", "d-produce", 3)) == {None}
    # Someone else still may not.
    assert codes(produce_as(acl_broker, "bob", "d-produce")) == {
        KafkaError.TOPIC_AUTHORIZATION_FAILED}


def _raw_produce(c: RawClient, topic: str, acks: int = -1) -> Any:
    from kio.schema.produce.v9.request import (
        PartitionProduceData, ProduceRequest, TopicProduceData,
    )

    batch = records.build_batch([records.NewRecord(value=b"x")],
                                now_ms=int(time.time() * 1000))
    request = ProduceRequest(transactional_id=None, acks=acks,
                             timeout=datetime.timedelta(seconds=5), topic_data=(TopicProduceData(
                                 name=topic, partition_data=(PartitionProduceData(
                                     index=0, records=batch),)),))
    if acks == 0:
        c.send(request)
        return None
    return c.call(request).responses[0].partition_responses[0].error_code


def test_produce_auto_creates_a_missing_topic_only_for_a_writer_allowed_to_create(acl_broker):
    with raw_client(acl_broker, "alice") as c:
        # No rights: refused without revealing or creating anything.
        assert _raw_produce(c, "d-missing") is E.topic_authorization_failed
        assert "d-missing" not in topic_names(acl_broker, "admin")
        grant(acl_broker, allow(TOPIC_, "d-missing", ALICE, AclOperation.WRITE))
        assert _raw_produce(c, "d-missing") is E.unknown_topic_or_partition
        assert "d-missing" not in topic_names(acl_broker, "admin")
        grant(acl_broker, allow(TOPIC_, "d-missing", ALICE, AclOperation.CREATE))
        assert _raw_produce(c, "d-missing") is E.none
    assert "d-missing" in topic_names(acl_broker, "admin")


def test_acks_zero_to_a_refused_topic_closes_the_connection(acl_broker):
    create_topics(acl_broker, "d-acks0")
    with raw_client(acl_broker, "alice") as c:
        _raw_produce(c, "d-acks0", acks=0)
        # No answer can carry the refusal: the broker hangs up (a timeout would not do).
        with pytest.raises(ConnectionError):
            c.call(_metadata_request(None))
    grant(acl_broker, allow(TOPIC_, "d-acks0", ALICE, AclOperation.WRITE))
    with raw_client(acl_broker, "alice") as c:
        _raw_produce(c, "d-acks0", acks=0)
        assert c.call(_metadata_request(None)).brokers  # the connection is still open


def test_prefixed_allow_grants_and_a_deny_overrides_an_allow(acl_broker):
    create_topics(acl_broker, "pfx-a", "pfx-b")
    for op in (AclOperation.WRITE, AclOperation.DESCRIBE):
        grant(acl_broker, allow(TOPIC_, "pfx-", ALICE, op, ResourcePatternType.PREFIXED))
    assert codes(produce_as(acl_broker, "alice", "pfx-a")) == {None}
    assert codes(produce_as(acl_broker, "alice", "pfx-b")) == {None}
    # A DENY wins over any ALLOW, whatever its pattern.
    grant(acl_broker, deny(TOPIC_, "pfx-b", ALICE, AclOperation.WRITE))
    assert codes(produce_as(acl_broker, "alice", "pfx-b")) == {
        KafkaError.TOPIC_AUTHORIZATION_FAILED}
    assert codes(produce_as(acl_broker, "alice", "pfx-a")) == {None}


def test_idempotent_producer_needs_idempotent_write_or_write_on_some_topic(acl_broker):
    create_topics(acl_broker, "d-idem")
    grant(acl_broker, allow(TOPIC_, "d-idem", ALICE, AclOperation.DESCRIBE))
    p = Producer({**sasl(acl_broker, "alice"), **QUICK, "enable.idempotence": True})
    p.produce("d-idem", value=b"x")
    # The refused InitProducerId is fatal to an idempotent librdkafka producer.
    with pytest.raises(KafkaException) as info:
        p.flush(10)
    err = info.value.args[0]
    assert err.fatal() and err.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED, err
    # WRITE on a topic is enough (KIP-679), as IDEMPOTENT_WRITE on the cluster would be.
    grant(acl_broker, allow(TOPIC_, "d-idem", ALICE, AclOperation.WRITE))
    assert codes(produce_as(acl_broker, "alice", "d-idem", **{"enable.idempotence": True})) == {
        None}
    # IDEMPOTENT_WRITE on the cluster alone is enough too (InitProducerId as sent).
    from kio.schema.init_producer_id.v4.request import InitProducerIdRequest

    request = InitProducerIdRequest(transactional_id=None,
                                    transaction_timeout=datetime.timedelta(milliseconds=-1),
                                    producer_id=-1, producer_epoch=-1)
    with raw_client(acl_broker, "bob") as c:
        assert c.call(request).error_code is E.cluster_authorization_failed
        grant(acl_broker, allow(CLUSTER_, "kafka-cluster", "User:bob",
                                AclOperation.IDEMPOTENT_WRITE))
        r = c.call(request)
        assert r.error_code is E.none and r.producer_id >= 0


def test_transactional_producer_needs_write_on_its_transactional_id(acl_broker):
    create_topics(acl_broker, "d-txn")
    for op in (AclOperation.WRITE, AclOperation.DESCRIBE):
        grant(acl_broker, allow(TOPIC_, "d-txn", ALICE, op))
    settings = {**sasl(acl_broker, "alice"), **QUICK, "transactional.id": "alice-txn",
                "transaction.timeout.ms": 10000}
    p = Producer(settings)
    with pytest.raises(KafkaException) as info:
        p.init_transactions(10)
    assert info.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    grant(acl_broker, allow(TXN_, "alice-txn", ALICE, AclOperation.WRITE))
    p = Producer(settings)
    p.init_transactions(10)


# --- Fetch -------------------------------------------------------------------------------------


def _fill(b: BrokerProcess, topic: str, n: int) -> None:
    assert codes(produce_as(b, "admin", topic, n)) == {None}


def test_consumer_is_refused_without_read_and_reads_once_granted(acl_broker):
    create_topics(acl_broker, "d-fetch")
    _fill(acl_broker, "d-fetch", 3)
    grant(acl_broker, allow(TOPIC_, "d-fetch", ALICE, AclOperation.DESCRIBE),
          allow(GROUP_, "d-fetch-g", ALICE, AclOperation.READ))

    def consume() -> tuple[list[bytes], set]:
        c = Consumer({**sasl(acl_broker, "alice"), "group.id": "d-fetch-g",
                      "enable.auto.commit": False, "fetch.error.backoff.ms": 100})
        c.assign([TopicPartition("d-fetch", 0, 0)])
        got: list[bytes] = []
        errors: set = set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(got) < 3 and not errors:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error() is not None:
                errors.add(m.error().code())
            else:
                got.append(m.value())
        c.close()
        return got, errors

    assert consume() == ([], {KafkaError.TOPIC_AUTHORIZATION_FAILED})
    grant(acl_broker, allow(TOPIC_, "d-fetch", ALICE, AclOperation.READ))
    assert consume() == ([b"v0", b"v1", b"v2"], set())


def test_fetch_answers_topic_authorization_failed_per_topic(acl_broker):
    """One raw Fetch (v12, names) over a readable topic, a refused one and a missing one the
    principal may not read: only the readable one answers data; the missing one is not told
    apart from the refused one."""
    from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic

    create_topics(acl_broker, "d-f-yes", "d-f-no")
    _fill(acl_broker, "d-f-yes", 1)
    grant(acl_broker, allow(TOPIC_, "d-f-yes", ALICE, AclOperation.READ))

    def fetch(c: RawClient) -> dict:
        r = c.call(FetchRequest(
            max_wait=datetime.timedelta(milliseconds=10), min_bytes=1, session_epoch=-1,
            topics=tuple(FetchTopic(topic=t, partitions=(FetchPartition(
                fetch_offset=0, partition=0, partition_max_bytes=1 << 20),))
                for t in ("d-f-yes", "d-f-no", "d-f-none")),
            forgotten_topics_data=()))
        return {t.topic: t.partitions[0].error_code for t in r.responses}

    with raw_client(acl_broker, "alice") as c:
        assert fetch(c) == {"d-f-yes": E.none, "d-f-no": E.topic_authorization_failed,
                            "d-f-none": E.topic_authorization_failed}
        grant(acl_broker, allow(TOPIC_, "d-f-no", ALICE, AclOperation.READ),
              allow(TOPIC_, "d-f-none", ALICE, AclOperation.READ))
        assert fetch(c) == {"d-f-yes": E.none, "d-f-no": E.none,
                            "d-f-none": E.unknown_topic_or_partition}


# --- Metadata ----------------------------------------------------------------------------------


def _metadata_request(names: Any, auto_create: bool = False, ops: bool = False) -> Any:
    from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic

    topics = None if names is None else tuple(
        MetadataRequestTopic(topic_id=None, name=n) for n in names)
    return MetadataRequest(topics=topics, allow_auto_topic_creation=auto_create,
                           include_topic_authorized_operations=ops)


def test_metadata_lists_only_describable_topics(acl_broker):
    create_topics(acl_broker, "md-1", "md-2", "md-3")
    before = topic_names(acl_broker, "alice")
    assert not before & {"md-1", "md-2", "md-3"}
    # READ implies DESCRIBE.
    grant(acl_broker, allow(TOPIC_, "md-1", ALICE, AclOperation.DESCRIBE),
          allow(TOPIC_, "md-2", ALICE, AclOperation.READ))
    assert topic_names(acl_broker, "alice") & {"md-1", "md-2", "md-3"} == {"md-1", "md-2"}
    assert {"md-1", "md-2", "md-3"} <= topic_names(acl_broker, "admin")


def test_metadata_for_named_topics_hides_what_may_not_be_described(acl_broker):
    create_topics(acl_broker, "mn-hidden")
    with raw_client(acl_broker, "alice") as c:
        r = c.call(_metadata_request(["mn-hidden", "mn-absent"]))
        for t in r.topics:
            assert t.error_code is E.topic_authorization_failed
            assert t.partitions == () and t.topic_id in (None, uuid.UUID(int=0))
        grant(acl_broker, allow(TOPIC_, "mn-hidden", ALICE, AclOperation.DESCRIBE),
              allow(TOPIC_, "mn-absent", ALICE, AclOperation.DESCRIBE))
        r = c.call(_metadata_request(["mn-hidden", "mn-absent"]))
        got = {t.name: t for t in r.topics}
        assert got["mn-hidden"].error_code is E.none and len(got["mn-hidden"].partitions) == 1
        assert got["mn-absent"].error_code is E.unknown_topic_or_partition
        # Auto-creation needs CREATE: without it Kafka answers TOPIC_AUTHORIZATION_FAILED.
        r = c.call(_metadata_request(["mn-absent"], auto_create=True))
        assert r.topics[0].error_code is E.topic_authorization_failed
        assert "mn-absent" not in topic_names(acl_broker, "admin")
        grant(acl_broker, allow(TOPIC_, "mn-", ALICE, AclOperation.CREATE,
                                ResourcePatternType.PREFIXED))
        r = c.call(_metadata_request(["mn-absent"], auto_create=True))
        assert r.topics[0].error_code is E.none and r.topics[0].partitions
    assert "mn-absent" in topic_names(acl_broker, "admin")


def test_authorized_operations_are_the_principals_own(acl_broker):
    create_topics(acl_broker, "ops-read")
    grant(acl_broker, allow(TOPIC_, "ops-read", ALICE, AclOperation.READ))
    alice = admin_client(acl_broker, "alice")
    d = alice.describe_topics(TopicCollection(["ops-read"]),
                              include_authorized_operations=True)["ops-read"].result(WAIT)
    assert set(d.authorized_operations) == {AclOperation.READ, AclOperation.DESCRIBE}
    with raw_client(acl_broker, "alice") as c:
        r = c.call(_metadata_request(["ops-read"], ops=True))
        assert r.topics[0].topic_authorized_operations == (1 << 3) | (1 << 8)
    admin = admin_client(acl_broker)
    d = admin.describe_topics(TopicCollection(["ops-read"]),
                              include_authorized_operations=True)["ops-read"].result(WAIT)
    assert {AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE,
            AclOperation.ALTER} <= set(d.authorized_operations)
    # The cluster: nothing for alice until she may describe it.
    cluster = alice.describe_cluster(include_authorized_operations=True).result(WAIT)
    assert not cluster.authorized_operations
    grant(acl_broker, allow(CLUSTER_, "kafka-cluster", ALICE, AclOperation.DESCRIBE))
    cluster = alice.describe_cluster(include_authorized_operations=True).result(WAIT)
    assert set(cluster.authorized_operations) == {AclOperation.DESCRIBE}


def test_describe_topics_refuses_a_topic_that_may_not_be_described(acl_broker):
    create_topics(acl_broker, "dtp-hidden")
    alice = admin_client(acl_broker, "alice")
    with pytest.raises(KafkaException) as info:
        alice.describe_topics(TopicCollection(["dtp-hidden"]))["dtp-hidden"].result(WAIT)
    assert info.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    grant(acl_broker, allow(TOPIC_, "dtp-hidden", ALICE, AclOperation.DESCRIBE))
    d = alice.describe_topics(TopicCollection(["dtp-hidden"]))["dtp-hidden"].result(WAIT)
    assert len(d.partitions) == 1


# --- ListOffsets, OffsetForLeaderEpoch, DescribeProducers, DescribeLogDirs ----------------------


def test_list_offsets_needs_describe(acl_broker):
    create_topics(acl_broker, "lo-topic")
    _fill(acl_broker, "lo-topic", 2)
    alice = admin_client(acl_broker, "alice")
    tp = TopicPartition("lo-topic", 0)
    # librdkafka looks the leader up first; Metadata's TOPIC_AUTHORIZATION_FAILED leaves it
    # none, which it reports as "No leaders found" (as against Kafka).
    with pytest.raises(KafkaException) as info:
        alice.list_offsets({tp: OffsetSpec.latest()})[tp].result(WAIT)
    assert info.value.args[0].code() == KafkaError._NOENT
    # ListOffsets itself, as sent: refused per partition.
    with raw_client(acl_broker, "alice") as c:
        assert _list_offsets(c, "lo-topic") == [E.topic_authorization_failed]
    grant(acl_broker, allow(TOPIC_, "lo-topic", ALICE, AclOperation.DESCRIBE))
    alice = admin_client(acl_broker, "alice")  # the first one keeps the refusal cached
    assert alice.list_offsets({tp: OffsetSpec.latest()})[tp].result(WAIT).offset == 2
    with raw_client(acl_broker, "alice") as c:
        assert _list_offsets(c, "lo-topic") == [E.none]


def _list_offsets(c: RawClient, topic: str, partitions: tuple[int, ...] = (0,)) -> list:
    from kio.schema.list_offsets.v7.request import (
        ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic,
    )

    r = c.call(ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(ListOffsetsTopic(
        name=topic, partitions=tuple(ListOffsetsPartition(partition_index=p, timestamp=-1)
                                     for p in partitions)),)))
    return [p.error_code for p in r.topics[0].partitions]


def test_offsets_epochs_and_producers_answer_per_topic(acl_broker):
    """Raw ListOffsets, OffsetForLeaderEpoch (DESCRIBE) and DescribeProducers (READ): a refused
    topic answers TOPIC_AUTHORIZATION_FAILED for each of its partitions, the others answer."""
    from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest
    from kio.schema.offset_for_leader_epoch.v4.request import (
        OffsetForLeaderEpochRequest, OffsetForLeaderPartition, OffsetForLeaderTopic,
    )

    create_topics(acl_broker, "pos-yes", "pos-no", partitions=2)
    grant(acl_broker, allow(TOPIC_, "pos-yes", ALICE, AclOperation.READ))
    names = ("pos-yes", "pos-no")
    with raw_client(acl_broker, "alice") as c:
        assert {n: _list_offsets(c, n, (0, 1)) for n in names} == {
            "pos-yes": [E.none] * 2, "pos-no": [E.topic_authorization_failed] * 2}
        r = c.call(OffsetForLeaderEpochRequest(topics=tuple(
            OffsetForLeaderTopic(topic=n, partitions=tuple(OffsetForLeaderPartition(
                partition=p, leader_epoch=0) for p in (0, 1))) for n in names)))
        assert {t.topic: [p.error_code for p in t.partitions] for t in r.topics} == {
            "pos-yes": [E.none] * 2, "pos-no": [E.topic_authorization_failed] * 2}
        r = c.call(DescribeProducersRequest(topics=tuple(
            TopicRequest(name=n, partition_indexes=(0, 1)) for n in names)))
        assert {t.name: [p.error_code for p in t.partitions] for t in r.topics} == {
            "pos-yes": [E.none] * 2, "pos-no": [E.topic_authorization_failed] * 2}


def test_describe_log_dirs_needs_describe_on_the_cluster(acl_broker):
    from kio.schema.describe_log_dirs.v4.request import DescribeLogDirsRequest

    create_topics(acl_broker, "ld-topic")
    with raw_client(acl_broker, "alice") as c:
        r = c.call(DescribeLogDirsRequest(topics=None))
        assert r.error_code is E.cluster_authorization_failed and r.results == ()
        grant(acl_broker, allow(CLUSTER_, "kafka-cluster", ALICE, AclOperation.DESCRIBE))
        r = c.call(DescribeLogDirsRequest(topics=None))
        assert r.error_code is E.none and len(r.results) == 1
        assert "ld-topic" in {t.name for t in r.results[0].topics}


# --- kafka-python --------------------------------------------------------------------------------


def test_kafka_python_producer_raises_topic_authorization_failed(acl_broker):
    from kafka import KafkaProducer
    from kafka.errors import TopicAuthorizationFailedError

    create_topics(acl_broker, "kp-produce")
    grant(acl_broker, allow(TOPIC_, "kp-produce", ALICE, AclOperation.DESCRIBE))

    def producer() -> KafkaProducer:
        return KafkaProducer(
            bootstrap_servers=f"{HOST}:{acl_broker.kafka_port}", security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN", sasl_plain_username="alice",
            sasl_plain_password="alice-secret", acks="all", retries=0, max_block_ms=10000)

    p = producer()
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            p.send("kp-produce", b"x").get(timeout=10)
    finally:
        p.close(timeout=5)
    grant(acl_broker, allow(TOPIC_, "kp-produce", ALICE, AclOperation.WRITE))
    p = producer()
    try:
        assert p.send("kp-produce", b"x").get(timeout=10).offset >= 0
    finally:
        p.close(timeout=5)
