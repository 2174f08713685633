"""KIP-848 consumer groups end to end: real librdkafka consumers with ``group.protocol=consumer``
against a real daemon. The heartbeat interval is lowered to 500 ms so rebalances take about a
second; every wait is bounded.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import pytest
from conftest import BrokerProcess, start_broker

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

FAST = {"CONNECTORS_KAFKA_CONSUMER_HEARTBEAT_INTERVAL_MS": "500",
        "CONNECTORS_KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "10000"}


@pytest.fixture
def kmq(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = start_broker(tmp_path, env=FAST)
    try:
        yield b
    finally:
        b.stop()


def create_topic(b: BrokerProcess, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    for f in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        f.result(15)


def produce(b: BrokerProcess, topic: str, partitions: int, per_partition: int,
            prefix: str = "m") -> set[bytes]:
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
    values = set()
    for part in range(partitions):
        for i in range(per_partition):
            v = f"{prefix}-{part}-{i}".encode()
            p.produce(topic, v, partition=part)
            values.add(v)
    assert p.flush(15) == 0
    return values


def consumer(b: BrokerProcess, group: str, **extra: str) -> Consumer:
    conf = {"bootstrap.servers": b.bootstrap, "group.id": group,
            "group.protocol": "consumer", "auto.offset.reset": "earliest",
            "enable.auto.commit": "false"}
    conf.update(extra)
    return Consumer(conf)


def drain(consumers: list[Consumer], want: int, timeout: float = 30.0
          ) -> list[list[tuple[int, bytes]]]:
    """Poll every consumer until ``want`` records arrived in total (bounded)."""
    got: list[list[tuple[int, bytes]]] = [[] for _ in consumers]
    deadline = time.monotonic() + timeout
    while sum(map(len, got)) < want and time.monotonic() < deadline:
        for i, c in enumerate(consumers):
            m = c.poll(0.1)
            if m is not None and m.error() is None:
                got[i].append((m.partition(), m.value()))
    return got


def wait_for_assignment(consumers: list[Consumer], partitions: int, timeout: float = 30.0
                        ) -> list[set[int]]:
    """Poll until the consumers' assignments cover ``partitions`` partitions exactly once."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in consumers:
            c.poll(0.05)
        owned = [{tp.partition for tp in c.assignment()} for c in consumers]
        if sum(map(len, owned)) == partitions and len(set().union(*owned)) == partitions and all(
                owned):
            return owned
    raise AssertionError(f"no full split within {timeout}s: {owned}")


def test_consumer_joins_and_reads_everything(kmq: BrokerProcess) -> None:
    create_topic(kmq, "cp1", 3)
    values = produce(kmq, "cp1", 3, 5)
    c = consumer(kmq, "g1")
    try:
        c.subscribe(["cp1"])
        got = drain([c], len(values))
        assert {v for _, v in got[0]} == values
        assert {tp.partition for tp in c.assignment()} == {0, 1, 2}
    finally:
        c.close()


def test_two_members_split_partitions_and_describe_shows_them(kmq: BrokerProcess) -> None:
    create_topic(kmq, "cp2", 4)
    a, b = consumer(kmq, "g2"), consumer(kmq, "g2")
    try:
        a.subscribe(["cp2"])
        wait_for_assignment([a], 4)
        b.subscribe(["cp2"])
        owned = wait_for_assignment([a, b], 4)
        assert not owned[0] & owned[1] and owned[0] | owned[1] == {0, 1, 2, 3}
        values = produce(kmq, "cp2", 4, 3)  # after the split: waiting polls drop records
        got = drain([a, b], len(values))
        assert {v for part in got for _, v in part} == values
        for mine, records in zip(owned, got):  # nobody read a partition it did not own
            assert {p for p, _ in records} <= mine

        admin = AdminClient({"bootstrap.servers": kmq.bootstrap})
        desc = admin.describe_consumer_groups(["g2"])["g2"].result(15)
        assert desc.type == ck.ConsumerGroupType.CONSUMER
        assert len(desc.members) == 2
        described = sorted(sorted(tp.partition for tp in m.assignment.topic_partitions)
                           for m in desc.members)
        assert sorted(sorted(o) for o in owned) == described
        assert {tp.topic for m in desc.members for tp in m.assignment.topic_partitions} == {"cp2"}
        assert_not_classic(kmq, "g2")
    finally:
        a.close()
        b.close()


