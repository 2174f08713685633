"""Consumer-group conformance found by a sweep with unmodified clients over real sockets.

Each test names a behaviour of Apache Kafka's group coordinator that a client can observe and
kmqkafka once got wrong. One daemon (KIP-848 heartbeats every 500 ms) serves the whole module;
every test uses its own topic and group names, and every wait is bounded.
"""
from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from conftest import BrokerProcess, start_broker

ck = pytest.importorskip("confluent_kafka")
pytest.importorskip("kafka")

from confluent_kafka import Consumer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from kafka.admin import KafkaAdminClient, MemberToRemove  # noqa: E402
from kafka.errors import NoError, UnknownMemberIdError  # noqa: E402

WAIT = 15.0


@pytest.fixture(scope="module")
def kmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = start_broker(tmp_path_factory.mktemp("groups_sweep"),
                     env={"CONNECTORS_KAFKA_CONSUMER_HEARTBEAT_INTERVAL_MS": "500"})
    try:
        yield b
    finally:
        b.stop()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(b: BrokerProcess, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(WAIT)


def owned(c: Consumer) -> set[int]:
    return {tp.partition for tp in c.assignment()}


def poll_until(consumers: list[Consumer], done: Callable[[], bool], timeout: float = WAIT
               ) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in consumers:
            c.poll(0.05)
        if done():
            return
    raise AssertionError(f"not reached within {timeout}s: {[owned(c) for c in consumers]}")


def kip848_consumer(b: BrokerProcess, group: str, topic: str, **conf: Any) -> Consumer:
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group,
                  "group.protocol": "consumer", "auto.offset.reset": "earliest", **conf})
    c.subscribe([topic])
    return c


def test_admin_removes_a_departed_static_member_of_a_kip848_group(kmq: BrokerProcess) -> None:
    """Kafka answers a classic LeaveGroup aimed at a consumer (KIP-848) group member by member
    (``classicGroupLeaveToConsumerGroup``): admin tools remove a static member by instance id, and
    its partitions move at once instead of after its session timeout (45 s by default)."""
    topic, group = unique("t"), unique("g")
    create_topic(kmq, topic, 4)
    main = kip848_consumer(kmq, group, topic, **{"client.id": "main"})
    static = kip848_consumer(kmq, group, topic, **{"client.id": "static",
                                                   "group.instance.id": "inst-a"})
    try:
        poll_until([main, static], lambda: len(owned(main)) == 2 and len(owned(static)) == 2)
    finally:
        static.close()  # a static member's close keeps its partitions (member epoch -2)
    admin = KafkaAdminClient(bootstrap_servers=kmq.bootstrap, request_timeout_ms=10_000)
    try:
        result = admin.remove_group_members(group, [MemberToRemove(group_instance_id="inst-a"),
                                                    MemberToRemove(group_instance_id="nope")])
        errors = {getattr(m, "group_instance_id", m): e for m, e in result.items()}
        assert errors == {"inst-a": NoError, "nope": UnknownMemberIdError}
        poll_until([main], lambda: owned(main) == {0, 1, 2, 3}, timeout=5.0)
    finally:
        admin.close()
        main.close()


def test_kip848_regex_topics_follow_the_literal_ones_in_a_later_heartbeat(
        kmq: BrokerProcess) -> None:
    """Kafka resolves a new SubscribedTopicRegex in the background: the heartbeat that brings
    it with literal names is assigned the literal topics, the matches come with a later one
    (librdkafka's test 0045 asserts this order)."""
    suffix = uuid.uuid4().hex[:8]
    regex_topics, literal = [f"rx{i}_{suffix}" for i in (1, 2)], f"lit_{suffix}"
    for name in regex_topics:
        create_topic(kmq, name, 2)
    create_topic(kmq, literal, 1)
    calls: list[set[str]] = []
    c = Consumer({"bootstrap.servers": kmq.bootstrap, "group.id": unique("rx"),
                  "group.protocol": "consumer"})
    try:
        c.subscribe([f"^rx.*_{suffix}", literal],
                    on_assign=lambda _c, parts: calls.append({p.topic for p in parts}))
        poll_until([c], lambda: len({(tp.topic, tp.partition) for tp in c.assignment()}) == 5)
    finally:
        c.close()
    assert calls[0] == {literal}, calls
    assert set().union(*calls) == {literal, *regex_topics}
