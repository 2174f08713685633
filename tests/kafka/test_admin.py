"""Admin APIs against a real daemon: CreateTopics, DeleteTopics, CreatePartitions, DeleteRecords,
DescribeCluster, DescribeTopicPartitions and DescribeLogDirs.

Real clients (confluent-kafka, kafka-python, aiokafka) drive the common paths; raw kio frames
cover what the clients cannot send (topic ids, cursors, manual assignments). One daemon serves the
whole module; every test uses its own topic names. Every wait is bounded.
"""
from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from confluent_kafka import KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode

from conftest import HOST, BrokerProcess, start_broker
from rawkafka import RawClient

WAIT = 15.0
TIMEOUT = datetime.timedelta(seconds=30)


@pytest.fixture(scope="module")
def kafka(shared_broker: BrokerProcess) -> BrokerProcess:
    return shared_broker


@pytest.fixture(scope="module")
def admin(kafka: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka.bootstrap})


def error_of(future: Any) -> tuple[int, str]:
    """(code, message) a confluent-kafka admin future failed with."""
    with pytest.raises(KafkaException) as info:
        future.result(WAIT)
    err = info.value.args[0]
    return err.code(), err.str()


def partitions_of(admin: AdminClient, topic: str) -> int:
    md = admin.list_topics(topic, timeout=WAIT)
    return len(md.topics[topic].partitions)


# --- raw kio frames ---------------------------------------------------------------------


def call(kafka: BrokerProcess, api_key: int, version: int, **fields: Any) -> Any:
    """Send one request built from ``fields`` and decode its response (bounded wait)."""
    request = load_request_schema(api_key, version)(**fields)
    with RawClient(kafka.kafka_port, timeout=WAIT) as client:
        return client.call(request)


def nested(api_key: int, version: int, name: str, request: bool = True) -> type:
    import sys
    cls = (load_request_schema if request else load_response_schema)(api_key, version)
    return getattr(sys.modules[cls.__module__], name)


def create(kafka: BrokerProcess, name: str, partitions: int = 1, **kw: Any) -> Any:
    topic_cls = nested(19, 7, "CreatableTopic")
    topic = topic_cls(name=name, num_partitions=partitions, replication_factor=kw.pop("rf", -1),
                      assignments=kw.pop("assignments", ()), configs=kw.pop("configs", ()))
    return call(kafka, 19, 7, topics=(topic,), timeout=TIMEOUT, validate_only=False, **kw).topics[0]


# --- CreateTopics -----------------------------------------------------------------------


def test_create_topics_per_topic_results(kafka: BrokerProcess, admin: AdminClient) -> None:
    fs = admin.create_topics([
        NewTopic("ct-ok", 3, config={"retention.ms": "3600000"}),
        NewTopic("ct-default"),  # num_partitions -1: the seed's default of 1
        NewTopic("ct~bad", 1),
        NewTopic("ct-rf", 1, 3),
        NewTopic("ct-cfg", 1, config={"no.such.config": "1"}),
        NewTopic("ct-val", 1, config={"retention.ms": "soon"}),
        NewTopic("ct-big", 300),
    ], operation_timeout=10)
    assert fs["ct-ok"].result(WAIT) is None
    assert fs["ct-default"].result(WAIT) is None
    assert error_of(fs["ct~bad"])[0] == 17
    assert error_of(fs["ct-rf"]) == (38, "Unable to replicate the partition 3 time(s): The target "
                                          "replication factor of 3 cannot be reached because "
                                          "only 1 broker(s) are registered.")
    assert error_of(fs["ct-cfg"]) == (40, "Unknown topic config name: no.such.config")
    assert error_of(fs["ct-val"])[0] == 40
    assert error_of(fs["ct-big"]) == (37, "Count exceeds the maximum of 256")
    assert partitions_of(admin, "ct-ok") == 3
    assert partitions_of(admin, "ct-default") == 1
    listed = admin.list_topics(timeout=WAIT).topics
    assert not {"ct~bad", "ct-rf", "ct-cfg", "ct-val", "ct-big"} & set(listed)
    # The topic already exists now.
    again = admin.create_topics([NewTopic("ct-ok", 1)])["ct-ok"]
    assert error_of(again) == (36, "Topic 'ct-ok' already exists.")