def test_committed_offsets_resume_after_restart(kmq: BrokerProcess) -> None:
    create_topic(kmq, "cp3", 2)
    first = produce(kmq, "cp3", 2, 4, prefix="first")
    c = consumer(kmq, "g3")
    try:
        c.subscribe(["cp3"])
        got = drain([c], len(first))
        assert {v for _, v in got[0]} == first
        c.commit(asynchronous=False)
    finally:
        c.close()
    second = produce(kmq, "cp3", 2, 3, prefix="second")
    c = consumer(kmq, "g3")
    try:
        c.subscribe(["cp3"])
        got = drain([c], len(second))
        assert {v for _, v in got[0]} == second, "resumed from the committed offsets"
        committed = c.committed([TopicPartition("cp3", 0), TopicPartition("cp3", 1)], 10)
        assert [tp.offset for tp in committed] == [4, 4]
    finally:
        c.close()


def test_an_empty_group_moves_between_protocols_keeping_its_offsets(kmq: BrokerProcess) -> None:
    """As in Kafka, an empty group converts either way (rolling an application back to the
    classic protocol needs no group deletion); committed offsets stay."""
    create_topic(kmq, "cp-mig", 1)
    batches = [produce(kmq, "cp-mig", 1, 3, prefix=f"b{i}") for i in range(3)]
    for i, protocol in enumerate(("consumer", "classic", "consumer")):
        c = consumer(kmq, "g-mig", **{"group.protocol": protocol})
        try:
            c.subscribe(["cp-mig"])
            got = drain([c], 3)
            assert {v for _, v in got[0]} == batches[i], (i, protocol)
            c.commit(asynchronous=False)
        finally:
            c.close()


def assert_not_classic(b: BrokerProcess, group: str) -> None:
    """The classic DescribeGroups answers for a KIP-848 group as Kafka's does: Dead and no
    members, GROUP_ID_NOT_FOUND from v6 on (kafka-python and aiokafka describe with it)."""
    from kio.schema.describe_groups.v5.request import DescribeGroupsRequest as V5
    from kio.schema.describe_groups.v6.request import DescribeGroupsRequest as V6
    from rawkafka import RawClient

    with RawClient(b.kafka_port) as raw:
        new = raw.call(V6(groups=(group,), include_authorized_operations=False)).groups[0]
        old = raw.call(V5(groups=(group,), include_authorized_operations=False)).groups[0]
    assert (new.error_code, new.error_message, new.group_state, new.members) == (
        ck.KafkaError.GROUP_ID_NOT_FOUND, f"Group {group} is not a classic group.", "Dead", ())
    assert (old.error_code, old.group_state, old.protocol_type, old.members) == (0, "Dead", "", ())


def test_group_state_survives_a_daemon_restart(kmq: BrokerProcess) -> None:
    """A member keeps its epoch and assignment across a broker restart and keeps consuming."""
    create_topic(kmq, "cp4", 2)
    first = produce(kmq, "cp4", 2, 2, prefix="before")
    c = consumer(kmq, "g4")
    try:
        c.subscribe(["cp4"])
        assert {v for _, v in drain([c], len(first))[0]} == first
        admin = AdminClient({"bootstrap.servers": kmq.bootstrap})
        before = admin.describe_consumer_groups(["g4"])["g4"].result(15)
        kmq.stop()
        kmq.restart()
        admin = AdminClient({"bootstrap.servers": kmq.bootstrap})  # keep it referenced
        after = admin.describe_consumer_groups(["g4"])["g4"].result(15)
        assert [m.member_id for m in after.members] == [m.member_id for m in before.members]
        second = produce(kmq, "cp4", 2, 2, prefix="after")
        assert {v for _, v in drain([c], len(second))[0]} == second
    finally:
        c.close()
