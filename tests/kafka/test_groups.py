"""Consumer groups with real clients (confluent-kafka, kafka-python, aiokafka) against a daemon.

Covers: 1→3 members splitting partitions (no overlap, full coverage), a killed member's partitions
moving after its session timeout, resuming from committed offsets across consumer and daemon
restarts with no record skipped, cooperative-sticky rebalancing, a static member restarting
without a rebalance of the others, and the lag metric against the truth.
"""
from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from conftest import BrokerProcess, http_get, start_broker

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

FAST = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


@pytest.fixture(scope="module")
def broker(shared_broker: BrokerProcess) -> BrokerProcess:
    return shared_broker


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(b: BrokerProcess, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(15)


def produce(b: BrokerProcess, topic: str, partitions: int, per_partition: int,
            start: int = 0) -> None:
    p = Producer({"bootstrap.servers": b.bootstrap})
    for i in range(start, start + per_partition):
        for part in range(partitions):
            p.produce(topic, value=f"{part}:{i}".encode(), partition=part)
    assert p.flush(15) == 0


def consumer(b: BrokerProcess, group: str, topic: str, **conf: Any) -> Consumer:
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, **FAST, **conf})
    c.subscribe([topic])
    return c


def poll_until(consumers: list[Consumer], done: Callable[[], bool], timeout: float,
               sink: list[Any] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in consumers:
            m = c.poll(0.05)
            if m is not None and not m.error() and sink is not None:
                sink.append((c, m.partition(), m.offset()))
        if done():
            return
    raise AssertionError("condition not reached in time: " + repr(
        [[(tp.partition) for tp in c.assignment()] for c in consumers]))


def partitions_of(c: Consumer) -> set[int]:
    return {tp.partition for tp in c.assignment()}


def split_ok(consumers: list[Consumer], n: int) -> bool:
    parts = [partitions_of(c) for c in consumers]
    union = set().union(*parts)
    return all(parts) and sum(map(len, parts)) == n and union == set(range(n))


def test_one_to_three_members_split_partitions(broker: BrokerProcess) -> None:
    topic, group = unique("split"), unique("g")
    create_topic(broker, topic, 6)
    members = [consumer(broker, group, topic)]
    try:
        poll_until(members, lambda: split_ok(members, 6), 30)
        for _ in range(2):
            members.append(consumer(broker, group, topic))
            poll_until(members, lambda: split_ok(members, 6), 40)
        assert sorted(len(partitions_of(c)) for c in members) == [2, 2, 2]
        produce(broker, topic, 6, 5)
        seen: list[Any] = []
        poll_until(members, lambda: len(seen) >= 30, 30, seen)
        assert len({(p, o) for _, p, o in seen}) == 30 == len(seen)
        for c, p, _ in seen:  # each record went to the member owning its partition
            assert p in partitions_of(c)
    finally:
        for c in members:
            c.close()


CHILD = textwrap.dedent("""
    import sys, time
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
                  "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                  "auto.offset.reset": "earliest"})
    c.subscribe([sys.argv[3]])
    told = False
    while True:
        c.poll(0.1)
        if c.assignment() and not told:
            print("assigned", flush=True)
            told = True
""")


def test_killed_member_partitions_reassigned_after_session_timeout(
        broker: BrokerProcess, tmp_path: Path) -> None:
    topic, group = unique("die"), unique("g")
    create_topic(broker, topic, 4)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    child = subprocess.Popen([sys.executable, str(script), broker.bootstrap, group, topic],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    survivor = None
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "assigned"
        survivor = consumer(broker, group, topic)
        poll_until([survivor], lambda: len(partitions_of(survivor)) == 2, 40)
        child.kill()  # no LeaveGroup: only the session timeout can notice
        child.wait(10)
        killed_at = time.monotonic()
        poll_until([survivor], lambda: len(partitions_of(survivor)) == 4, 40)
        assert time.monotonic() - killed_at > 3  # it took the session timeout, not a leave
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if survivor is not None:
            survivor.close()


def _kp_consume(b: BrokerProcess, group: str, topic: str, want: int) -> list[int]:
    """kafka-python: poll ``want`` records, commit synchronously, close; return their offsets."""
    from kafka import KafkaConsumer

    c = KafkaConsumer(topic, bootstrap_servers=b.bootstrap, group_id=group,
                      enable_auto_commit=False, auto_offset_reset="earliest",
                      session_timeout_ms=6000, heartbeat_interval_ms=500,
                      consumer_timeout_ms=500)
    got: list[int] = []
    deadline = time.monotonic() + 40
    try:
        while len(got) < want and time.monotonic() < deadline:
            batch = c.poll(timeout_ms=200, max_records=want - len(got))
            for records in batch.values():
                got.extend(r.offset for r in records)
        c.commit()
    finally:
        c.close()
    assert len(got) == want, got
    return got


def test_resume_from_committed_offsets_after_consumer_and_daemon_restart(
        tmp_path: Path) -> None:
    b = start_broker(tmp_path)
    try:
        topic, group = unique("resume"), unique("g")
        create_topic(b, topic, 1)
        produce(b, topic, 1, 20)
        first = _kp_consume(b, group, topic, 10)
        second = _kp_consume(b, group, topic, 5)  # consumer restart
        b.stop()
        b.restart()  # daemon restart: offsets must come back from the store
        produce(b, topic, 1, 5, start=20)
        third = _kp_consume(b, group, topic, 10)
        assert first + second + third == list(range(25))
    finally:
        b.stop()


def test_cooperative_sticky_incremental_rebalance(broker: BrokerProcess) -> None:
    topic, group = unique("coop"), unique("g")
    create_topic(broker, topic, 4)
    conf = {"partition.assignment.strategy": "cooperative-sticky"}
    members = [consumer(broker, group, topic, **conf)]
    try:
        poll_until(members, lambda: split_ok(members, 4), 30)
        before = partitions_of(members[0])
        members.append(consumer(broker, group, topic, **conf))
        poll_until(members, lambda: split_ok(members, 4), 40)
        # sticky: the first member kept a subset of what it had
        assert partitions_of(members[0]) <= before
        members.append(consumer(broker, group, topic, **conf))
        poll_until(members, lambda: split_ok(members, 4) or (
            sum(map(len, map(partitions_of, members))) == 4
            and set().union(*map(partitions_of, members)) == set(range(4))
            and sum(1 for c in members if partitions_of(c)) >= 3), 40)
        produce(broker, topic, 4, 3)
        seen: list[Any] = []
        poll_until(members, lambda: len(seen) >= 12, 30, seen)
        assert len({(p, o) for _, p, o in seen}) == 12
        members.pop().close()  # a leave: the others take the partitions back
        poll_until(members, lambda: split_ok(members, 4), 40)
    finally:
        for c in members:
            c.close()


def test_static_member_restart_does_not_rebalance_others(broker: BrokerProcess) -> None:
    topic, group = unique("static"), unique("g")
    create_topic(broker, topic, 4)
    events: list[str] = []
    conf = {"session.timeout.ms": 20000}
    a = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                  "group.instance.id": "a", "auto.offset.reset": "earliest", **FAST, **conf})
    a.subscribe([topic], on_assign=lambda c, ps: events.append("assign"),
                on_revoke=lambda c, ps: events.append("revoke"))
    b = consumer(broker, group, topic, **{"group.instance.id": "b", **conf})
    b2 = None
    try:
        poll_until([a, b], lambda: split_ok([a, b], 4), 40)
        b_parts = partitions_of(b)
        settled = len(events)
        b.close()  # static member: librdkafka sends no LeaveGroup
        b2 = consumer(broker, group, topic, **{"group.instance.id": "b", **conf})
        poll_until([a, b2], lambda: bool(partitions_of(b2)), 30)
        assert partitions_of(b2) == b_parts
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            a.poll(0.1)
            b2.poll(0.1)
        assert events[settled:] == [], events  # a was never revoked or reassigned
    finally:
        a.close()
        if b2 is not None:
            b2.close()


