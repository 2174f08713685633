"""A lone node's data dir cannot silently become one voter of a new cluster.

A lone node is a one-member Raft cluster whose log holds its records only as positions (they
were written through to the segments), so the other members could never receive them, and a
leader among those would hand out the same offsets to different records: the daemon refuses
to start, with one line saying why, and the data stays as it was.
"""
from __future__ import annotations

import subprocess

import pytest

from tests.conftest import free_port, start_broker

confluent_kafka = pytest.importorskip("confluent_kafka")


def test_lone_node_data_refuses_to_join_a_new_cluster(tmp_path):
    lone = start_broker(tmp_path)
    p = confluent_kafka.Producer({"bootstrap.servers": lone.bootstrap, "acks": "all"})
    p.produce("kept", b"record")
    assert p.flush(20) == 0
    assert lone.stop() == 0

    peers = ",".join(f"{i}=127.0.0.1:{free_port()}/127.0.0.1:{free_port()}" for i in (2, 3))
    peers = f"1=127.0.0.1:{free_port()}/127.0.0.1:{lone.kafka_port}," + peers
    joined = start_broker(tmp_path, data_dir=lone.data_dir, wait=False, env={
        "CONNECTORS_KAFKA_PORT": str(lone.kafka_port), "KMQKAFKA_NODE_ID": "1",
        "KMQKAFKA_PEERS": peers})
    try:
        assert joined.proc.wait(30) != 0
    except subprocess.TimeoutExpired:
        joined.kill()
        raise AssertionError("the node started as a cluster member:\n" + joined.log()[-3000:])
    assert "names voters [1, 2, 3] but this node's Raft log belongs to a cluster of [1]" \
        in joined.log()

    again = start_broker(tmp_path, data_dir=lone.data_dir)  # alone again: the data is intact
    try:
        c = confluent_kafka.Consumer({"bootstrap.servers": again.bootstrap, "group.id": "g",
                                      "auto.offset.reset": "earliest"})
        c.assign([confluent_kafka.TopicPartition("kept", 0, 0)])
        m = None
        for _ in range(40):
            m = c.poll(0.5)
            if m is not None and not m.error():
                break
        c.close()
        assert m is not None and m.value() == b"record" and m.offset() == 0
    finally:
        again.stop()


def test_changed_member_ids_refuse_to_start(tmp_path):
    """Editing --peers is not a membership change: a one-member Raft node restarted as one of
    three refuses (the two new nodes could elect each other with empty logs), and starts again
    under its recorded members, even at new addresses."""
    kafka_port = free_port()
    alone = f"1=127.0.0.1:{free_port()}/127.0.0.1:{kafka_port}"
    env = {"CONNECTORS_KAFKA_PORT": str(kafka_port), "KMQKAFKA_NODE_ID": "1",
           "KMQKAFKA_PEERS": alone}
    node = start_broker(tmp_path, env=env)
    p = confluent_kafka.Producer({"bootstrap.servers": node.bootstrap, "acks": "all"})
    p.produce("kept", b"record")
    assert p.flush(20) == 0
    assert node.stop() == 0

    three = alone + "," + ",".join(
        f"{i}=127.0.0.1:{free_port()}/127.0.0.1:{free_port()}" for i in (2, 3))
    grown = start_broker(tmp_path, data_dir=node.data_dir, wait=False,
                         env={**env, "KMQKAFKA_PEERS": three})
    try:
        assert grown.proc.wait(30) != 0
    except subprocess.TimeoutExpired:
        grown.kill()
        raise AssertionError("the node started with new members:\n" + grown.log()[-3000:])
    assert "belongs to a cluster of [1]" in grown.log()

    moved = f"1=127.0.0.1:{free_port()}/127.0.0.1:{kafka_port}"  # same id, new Raft port
    again = start_broker(tmp_path, data_dir=node.data_dir, env={**env, "KMQKAFKA_PEERS": moved})
    assert again.stop() == 0