def test_create_topics_validate_only_changes_nothing(admin: AdminClient) -> None:
    fs = admin.create_topics([NewTopic("ct-dry", 2), NewTopic("ct-dry~x", 1)],
                             validate_only=True)
    assert fs["ct-dry"].result(WAIT) is None
    assert error_of(fs["ct-dry~x"])[0] == 17
    assert "ct-dry" not in admin.list_topics(timeout=WAIT).topics


def test_create_topics_v7_reports_id_partitions_and_configs(kafka: BrokerProcess) -> None:
    cfg = nested(19, 7, "CreatableTopicConfig")
    result = create(kafka, "ct-v7", 4, configs=(cfg(name="cleanup.policy", value="compact"),))
    assert result.error_code == ErrorCode.none
    assert result.num_partitions == 4 and result.replication_factor == 1
    assert result.topic_id != uuid.UUID(int=0)
    configs = {c.name: (c.value, c.config_source) for c in result.configs}
    assert configs["cleanup.policy"] == ("compact", 1)  # DYNAMIC_TOPIC_CONFIG
    assert configs["retention.ms"] == ("604800000", 5)  # DEFAULT_CONFIG
    dup = create(kafka, "ct-v7", 1)
    assert (dup.error_code, dup.num_partitions, dup.configs) == (
        ErrorCode.topic_already_exists, -1, None)
    null = create(kafka, "ct-null", 1, configs=(cfg(name="retention.ms", value=None),))
    assert null.error_code == ErrorCode.invalid_config


def test_create_topics_manual_assignment_only_on_this_node(kafka: BrokerProcess,
                                                           admin: AdminClient) -> None:
    assign = nested(19, 7, "CreatableReplicaAssignment")
    ok = create(kafka, "ct-assign", -1, assignments=(assign(partition_index=0, broker_ids=(1,)),
                                                     assign(partition_index=1, broker_ids=(1,))))
    assert ok.error_code == ErrorCode.none and ok.num_partitions == 2
    other = create(kafka, "ct-assign2", -1, assignments=(assign(partition_index=0,
                                                                broker_ids=(7,)),))
    assert other.error_code == ErrorCode.invalid_replica_assignment
    both = create(kafka, "ct-assign3", 2, assignments=(assign(partition_index=0,
                                                              broker_ids=(1,)),))
    assert both.error_code == ErrorCode.invalid_request


def test_manual_assignment_and_config_errors_in_kraft_order_and_words(
        kafka: BrokerProcess) -> None:
    """KRaft's ReplicationControlManager: configs are checked before the counts, an
    assignment wants both counts at -1 (the replication factor named first), then no
    partition twice, then consecutive indexes from 0."""
    assign = nested(19, 7, "CreatableReplicaAssignment")
    cfg = nested(19, 7, "CreatableTopicConfig")
    one = (assign(partition_index=0, broker_ids=(1,)),)
    cases = {
        "ka-rf": (dict(partitions=-1, rf=1, assignments=one), ErrorCode.invalid_request,
                  "A manual partition assignment was specified, but replication factor was "
                  "not set to -1."),
        "ka-np": (dict(partitions=1, assignments=one), ErrorCode.invalid_request,
                  "A manual partition assignment was specified, but numPartitions was not "
                  "set to -1."),
        "ka-twice": (dict(partitions=-1, assignments=one * 2),
                     ErrorCode.invalid_replica_assignment,
                     "Found multiple manual partition assignments for partition 0"),
        "ka-gap": (dict(partitions=-1, assignments=(assign(partition_index=1, broker_ids=(1,)),)),
                   ErrorCode.invalid_replica_assignment,
                   "partitions should be a consecutive 0-based integer sequence"),
        "ka-cfg": (dict(partitions=1, rf=0, configs=(cfg(name="retention.ms", value="x"),)),
                   ErrorCode.invalid_config,
                   "Invalid value x for configuration retention.ms: Not a number of type LONG"),
    }
    for name, (kw, code, message) in cases.items():
        result = create(kafka, name, kw.pop("partitions"), **kw)
        assert (result.error_code, result.error_message) == (code, message), name


