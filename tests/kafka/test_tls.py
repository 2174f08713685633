"""Kafka over TLS on 9093: real clients produce and consume through the SSL listener."""

from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from conftest import BrokerProcess, make_self_signed, start_broker


def tls_broker(tmp_path) -> tuple[BrokerProcess, Path, dict[str, str]]:
    """A daemon with a self-signed certificate: (broker, cert, confluent-kafka SSL settings)."""
    cert, key = make_self_signed(tmp_path)
    b = start_broker(tmp_path, env={"KMQKAFKA_TLS_CERT": str(cert), "KMQKAFKA_TLS_KEY": str(key)})
    return b, cert, {"bootstrap.servers": f"127.0.0.1:{b.tls_port}",
                     "security.protocol": "SSL", "ssl.ca.location": str(cert)}


def test_confluent_and_kafka_python_round_trip_over_tls(tmp_path):
    b, cert, common = tls_broker(tmp_path)
    tls = common["bootstrap.servers"]
    try:
        p = Producer({**common, "acks": "all"})
        offsets = []
        for i in range(100):
            p.produce("secure", key=b"k%d" % i, value=b"v%d" % i, headers=[("h", b"%d" % i)],
                      on_delivery=lambda e, m: offsets.append(m.offset()) if e is None else None)
        assert p.flush(20) == 0
        assert sorted(offsets) == list(range(100))

        c = Consumer({**common, "group.id": "tls-reader", "enable.auto.commit": False})
        md = c.list_topics("secure", timeout=10)
        # The SSL listener advertises itself, not the plaintext port.
        assert [br.port for br in md.brokers.values()] == [b.tls_port]
        c.assign([TopicPartition("secure", 0, 0)])
        got = []
        for _ in range(200):
            msg = c.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append((msg.key(), msg.value(), msg.headers()))
            if len(got) == 100:
                break
        c.close()
        assert got == [(b"k%d" % i, b"v%d" % i, [("h", b"%d" % i)]) for i in range(100)]

        from kafka import KafkaConsumer
        from kafka import TopicPartition as KTP

        kc = KafkaConsumer(bootstrap_servers=tls, security_protocol="SSL", ssl_cafile=str(cert),
                           ssl_check_hostname=False, consumer_timeout_ms=5000,
                           auto_offset_reset="earliest")
        kc.assign([KTP("secure", 0)])
        values = [m.value for m in kc]
        kc.close()
        assert values == [b"v%d" % i for i in range(100)]
    finally:
        b.stop()


def test_large_requests_and_responses_stay_encrypted(tmp_path):
    """Produce requests of 256 KiB+ and fetch responses of 64 KiB+ take the broker's direct
    socket paths on plain TCP; on TLS they must not (they went out unencrypted, and clients
    saw "wrong version number" or a frame size read from record bytes)."""
    import os

    b, _cert, common = tls_broker(tmp_path)
    try:
        values = [os.urandom(n) for n in (100, 70_000, 300_000, 900_000)]
        values += [os.urandom(100) for _ in range(3000)]  # many small: large fetch responses
        p = Producer({**common, "acks": "all", "linger.ms": 50, "message.max.bytes": 1_000_000})
        for v in values:
            p.produce("big-secure", v, partition=0)
        assert p.flush(60) == 0
        c = Consumer({**common, "group.id": "tls-big", "enable.auto.commit": False,
                      "fetch.max.bytes": 4_000_000})
        c.assign([TopicPartition("big-secure", 0, 0)])
        got = []
        for _ in range(240):
            for msg in c.consume(500, 0.5):
                assert msg.error() is None, msg.error()
                got.append(msg.value())
            if len(got) >= len(values):
                break
        c.close()
        assert got == values
    finally:
        b.stop()


def test_client_certificates_required_requested_or_not_asked(tmp_path):
    """KMQKAFKA_TLS_CLIENT_AUTH, as Kafka's ssl.client.auth: with ``required`` a client that
    shows no certificate signed by KMQKAFKA_TLS_CA is refused at the handshake."""
    import socket
    import ssl

    from conftest import HOST

    cert, key = make_self_signed(tmp_path)  # self-signed: it is its own CA too
    tls = {"KMQKAFKA_TLS_CERT": str(cert), "KMQKAFKA_TLS_KEY": str(key),
           "KMQKAFKA_TLS_CA": str(cert)}

    def api_versions_ok(port: int, with_cert: bool) -> bool:
        context = ssl.create_default_context(cafile=str(cert))
        if with_cert:
            context.load_cert_chain(str(cert), str(key))
        try:
            with socket.create_connection((HOST, port), timeout=5) as raw:
                with context.wrap_socket(raw, server_hostname=HOST) as sock:
                    # ApiVersions v0, correlation 7: any answer means the handshake held
                    sock.sendall(b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x07\xff\xff")
                    return len(sock.recv(4)) == 4
        except (ssl.SSLError, OSError):
            return False

    for mode, without in (("required", False), ("requested", True), ("none", True)):
        d = tmp_path / mode
        d.mkdir()
        b = start_broker(d, env={**tls, "KMQKAFKA_TLS_CLIENT_AUTH": mode})
        try:
            assert api_versions_ok(b.tls_port, with_cert=True), mode
            assert api_versions_ok(b.tls_port, with_cert=False) is without, mode
        finally:
            b.stop()
