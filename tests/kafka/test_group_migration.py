"""Online migration between classic and KIP-848 groups with real clients (Kafka 4's default
``group.consumer.migration.policy=bidirectional``): a rolling upgrade of librdkafka consumers
from ``group.protocol=classic`` to ``consumer`` and back, with classic members of every kind
(eager and cooperative librdkafka, kafka-python, aiokafka) sharing one group with KIP-848
members. Every wait is bounded.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from conftest import BrokerProcess, start_broker

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer  # noqa: E402

from tests.kafka.test_consumer_protocol import (  # noqa: E402
    create_topic, produce as produce_records,
)

PARTITIONS = 4
FAST = {"CONNECTORS_KAFKA_CONSUMER_HEARTBEAT_INTERVAL_MS": "500",
        "CONNECTORS_KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "10000",
        "CONNECTORS_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0"}


@pytest.fixture(scope="module")
def kmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = start_broker(tmp_path_factory.mktemp("migration"), env=FAST)
    try:
        yield b
    finally:
        b.stop()


def topic_with_records(b: BrokerProcess, name: str, prefix: str) -> set[bytes]:
    create_topic(b, name, PARTITIONS)
    return produce(b, name, prefix)


def produce(b: BrokerProcess, topic: str, prefix: str) -> set[bytes]:
    """25 records per partition, each value unique (``test_consumer_protocol.produce``)."""
    return produce_records(b, topic, PARTITIONS, 25, prefix)


class Member:
    """A subscribed librdkafka consumer that records what it read."""

    def __init__(self, b: BrokerProcess, group: str, topic: str, protocol: str,
                 strategy: str = "range", instance: str | None = None) -> None:
        conf: dict[str, Any] = {
            "bootstrap.servers": b.bootstrap, "group.id": group, "group.protocol": protocol,
            "auto.offset.reset": "earliest", "enable.auto.commit": "false"}
        if instance:
            conf["group.instance.id"] = instance
        if protocol == "classic":
            conf.update({"session.timeout.ms": 6000, "heartbeat.interval.ms": 300,
                         "partition.assignment.strategy": strategy})
        self.consumer = Consumer(conf)
        self.consumer.subscribe([topic])
        self.read: list[bytes] = []

    def poll(self) -> None:
        m = self.consumer.poll(0.05)
        if m is not None and m.error() is None:
            self.read.append(m.value())
            self.consumer.commit(m)

    def partitions(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}

    def close(self) -> None:
        self.consumer.close()


def run(members: list[Any], until: Any, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for m in members:
            m.poll()
        if until():
            return
    raise AssertionError(f"not reached in {timeout}s: {[sorted(m.partitions()) for m in members]}")


def split(members: list[Any]) -> Any:
    """The members' assignments cover every partition once, each member holding some."""
    def done() -> bool:
        owned = [m.partitions() for m in members]
        return all(owned) and sum(map(len, owned)) == PARTITIONS and len(
            set().union(*owned)) == PARTITIONS
    return done


def read_all(members: list[Any], values: set[bytes]) -> Any:
    return lambda: values <= {v for m in members for v in m.read}


def describe(b: BrokerProcess, group: str) -> Any:
    """ConsumerGroupDescribe v1, whose members carry their MemberType (0 classic, 1 consumer)."""
    from kio.schema.consumer_group_describe.v1.request import ConsumerGroupDescribeRequest
    from rawkafka import RawClient

    with RawClient(b.kafka_port) as raw:
        return raw.call(ConsumerGroupDescribeRequest(
            group_ids=(group,), include_authorized_operations=False)).groups[0]


def test_a_rolling_upgrade_to_kip848_and_back_loses_nothing(kmq: BrokerProcess) -> None:
    """Two eager classic members; each is replaced in turn by a KIP-848 member (the first
    replacement converts the group, with the other classic member still in it), then one is
    rolled back. Every record produced along the way is read."""
    values = topic_with_records(kmq, "mig-roll", "r0")
    group = "g-roll"
    a, b = Member(kmq, group, "mig-roll", "classic"), Member(kmq, group, "mig-roll", "classic")
    run([a, b], split([a, b]))
    run([a, b], read_all([a, b], values))
    members, everyone = [a, b], [a, b]
    for step, protocol in enumerate(("consumer", "consumer", "classic")):
        old = members.pop(0)
        old.close()
        new = Member(kmq, group, "mig-roll", protocol)
        members.append(new)
        everyone.append(new)
        more = produce(kmq, "mig-roll", f"r{step + 1}")
        values |= more
        run(members, split(members))
        run(members, read_all(members, more))
        described = describe(kmq, group)
        kinds = sorted(m.member_type for m in described.members)
        assert described.error_code == 0 and len(kinds) == 2, described
        assert kinds == {0: [0, 1], 1: [1, 1], 2: [0, 1]}[step], (step, kinds)
    assert values <= {v for m in everyone for v in m.read}
    # Back to a classic group when the last KIP-848 member leaves.
    members[0].close()
    rest = members[1]
    run([rest], lambda: rest.partitions() == set(range(PARTITIONS)))
    final = produce(kmq, "mig-roll", "r9")
    run([rest], read_all([rest], final))
    assert describe(kmq, group).error_code == ck.KafkaError.GROUP_ID_NOT_FOUND
    rest.close()