def test_duplicate_names_in_one_request_are_invalid_request(kafka: BrokerProcess) -> None:
    topic_cls = nested(19, 7, "CreatableTopic")
    t = topic_cls(name="ct-twice", num_partitions=1, replication_factor=1, assignments=(),
                  configs=())
    response = call(kafka, 19, 7, topics=(t, t), timeout=TIMEOUT, validate_only=False)
    assert [(r.name, r.error_code, r.error_message) for r in response.topics] == [
        ("ct-twice", ErrorCode.invalid_request, "Duplicate topic name.")]  # KRaft's words


@pytest.mark.parametrize("version", [2, 3, 4, 5, 6, 7])
def test_every_advertised_create_and_delete_version(kafka: BrokerProcess, version: int) -> None:
    """Older clients (kcat on librdkafka 2.0, kafka-python) negotiate lower versions."""
    name = f"ver-{version}"
    topic_cls = nested(19, version, "CreatableTopic")
    created = call(kafka, 19, version, timeout=TIMEOUT, validate_only=False, topics=(
        topic_cls(name=name, num_partitions=2, replication_factor=1, assignments=(),
                  configs=()),)).topics[0]
    assert (created.name, created.error_code) == (name, ErrorCode.none)
    delete_version = version - 1  # DeleteTopics v1..v6 pairs with CreateTopics v2..v7
    if delete_version < 6:
        deleted = call(kafka, 20, delete_version, timeout=TIMEOUT, topic_names=(name,))
    else:
        state = nested(20, 6, "DeleteTopicState")
        deleted = call(kafka, 20, 6, timeout=TIMEOUT,
                       topics=(state(name=name, topic_id=uuid.UUID(int=0)),))
    assert [(r.name, r.error_code) for r in deleted.responses] == [(name, ErrorCode.none)]


def test_illegal_topic_names_are_worded_as_kafka_3_and_4(admin: AdminClient) -> None:
    """Kafka 3.x/4.x's Topic.validate: "Topic name is invalid: <reason>". A trailing newline
    is an illegal character too (a regex ``$`` would have let it through)."""
    long_name = "x" * 250
    expected = {
        "..": "'..' is not allowed",
        long_name: f"the length of '{long_name}' is longer than the max allowed length 249",
        "bad name": "'bad name' contains one or more characters other than ASCII "
                    "alphanumerics, '.', '_' and '-'",
        "bad~name": "'bad~name' contains one or more characters other than ASCII "
                    "alphanumerics, '.', '_' and '-'",
        "newline\n": "'newline\n' contains one or more characters other than ASCII "
                     "alphanumerics, '.', '_' and '-'",
    }
    futures = admin.create_topics([NewTopic(name, 1) for name in expected])
    for name, reason in expected.items():
        assert error_of(futures[name]) == (17, f"Topic name is invalid: {reason}")


# --- CreatePartitions (seed 004) -------------------------------------------------------


def test_kafka_internal_topic_names_are_never_user_topics(admin: AdminClient) -> None:
    for name in ("__cluster_metadata", "__consumer_offsets"):
        for dry in (True, False):
            code, message = error_of(admin.create_topics([NewTopic(name, 1)],
                                                         validate_only=dry)[name])
            assert (code, message) == (42, f"Creation of internal topic {name} is prohibited.")
    md = admin.list_topics("__consumer_offsets", timeout=WAIT)  # would auto-create a user topic
    assert md.topics["__consumer_offsets"].error.code() == 3
    assert "__consumer_offsets" not in admin.list_topics(timeout=WAIT).topics


def test_partitions_stop_at_what_the_open_file_limit_allows(tmp_path: Path) -> None:
    """Each partition keeps segment files open: with 1,800 descriptors and 1,000 connections
    allowed (96 partitions at 3 each), creates past the budget are POLICY_VIOLATION, and the
    broker keeps serving (it used to run out of descriptors, fail its fsyncs and refuse every
    write, even after a restart)."""
    import sys

    limit = ("import resource, os, sys; resource.setrlimit(resource.RLIMIT_NOFILE, "
             "(1800, 1800)); os.execv(sys.argv[1], sys.argv[1:])")
    b = start_broker(tmp_path, prefix=[sys.executable, "-c", limit])
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        # One request whose topics fit one by one but not together: the second is refused.
        both = admin.create_topics([NewTopic("fd-a", 60), NewTopic("fd-c", 60)])
        assert both["fd-a"].result(WAIT) is None
        code, message = error_of(both["fd-c"])
        assert code == 44 and "open-file limit" in message
        code, message = error_of(admin.create_topics([NewTopic("fd-b", 60)])["fd-b"])
        assert code == 44 and "open-file limit" in message  # POLICY_VIOLATION
        code, _ = error_of(admin.create_partitions([NewPartitions("fd-a", 120)])["fd-a"])
        assert code == 44
        admin.delete_topics(["fd-a"])["fd-a"].result(WAIT)
        admin.create_topics([NewTopic("fd-b", 60)])["fd-b"].result(WAIT)
        assert b.health() == 200
    finally:
        b.stop()


