"""A 3-node cluster on 127.0.0.2-4 sharing port numbers, configured only by --node-id/--peers.

Each node takes its Kafka port, bind address and advertised endpoint from its own --peers
entry, so three daemons on one host need nothing else (no per-node port or host settings);
the HTTP site binds that loopback address too, on the default port.
"""
from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import TWISTD, base_env, free_port
from tests.raft.test_cluster import produce, read_all

confluent_kafka = pytest.importorskip("confluent_kafka")
import confluent_kafka.admin  # noqa: E402

HOSTS = {1: "127.0.0.2", 2: "127.0.0.3", 3: "127.0.0.4"}


def _healthy(host: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"node on {host} exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://{host}:8080/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"node on {host} not healthy:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Start the three nodes; yields the shared Kafka port."""
    root = tmp_path_factory.mktemp("loopback-cluster")
    raft_port, kafka_port = free_port(), free_port()
    peers = ",".join(f"{i}={h}:{raft_port}/{h}:{kafka_port}" for i, h in HOSTS.items())
    procs: dict[int, subprocess.Popen[bytes]] = {}
    logs = {i: root / f"node{i}.log" for i in HOSTS}
    try:
        for i in HOSTS:
            env = {**base_env(), "CONNECTORS_KAFKA_ENABLE": "true", "KMQKAFKA_NODE_ID": str(i),
                   "KMQKAFKA_PEERS": peers, "KMQKAFKA_DATA_DIR": str(root / f"data{i}")}
            with open(logs[i], "ab") as log:
                procs[i] = subprocess.Popen(
                    [str(TWISTD), "-n", "--pidfile=", "kmqkafka"], cwd=root, env=env,
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        for i, host in HOSTS.items():
            _healthy(host, procs[i], logs[i], 30)
        yield {"kafka_port": kafka_port}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)


def test_admin_call_right_after_start_does_not_wait_for_the_election(nodes: dict) -> None:
    """Issued as soon as every node answers /health, typically before the first Raft leader
    (default election timeout): librdkafka stops asking for a controller after a few -1
    answers, so the nodes name themselves while no leader is known and forward."""
    port = nodes["kafka_port"]
    admin = confluent_kafka.admin.AdminClient(
        {"bootstrap.servers": ",".join(f"{h}:{port}" for h in HOSTS.values())})
    futures = admin.create_topics([confluent_kafka.admin.NewTopic("early", 3, 1)],
                                  request_timeout=15)
    assert futures["early"].result(timeout=30) is None
    md = admin.list_topics("early", timeout=10)
    assert len(md.topics["early"].partitions) == 3


def test_metadata_names_each_node_at_its_own_address_and_port(nodes: dict) -> None:
    port = nodes["kafka_port"]
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": f"{HOSTS[1]}:{port}"})
    deadline = time.monotonic() + 20
    while True:
        md = admin.list_topics(timeout=10)
        seen = {b.id: (b.host, b.port) for b in md.brokers.values()}
        if len(seen) == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert seen == {i: (h, port) for i, h in HOSTS.items()}


def test_produce_on_one_address_consume_from_another(nodes: dict) -> None:
    port = nodes["kafka_port"]
    values = [b"v%03d" % i for i in range(200)]
    assert produce(f"{HOSTS[2]}:{port}", "loopback-topic", values) == list(range(200))
    got = [v for _o, v in read_all(f"{HOSTS[3]}:{port}", "loopback-topic", len(values))]
    assert got == values