@pytest.mark.parametrize("strategy", ["cooperative-sticky", "roundrobin"])
def test_classic_and_kip848_members_share_partitions(kmq: BrokerProcess, strategy: str) -> None:
    """A KIP-848 member joins a classic group mid-stream and leaves again; the classic member
    (cooperative or eager) gives up half and gets it back, and reads everything."""
    topic, group = f"mig-{strategy}", f"g-{strategy}"
    values = topic_with_records(kmq, topic, "s")
    a = Member(kmq, group, topic, "classic", strategy)
    run([a], lambda: a.partitions() == set(range(PARTITIONS)))
    b = Member(kmq, group, topic, "consumer")
    run([a, b], split([a, b]))
    assert len(a.partitions()) == len(b.partitions()) == PARTITIONS // 2
    run([a, b], read_all([a, b], values))
    b.close()
    run([a], lambda: a.partitions() == set(range(PARTITIONS)))
    more = produce(kmq, topic, "t")
    run([a], read_all([a], more))
    a.close()


def test_a_static_classic_member_restarts_into_a_mixed_group(kmq: BrokerProcess) -> None:
    """A static classic member (group.instance.id) closes without leaving and comes back under
    a new member id: it takes its old place and partitions, with no rebalance for the
    KIP-848 member."""
    values = topic_with_records(kmq, "mig-static", "s")
    a = Member(kmq, "g-static", "mig-static", "classic", instance="ia")
    run([a], lambda: a.partitions() == set(range(PARTITIONS)))
    b = Member(kmq, "g-static", "mig-static", "consumer")
    run([a, b], split([a, b]))
    held, before = a.partitions(), describe(kmq, "g-static")
    a.close()
    a2 = Member(kmq, "g-static", "mig-static", "classic", instance="ia")
    run([a2, b], lambda: a2.partitions() == held)
    after = describe(kmq, "g-static")
    assert after.group_epoch == before.group_epoch
    assert {m.instance_id for m in after.members if m.member_type == 0} == {"ia"}
    run([a2, b], read_all([a, a2, b], values))
    a2.close()
    b.close()


def test_a_kafka_python_classic_member_shares_a_group_with_a_kip848_member(
        kmq: BrokerProcess) -> None:
    kafka = pytest.importorskip("kafka")
    values = topic_with_records(kmq, "mig-kp", "k")
    kp = kafka.KafkaConsumer("mig-kp", bootstrap_servers=kmq.bootstrap, group_id="g-kp",
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             session_timeout_ms=6000, heartbeat_interval_ms=300,
                             consumer_timeout_ms=100)

    class KafkaPythonMember:
        def __init__(self) -> None:
            self.read: list[bytes] = []

        def poll(self) -> None:
            for records in kp.poll(timeout_ms=50).values():
                self.read.extend(r.value for r in records)

        def partitions(self) -> set[int]:
            return {tp.partition for tp in kp.assignment()}

    first = KafkaPythonMember()
    try:
        run([first], lambda: first.partitions() == set(range(PARTITIONS)))
        b = Member(kmq, "g-kp", "mig-kp", "consumer")
        run([first, b], split([first, b]))
        run([first, b], read_all([first, b], values))
        kinds = sorted(m.member_type for m in describe(kmq, "g-kp").members)
        assert kinds == [0, 1]
        b.close()
        run([first], lambda: first.partitions() == set(range(PARTITIONS)))
    finally:
        kp.close()


def test_a_mixed_group_keeps_its_members_across_a_restart(tmp_path: Path) -> None:
    b = start_broker(tmp_path, env=FAST)
    try:
        values = topic_with_records(b, "mig-restart", "x")
        a = Member(b, "g-restart", "mig-restart", "classic")
        run([a], lambda: a.partitions() == set(range(PARTITIONS)))
        c = Member(b, "g-restart", "mig-restart", "consumer")
        run([a, c], split([a, c]))
        run([a, c], read_all([a, c], values))
        before = describe(b, "g-restart")
        b.stop()
        b.restart()
        after = describe(b, "g-restart")
        assert sorted((m.member_id, m.member_type) for m in after.members) == sorted(
            (m.member_id, m.member_type) for m in before.members)
        more = produce(b, "mig-restart", "y")
        run([a, c], read_all([a, c], more))
        a.close()
        c.close()
    finally:
        b.stop()


def test_an_aiokafka_classic_member_shares_a_group_with_a_kip848_member(
        kmq: BrokerProcess) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    import asyncio

    values = topic_with_records(kmq, "mig-aio", "a")

    async def scenario() -> None:
        aio = aiokafka.AIOKafkaConsumer(
            "mig-aio", bootstrap_servers=kmq.bootstrap, group_id="g-aio",
            auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=300)
        await aio.start()
        read: list[bytes] = []

        async def spin(until: Any, others: list[Member], timeout: float = 40.0) -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                for m in others:
                    m.poll()
                batches = await aio.getmany(timeout_ms=50)
                read.extend(r.value for rs in batches.values() for r in rs)
                if until():
                    return
            raise AssertionError(f"not reached: {aio.assignment()}")

        def owned() -> set[int]:
            return {tp.partition for tp in aio.assignment()}

        try:
            await spin(lambda: owned() == set(range(PARTITIONS)), [])
            b = Member(kmq, "g-aio", "mig-aio", "consumer")
            await spin(lambda: owned() and b.partitions() and not owned() & b.partitions()
                       and len(owned() | b.partitions()) == PARTITIONS, [b])
            await spin(lambda: values <= set(read) | set(b.read), [b])
            b.close()
            await spin(lambda: owned() == set(range(PARTITIONS)), [])
        finally:
            await aio.stop()

    asyncio.run(scenario())
