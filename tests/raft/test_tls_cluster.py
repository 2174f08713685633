"""A 3-node cluster whose nodes have a TLS certificate: the Raft links speak TLS (peers
verified against KMQKAFKA_TLS_CA), records replicate, and clients read them from another node
over the SSL listener. A plaintext connection to a Raft port carries nothing."""
from __future__ import annotations

import socket
import ssl
import time
from pathlib import Path

import pytest

from tests.conftest import free_port, make_self_signed, start_broker
from tests.raft.test_cluster import read_all, wait_leader
from tests.raft.test_kafka_cluster import fetch_all, produce_confluent

confluent_kafka = pytest.importorskip("confluent_kafka")

IDS = (1, 2, 3)


def test_raft_links_use_tls_and_replicate(tmp_path: Path) -> None:
    cert, key = make_self_signed(tmp_path)
    raft = {i: free_port() for i in IDS}
    kafka = {i: free_port() for i in IDS}
    tls_ports = {i: free_port() for i in IDS}  # one host: each node's TLS port is in its entry
    peers = ",".join(f"{i}=127.0.0.1:{raft[i]}/127.0.0.1:{kafka[i]}/{tls_ports[i]}" for i in IDS)
    brokers = {}
    try:
        for i in IDS:
            d = tmp_path / f"n{i}"
            d.mkdir()
            brokers[i] = start_broker(d, wait=False, env={
                "KMQKAFKA_NODE_ID": str(i), "KMQKAFKA_PEERS": peers,
                "CONNECTORS_KAFKA_PORT": str(kafka[i]), "KMQKAFKA_RAFT_TICK_MS": "50",
                "CONNECTORS_KAFKA_TLS_PORT": str(tls_ports[i]),
                "KMQKAFKA_TLS_CERT": str(cert), "KMQKAFKA_TLS_KEY": str(key),
                "KMQKAFKA_TLS_CA": str(cert)})
        leader = wait_leader(brokers, timeout=30)

        # The Raft port completes a TLS handshake with a certificate the CA signed ...
        ctx = ssl.create_default_context(cafile=str(cert))
        ctx.load_cert_chain(str(cert), str(key))
        with socket.create_connection(("127.0.0.1", raft[leader]), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                assert tls.version() in ("TLSv1.2", "TLSv1.3")
        # ... and a plaintext peer gets nothing back but a TLS alert or a closed socket.
        with socket.create_connection(("127.0.0.1", raft[leader]), timeout=5) as raw:
            raw.sendall(b"\x00\x00\x00\x05hello")
            raw.settimeout(5)
            reply = raw.recv(64)
            assert reply == b"" or reply[0] == 0x15  # 0x15: TLS alert record

        # Large records too: Raft frames of 256 KiB and more used to bypass TLS both ways.
        values = [b"tls-%03d" % i for i in range(97)] + [
            bytes([65 + i]) * 300_000 for i in range(3)]
        assert produce_confluent(brokers[leader].bootstrap, "tls-topic", values) == list(
            range(100))
        other = next(i for i in IDS if i != leader)
        deadline = time.monotonic() + 20
        while fetch_all(kafka[other], "tls-topic", 100) != list(enumerate(values)):
            assert time.monotonic() < deadline, "records did not reach the follower"
            time.sleep(0.2)

        got = [v for _o, v in read_all(f"127.0.0.1:{brokers[other].tls_port}", "tls-topic",
                                       len(values), **{"security.protocol": "SSL",
                                                       "ssl.ca.location": str(cert)})]
        assert got == values
        assert "raft link to node" in brokers[other].log()
        # Metadata over TLS names every node at its own TLS port, not the answering node's.
        c = confluent_kafka.Consumer({"bootstrap.servers": f"127.0.0.1:{tls_ports[other]}",
                                      "security.protocol": "SSL", "ssl.ca.location": str(cert),
                                      "group.id": "tls-md"})
        try:
            listed = {b.id: b.port for b in c.list_topics(timeout=10).brokers.values()}
        finally:
            c.close()
        assert listed == tls_ports
    finally:
        for b in brokers.values():
            b.kill()
