"""A real 3-process cluster: produce with acks=all, kill -9 the leader, a new leader takes
over, and every acknowledged record is readable at the same offset on every node."""
from __future__ import annotations

import re
import time

import pytest

from tests.conftest import free_port, start_broker, _wait_healthy

confluent_kafka = pytest.importorskip("confluent_kafka")
import confluent_kafka.admin  # noqa: E402

LEADER_LINE = re.compile(r"raft node (\d+): (\w[\w-]*), leader (\w+)")


def current_leader(brokers: dict) -> int | None:
    """The leader every live node's log last reported, if they agree."""
    seen = set()
    for node_id, b in brokers.items():
        if b.proc.poll() is not None:
            continue
        lines = LEADER_LINE.findall(b.log())
        if not lines:
            return None
        seen.add(lines[-1][2])
    if len(seen) == 1 and (leader := seen.pop()) != "None":
        return int(leader)
    return None


def wait_leader(brokers: dict, timeout: float = 20.0, not_: int | None = None) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leader = current_leader(brokers)
        if leader is not None and leader != not_:
            return leader
        time.sleep(0.1)
    raise AssertionError("no leader: " + "\n".join(b.log()[-2000:] for b in brokers.values()))


def produce(bootstrap: str, topic: str, values: list[bytes]) -> list[int]:
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                  "enable.idempotence": False, "linger.ms": 5,
                                  "message.timeout.ms": 20000})
    offsets: list = []
    errors: list = []

    def report(err, msg):
        if err is not None:
            errors.append(err)
        else:
            offsets.append((msg.value(), msg.offset()))

    for v in values:
        p.produce(topic, v, partition=0, on_delivery=report)
    assert p.flush(30) == 0
    assert not errors, errors
    return [o for _v, o in sorted(offsets, key=lambda x: values.index(x[0]))]


def read_all(bootstrap: str, topic: str, count: int,
             **conf: str) -> list[tuple[int, bytes]]:
    """(offset, value) of partition 0 from offset 0 until ``count`` arrived (20 s at most);
    ``conf`` adds consumer settings (e.g. TLS)."""
    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "g" + str(time.time()),
                                  "enable.auto.commit": False, **conf})
    c.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    out: list = []
    deadline = time.monotonic() + 20
    try:
        while len(out) < count and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                out.append((m.offset(), m.value()))
    finally:
        c.close()
    return out


def start_cluster(tmp_path, ids: list[int], brokers: dict) -> dict[int, int]:
    """One daemon per id on loopback (50 ms Raft ticks), put in ``brokers`` as each starts (so
    the caller's cleanup stops every one started); returns each node's Raft port once every
    node is healthy."""
    raft_ports = {i: free_port() for i in ids}
    kafka_ports = {i: free_port() for i in ids}
    peers = ",".join(f"{i}=127.0.0.1:{raft_ports[i]}/127.0.0.1:{kafka_ports[i]}" for i in ids)
    for i in ids:
        d = tmp_path / f"n{i}"
        d.mkdir()
        brokers[i] = start_broker(d, env={
            "KMQKAFKA_NODE_ID": str(i), "KMQKAFKA_PEERS": peers,
            "CONNECTORS_KAFKA_PORT": str(kafka_ports[i]),
            "KMQKAFKA_RAFT_TICK_MS": "50"}, wait=False)
    for b in brokers.values():
        _wait_healthy(b, 30)
    return raft_ports


@pytest.mark.timeout(120)
def test_kill_9_the_leader_and_every_acknowledged_record_survives_everywhere(tmp_path):
    ids = [0, 1, 2]  # Kafka's ids start at 0 (broker.id=0): node 0 is a node like any other
    brokers: dict = {}
    try:
        start_cluster(tmp_path, ids, brokers)
        leader = wait_leader(brokers)
        meta = confluent_kafka.admin.AdminClient(
            {"bootstrap.servers": brokers[leader].bootstrap}).list_topics(timeout=10)
        assert sorted(meta.brokers) == ids and meta.controller_id == leader
        first = [b"one-%d" % i for i in range(50)]
        offsets = produce(brokers[leader].bootstrap, "rt", first)
        assert offsets == list(range(50))

        brokers[leader].kill()
        t0 = time.monotonic()
        new = wait_leader({i: b for i, b in brokers.items() if i != leader}, not_=leader)
        assert time.monotonic() - t0 < 10
        second = [b"two-%d" % i for i in range(50)]
        assert produce(brokers[new].bootstrap, "rt", second) == list(range(50, 100))

        brokers[leader].restart()
        expect = list(enumerate(first + second))
        for i, b in brokers.items():
            assert read_all(b.bootstrap, "rt", 100) == expect, f"node {i}"
    finally:
        for b in brokers.values():
            if b.proc.poll() is None:
                b.kill()