def test_create_partitions_seed_rules_and_messages(admin: AdminClient) -> None:
    for name, n in (("cp-eq", 3), ("cp-less", 3), ("cp-max", 1), ("cp-grow", 1)):
        admin.create_topics([NewTopic(name, n)])[name].result(WAIT)
    fs = admin.create_partitions([NewPartitions("cp-eq", 3), NewPartitions("cp-less", 2),
                                  NewPartitions("cp-max", 257), NewPartitions("cp-grow", 5),
                                  NewPartitions("cp-missing", 2)])
    assert error_of(fs["cp-eq"]) == (37, "topic already has 3 partition(s)")
    assert error_of(fs["cp-less"]) == (37, "partition count must be >= current")
    assert error_of(fs["cp-max"]) == (37, "Count exceeds the maximum of 256")
    assert error_of(fs["cp-missing"])[0] == 3
    assert fs["cp-grow"].result(WAIT) is None
    assert partitions_of(admin, "cp-grow") == 5
    assert partitions_of(admin, "cp-less") == 3
    # 256 is allowed; one more is not.
    admin.create_partitions([NewPartitions("cp-max", 256)])["cp-max"].result(WAIT)
    assert partitions_of(admin, "cp-max") == 256


def test_concurrent_create_partitions_are_applied_in_turn(kafka: BrokerProcess,
                                                           admin: AdminClient) -> None:
    """As Kafka's controller: 3 then 5 both succeed; 5 then 3 leaves 3 INVALID_PARTITIONS.
    Never UNKNOWN_SERVER_ERROR for the one whose write lost the race."""
    from kio.schema.create_partitions.v3.request import (
        CreatePartitionsRequest, CreatePartitionsTopic,
    )

    for round_ in range(3):
        name = f"cp-race-{round_}-{uuid.uuid4().hex[:6]}"
        admin.create_topics([NewTopic(name, 1)])[name].result(WAIT)
        grow = [CreatePartitionsRequest(topics=(CreatePartitionsTopic(
            name=name, count=n, assignments=None),), timeout=TIMEOUT, validate_only=False)
            for n in (3, 5)]
        clients = [RawClient(kafka.kafka_port, timeout=WAIT) for _ in grow]
        try:
            for c, r in zip(clients, grow):
                c.send(r)
            codes = [c.receive(r).results[0].error_code for c, r in zip(clients, grow)]
        finally:
            for c in clients:
                c.close()
        assert codes in ([ErrorCode.none, ErrorCode.none],
                         [ErrorCode.invalid_partitions, ErrorCode.none]), codes
        assert partitions_of(admin, name) == 5


def test_create_topics_with_no_or_negative_partitions_is_invalid_partitions(
        kafka: BrokerProcess, admin: AdminClient) -> None:
    code, _message = error_of(admin.create_topics([NewTopic("ct-count-0", 0)])["ct-count-0"])
    assert code == ErrorCode.invalid_partitions.value
    assert create(kafka, "ct-count-2", -2).error_code == ErrorCode.invalid_partitions  # raw:
    assert not {"ct-count-0", "ct-count-2"} & set(admin.list_topics(timeout=WAIT).topics)
    # confluent-kafka refuses -2 itself


def test_create_partitions_validate_only_reports_without_change(admin: AdminClient) -> None:
    admin.create_topics([NewTopic("cp-dry", 2)])["cp-dry"].result(WAIT)
    fs = admin.create_partitions([NewPartitions("cp-dry", 4)], validate_only=True)
    assert fs["cp-dry"].result(WAIT) is None
    fs = admin.create_partitions([NewPartitions("cp-dry", 2)], validate_only=True)
    assert error_of(fs["cp-dry"]) == (37, "topic already has 2 partition(s)")
    fs = admin.create_partitions([NewPartitions("cp-dry", 1)], validate_only=True)
    assert error_of(fs["cp-dry"]) == (37, "partition count must be >= current")
    assert partitions_of(admin, "cp-dry") == 2