def test_aiokafka_group_consume_and_commit(broker: BrokerProcess) -> None:
    topic, group = unique("aio"), unique("g")
    create_topic(broker, topic, 2)
    produce(broker, topic, 2, 4)

    async def run() -> dict[int, int]:
        c = aiokafka.AIOKafkaConsumer(topic, bootstrap_servers=broker.bootstrap,
                                      group_id=group, enable_auto_commit=False,
                                      auto_offset_reset="earliest", session_timeout_ms=6000,
                                      heartbeat_interval_ms=500)
        await c.start()
        try:
            got = 0
            async with asyncio.timeout(30):
                while got < 8:
                    batch = await c.getmany(timeout_ms=500)
                    got += sum(len(v) for v in batch.values())
            await c.commit()
            return {tp.partition: await c.committed(tp) for tp in c.assignment()}
        finally:
            await c.stop()

    assert asyncio.run(run()) == {0: 4, 1: 4}


def lag_metrics(b: BrokerProcess, group: str) -> dict[tuple[str, int], float]:
    text = http_get(b.http_port, "/metrics").decode()
    out = {}
    for m in re.finditer(r'^kmqkafka_consumer_group_lag\{([^}]*)\} (\S+)$', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels["group"] == group:
            out[(labels["topic"], int(labels["partition"]))] = float(m.group(2))
    return out


def test_lag_metric_matches_the_truth(broker: BrokerProcess) -> None:
    topic, group = unique("lag"), unique("g")
    create_topic(broker, topic, 2)
    produce(broker, topic, 2, 7)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                  "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 7)],
                 asynchronous=False)
        assert lag_metrics(broker, group) == {(topic, 0): 4.0, (topic, 1): 0.0}
        produce(broker, topic, 2, 2, start=7)
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        assert high == 9
        assert lag_metrics(broker, group) == {(topic, 0): 6.0, (topic, 1): 2.0}
    finally:
        c.close()


def test_members_arriving_together_share_the_first_generation(broker: BrokerProcess) -> None:
    """Kafka's group.initial.rebalance.delay.ms (3 s by default): a new group waits for more
    members before its first rebalance, so consumers started together split the partitions
    at once and none has partitions taken back (librdkafka's own tests rely on it)."""
    topic, group = unique("gather"), unique("g-gather")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 4)])[topic].result(15)
    revoked: list[int] = []
    consumers = []
    for i in range(2):
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                      "auto.offset.reset": "earliest"})
        c.subscribe([topic], on_revoke=lambda _c, parts, i=i: revoked.extend(
            [i] * len(parts)))
        consumers.append(c)
        c.poll(0.5)  # the second arrives about half a second after the first
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(c.assignment() for c in consumers):
            for c in consumers:
                c.poll(0.2)
        assert sorted(len(c.assignment()) for c in consumers) == [2, 2]
        assert not revoked
    finally:
        for c in consumers:
            c.close()