def test_create_partitions_assignments_are_validated(admin: AdminClient) -> None:
    admin.create_topics([NewTopic("cp-asg", 1)])["cp-asg"].result(WAIT)
    fs = admin.create_partitions([NewPartitions("cp-asg", 3, replica_assignment=[[1], [2]])])
    assert error_of(fs["cp-asg"])[0] == 39
    fs = admin.create_partitions([NewPartitions("cp-asg", 3, replica_assignment=[[1], [1]])])
    assert fs["cp-asg"].result(WAIT) is None
    assert partitions_of(admin, "cp-asg") == 3


# --- DeleteTopics -----------------------------------------------------------------------


def test_deleting_a_topic_drops_its_committed_offsets(kafka: BrokerProcess,
                                                      admin: AdminClient) -> None:
    """As in Kafka: a group must not resume a recreated topic at the old topic's position."""
    from confluent_kafka import Consumer
    from confluent_kafka import ConsumerGroupTopicPartitions

    topic, group = f"dto-{uuid.uuid4().hex[:6]}", f"dto-g-{uuid.uuid4().hex[:6]}"

    def produce(n: int) -> None:
        p = Producer({"bootstrap.servers": kafka.bootstrap})
        for i in range(n):
            p.produce(topic, b"v%d" % i)
        assert p.flush(WAIT) == 0

    admin.create_topics([NewTopic(topic, 1)])[topic].result(WAIT)
    produce(5)
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group,
                  "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
    finally:
        c.close()
    admin.delete_topics([topic])[topic].result(WAIT)
    (future,) = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])]).values()
    assert [tp.offset for tp in future.result(WAIT).topic_partitions] == [-1001]  # none
    admin.create_topics([NewTopic(topic, 1)])[topic].result(WAIT)
    produce(5)
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    got = []
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 20
        while len(got) < 5 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.offset())
    finally:
        c.close()
    assert got == [0, 1, 2, 3, 4]


def test_delete_topics_by_name(admin: AdminClient) -> None:
    admin.create_topics([NewTopic("dt-a", 2)])["dt-a"].result(WAIT)
    fs = admin.delete_topics(["dt-a", "dt-never"], operation_timeout=10)
    assert fs["dt-a"].result(WAIT) is None
    assert error_of(fs["dt-never"])[0] == 3
    assert "dt-a" not in admin.list_topics(timeout=WAIT).topics
    # The name can be used again, from scratch.
    admin.create_topics([NewTopic("dt-a", 1)])["dt-a"].result(WAIT)
    assert partitions_of(admin, "dt-a") == 1


def test_delete_topics_by_id_v6(kafka: BrokerProcess) -> None:
    created = create(kafka, "dt-id", 2)
    state = nested(20, 6, "DeleteTopicState")
    unknown = uuid.uuid4()
    response = call(kafka, 20, 6, timeout=TIMEOUT, topics=(
        state(name=None, topic_id=created.topic_id), state(name=None, topic_id=unknown),
        state(name="dt-id", topic_id=unknown)))
    first, second, third = response.responses
    assert (first.name, first.topic_id, first.error_code) == ("dt-id", created.topic_id,
                                                              ErrorCode.none)
    assert second.error_code == ErrorCode.unknown_topic_id
    assert third.error_code == ErrorCode.invalid_request
    again = call(kafka, 20, 6, timeout=TIMEOUT, topics=(state(name="dt-id",
                                                            topic_id=uuid.UUID(int=0)),))
    assert again.responses[0].error_code == ErrorCode.unknown_topic_or_partition


# --- DeleteRecords ----------------------------------------------------------------------


def produce(kafka: BrokerProcess, topic: str, partition: int, n: int) -> None:
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 0})
    failures: list[Any] = []
    for i in range(n):
        p.produce(topic, f"m{i}".encode(), partition=partition,
                  on_delivery=lambda err, _m: err and failures.append(err))
        p.poll(0)
    assert p.flush(WAIT) == 0 and not failures, failures


def test_delete_records_moves_low_watermark(kafka: BrokerProcess, admin: AdminClient) -> None:
    admin.create_topics([NewTopic("dr", 2)])["dr"].result(WAIT)
    produce(kafka, "dr", 0, 5)
    produce(kafka, "dr", 1, 3)
    fs = admin.delete_records([TopicPartition("dr", 0, 2)])
    assert fs[TopicPartition("dr", 0)].result(WAIT).low_watermark == 2
    # A lower offset changes nothing; -1 means the high watermark.
    fs = admin.delete_records([TopicPartition("dr", 0, 1)])
    assert fs[TopicPartition("dr", 0)].result(WAIT).low_watermark == 2
    fs = admin.delete_records([TopicPartition("dr", 1, -1)])
    assert fs[TopicPartition("dr", 1)].result(WAIT).low_watermark == 3
    fs = admin.delete_records([TopicPartition("dr", 0, 6)])
    assert error_of(fs[TopicPartition("dr", 0)])[0] == 1  # OFFSET_OUT_OF_RANGE
    low, high = _watermarks(kafka, "dr", 0)
    assert (low, high) == (2, 5)


def test_delete_records_unknown_partition_is_per_partition(kafka: BrokerProcess) -> None:
    create(kafka, "dr-x", 1)
    part = nested(21, 2, "DeleteRecordsPartition")
    topic = nested(21, 2, "DeleteRecordsTopic")
    response = call(kafka, 21, 2, timeout=TIMEOUT, topics=(
        topic(name="dr-x", partitions=(part(partition_index=0, offset=0),
                                       part(partition_index=4, offset=0))),
        topic(name="dr-none", partitions=(part(partition_index=0, offset=0),))))
    results = [[(p.partition_index, p.error_code, p.low_watermark) for p in t.partitions]
               for t in response.topics]
    assert results == [[(0, ErrorCode.none, 0), (4, ErrorCode.unknown_topic_or_partition, -1)],
                       [(0, ErrorCode.unknown_topic_or_partition, -1)]]


def _watermarks(kafka: BrokerProcess, topic: str, partition: int) -> tuple[int, int]:
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "wm"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=WAIT)
    finally:
        c.close()


# --- DescribeCluster, DescribeTopicPartitions, DescribeLogDirs ----------------------------


def test_describe_cluster(kafka: BrokerProcess, admin: AdminClient) -> None:
    result = admin.describe_cluster(include_authorized_operations=True).result(WAIT)
    assert [(n.id, n.host, n.port) for n in result.nodes] == [(1, HOST, kafka.kafka_port)]
    assert result.controller.id == 1
    assert result.cluster_id and len(result.cluster_id) == 22
    raw = call(kafka, 60, 2, include_cluster_authorized_operations=True, endpoint_type=1,
               include_fenced_brokers=False)
    assert raw.error_code == ErrorCode.none and raw.controller_id == 1
    assert [(b.broker_id, b.is_fenced) for b in raw.brokers] == [(1, False)]
    assert raw.cluster_authorized_operations & (1 << 10)  # DESCRIBE_CONFIGS: no authorizer yet
    not_asked = call(kafka, 60, 0, include_cluster_authorized_operations=False)
    assert not_asked.cluster_authorized_operations == -2147483648
    raw = call(kafka, 60, 2, include_cluster_authorized_operations=False, endpoint_type=2,
               include_fenced_brokers=False)
    assert raw.error_code == ErrorCode.mismatched_endpoint_type  # CONTROLLER, asked of a broker
    for unknown in (0, 3):
        raw = call(kafka, 60, 2, include_cluster_authorized_operations=False,
                   endpoint_type=unknown, include_fenced_brokers=False)
        assert raw.error_code == ErrorCode.unsupported_endpoint_type


def test_describe_topics_through_confluent(admin: AdminClient) -> None:
    admin.create_topics([NewTopic("dtp-a", 3)])["dtp-a"].result(WAIT)
    fs = admin.describe_topics(TopicCollection(["dtp-a", "dtp-missing"]))
    desc = fs["dtp-a"].result(WAIT)
    assert desc.name == "dtp-a" and len(desc.partitions) == 3
    assert [p.leader.id for p in desc.partitions] == [1, 1, 1]
    assert error_of(fs["dtp-missing"])[0] == 3


def test_describe_topic_partitions_paginates_with_cursor(kafka: BrokerProcess) -> None:
    create(kafka, "pg-a", 3)
    create(kafka, "pg-b", 2)
    topic = nested(75, 0, "TopicRequest")
    cursor = nested(75, 0, "Cursor")
    wanted = (topic(name="pg-b"), topic(name="pg-a"), topic(name="pg-zz"))
    seen: list[tuple[str, int]] = []
    next_cursor = None
    for _page in range(10):
        response = call(kafka, 75, 0, topics=wanted, response_partition_limit=2,
                        cursor=next_cursor)
        for t in response.topics:
            if t.error_code == ErrorCode.none:
                assert sum(1 for _ in t.partitions) <= 2
                seen += [(t.name, p.partition_index) for p in t.partitions]
            else:
                assert (t.name, t.error_code) == ("pg-zz", ErrorCode.unknown_topic_or_partition)
        if response.next_cursor is None:
            break
        next_cursor = cursor(topic_name=response.next_cursor.topic_name,
                             partition_index=response.next_cursor.partition_index)
    assert seen == [("pg-a", 0), ("pg-a", 1), ("pg-a", 2), ("pg-b", 0), ("pg-b", 1)]
    bad = call(kafka, 75, 0, topics=(topic(name="pg-a"),), response_partition_limit=10,
               cursor=cursor(topic_name="pg-b", partition_index=0))
    assert [t.error_code for t in bad.topics] == [ErrorCode.invalid_request]


def test_describe_log_dirs_reports_partition_sizes(kafka: BrokerProcess,
                                                   admin: AdminClient) -> None:
    admin.create_topics([NewTopic("ld", 2)])["ld"].result(WAIT)
    produce(kafka, "ld", 1, 4)
    ask = nested(35, 4, "DescribableLogDirTopic")
    response = call(kafka, 35, 4, topics=(ask(topic="ld", partitions=(0, 1, 9)),))
    assert response.error_code == ErrorCode.none
    (result,) = response.results
    assert Path(result.log_dir) == kafka.data_dir.resolve()
    assert result.total_bytes > 0 and result.usable_bytes > 0
    (topic,) = result.topics
    sizes = {p.partition_index: p.partition_size for p in topic.partitions}
    assert set(sizes) == {0, 1} and sizes[1] > sizes[0]
    everything = call(kafka, 35, 4, topics=None)
    assert "ld" in {t.name for t in everything.results[0].topics}


# --- kafka-python and aiokafka ----------------------------------------------------------


def test_kafka_python_create_grow_delete(kafka: BrokerProcess) -> None:
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewPartitions as KpNewPartitions
    from kafka.admin import NewTopic as KpNewTopic
    from kafka.errors import InvalidPartitionsError, TopicAlreadyExistsError

    client = KafkaAdminClient(bootstrap_servers=kafka.bootstrap, request_timeout_ms=10000)
    try:
        client.create_topics([KpNewTopic("kp-a", 2, 1)])
        with pytest.raises(TopicAlreadyExistsError):
            client.create_topics([KpNewTopic("kp-a", 2, 1)])
        client.create_partitions({"kp-a": KpNewPartitions(4)})
        with pytest.raises(InvalidPartitionsError) as info:
            client.create_partitions({"kp-a": KpNewPartitions(4)})
        assert "topic already has 4 partition(s)" in str(info.value)
        described = client.describe_topics(["kp-a"])
        assert len(described[0]["partitions"]) == 4
        client.delete_topics(["kp-a"])
        assert "kp-a" not in client.list_topics()
    finally:
        client.close()


def test_aiokafka_create_and_grow(kafka: BrokerProcess) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin import NewPartitions as AioNewPartitions
    from aiokafka.admin import NewTopic as AioNewTopic

    async def run() -> list[str]:
        client = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap, request_timeout_ms=10000)
        await client.start()
        try:
            await client.create_topics([AioNewTopic("aio-a", 1, 1)])
            await client.create_partitions({"aio-a": AioNewPartitions(3)})
            return await client.list_topics()
        finally:
            await client.close()

    topics = asyncio.run(asyncio.wait_for(run(), WAIT * 2))
    assert "aio-a" in topics
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    assert partitions_of(admin, "aio-a") == 3
