"""What an operator sees from outside the daemon: start-up refusals and the Raft port's TLS.

Each test runs the real ``twistd -n kmqkafka`` on 127.0.0.1 and bounds every wait.
"""
from __future__ import annotations

import socket
import ssl
import subprocess
from pathlib import Path

import pytest
from confluent_kafka import Producer

from conftest import TWISTD, base_env, free_port, make_self_signed, start_broker


def run_twistd(tmp_path: Path, env: dict[str, str], args: tuple[str, ...] = (),
               timeout: float = 20) -> tuple[int, list[str]]:
    """Run a daemon expected to refuse start-up: (exit status, non-blank output lines).

    A daemon that hangs instead of exiting fails the test at ``timeout``."""
    full = base_env()
    full.update({"KMQKAFKA_HTTP_PORT": str(free_port()), "KMQKAFKA_HTTP_HOST": "127.0.0.1",
                 "CONNECTORS_KAFKA_BIND_HOST": "127.0.0.1",
                 "CONNECTORS_KAFKA_PORT": str(free_port()),
                 "CONNECTORS_KAFKA_TLS_PORT": str(free_port()),
                 "KMQKAFKA_DATA_DIR": str(tmp_path / "d")})
    full.update(env)
    try:
        proc = subprocess.run([str(TWISTD), "-n", "--pidfile=", "kmqkafka", *args],
                              cwd=tmp_path, env=full, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"daemon did not exit within {timeout}s: {e.output!r}") from None
    lines = [l for l in (proc.stdout + proc.stderr).decode().splitlines() if l.strip()]
    return proc.returncode, lines


def _tls_case(tmp_path: Path, case: str) -> tuple[dict[str, str], str]:
    cert, key = make_self_signed(tmp_path)
    env = {"CONNECTORS_KAFKA_ENABLE": "true", "KMQKAFKA_TLS_CERT": str(cert),
           "KMQKAFKA_TLS_KEY": str(key)}
    if case == "missing cert":
        env["KMQKAFKA_TLS_CERT"] = str(tmp_path / "absent.pem")
        return env, "KMQKAFKA_TLS_CERT"
    if case == "encrypted key":  # OpenSSL used to ask for the pass phrase on the terminal
        env["KMQKAFKA_TLS_KEY"] = str(make_self_signed(tmp_path, passphrase=b"secret")[1])
        return env, "KMQKAFKA_TLS_KEY"
    if case == "expired certificate":
        env["KMQKAFKA_TLS_CERT"] = str(make_self_signed(tmp_path, expired=True)[0])
        env["KMQKAFKA_TLS_KEY"] = str(tmp_path / "server.key")
        return env, "KMQKAFKA_TLS_CERT"
    if case == "key of another certificate":
        other = tmp_path / "other"
        other.mkdir()
        env["KMQKAFKA_TLS_KEY"] = str(make_self_signed(other)[1])
        return env, "KMQKAFKA_TLS_KEY"
    ca = tmp_path / "ca.pem"
    ca.write_text("no certificate in here\n")
    env["KMQKAFKA_TLS_CA"] = str(ca)
    return env, "KMQKAFKA_TLS_CA"


@pytest.mark.parametrize("case", ["missing cert", "key of another certificate",
                                  "CA file without a certificate", "encrypted key",
                                  "expired certificate"])
def test_bad_tls_material_exits_2_with_one_line(tmp_path: Path, case: str) -> None:
    """Bad TLS material used to print its line and then hang forever (a started Raft thread
    kept the process alive; a CA file with no certificate gave a traceback): systemd would
    never see the failure."""
    env, setting = _tls_case(tmp_path, case)
    status, lines = run_twistd(tmp_path, env)
    assert status == 2, lines
    assert len(lines) == 1 and setting in lines[0], lines


def test_bad_file_value_stops_start_up_even_behind_the_environment(tmp_path: Path) -> None:
    """A bad value is an error wherever it is, not only when its source wins precedence."""
    config = tmp_path / "k.toml"
    config.write_text('[kafka]\nmax_groups = "many"\n')
    status, lines = run_twistd(tmp_path, {"CONNECTORS_KAFKA_MAX_GROUPS": "50"},
                               ("--config", str(config)))
    assert status == 2, lines
    assert len(lines) == 1 and "CONNECTORS_KAFKA_MAX_GROUPS" in lines[0] and "many" in lines[0]


def test_raft_port_refuses_a_peer_without_a_certificate_when_a_ca_is_set(tmp_path: Path) -> None:
    """raft/transport.py promises both sides verify each other against KMQKAFKA_TLS_CA; a TLS
    client with no certificate used to be accepted on the Raft port."""
    cert, key = make_self_signed(tmp_path)  # self-signed: it is also the CA
    raft_port, kafka_port = free_port(), free_port()
    broker = start_broker(tmp_path, env={
        "KMQKAFKA_PEERS": f"1=127.0.0.1:{raft_port}/127.0.0.1:{kafka_port}",
        "CONNECTORS_KAFKA_PORT": str(kafka_port), "KMQKAFKA_TLS_CERT": str(cert),
        "KMQKAFKA_TLS_KEY": str(key), "KMQKAFKA_TLS_CA": str(cert)})
    try:
        anonymous = ssl.create_default_context(cafile=str(cert))
        with socket.create_connection(("127.0.0.1", raft_port), timeout=5) as raw:
            with anonymous.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.settimeout(3)
                with pytest.raises(ssl.SSLError, match="CERTIFICATE_REQUIRED"):
                    tls.recv(1)  # TLS 1.3: the refusal arrives after the client's handshake
        peer = ssl.create_default_context(cafile=str(cert))
        peer.load_cert_chain(str(cert), str(key))
        with socket.create_connection(("127.0.0.1", raft_port), timeout=5) as raw:
            with peer.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.settimeout(0.5)
                with pytest.raises(TimeoutError):
                    tls.recv(1)  # accepted: the link stays open, waiting for a frame
        # The Kafka TLS listener keeps client certificates optional (etc/kmqkafka.toml).
        p = Producer({"bootstrap.servers": f"127.0.0.1:{broker.tls_port}",
                      "security.protocol": "SSL", "ssl.ca.location": str(cert)})
        p.produce("anon", b"v")
        assert p.flush(15) == 0
    finally:
        broker.stop()


def test_a_disk_refusing_writes_shows_on_health_until_it_takes_them_again(
        tmp_path: Path) -> None:
    """Files may not grow past 1 MiB (RLIMIT_FSIZE: EFBIG, as a full disk gives ENOSPC): the
    produce that would grow the segment is KAFKA_STORAGE_ERROR, /health says 503 meanwhile
    (it said 200 while every produce was refused), reads go on, and a new file takes writes."""
    import os
    import sys
    import time

    from confluent_kafka import Consumer, KafkaError, TopicPartition

    limit = ("import resource, os, sys; resource.setrlimit(resource.RLIMIT_FSIZE, "
             "(1 << 20, 1 << 20)); os.execv(sys.argv[1], sys.argv[1:])")
    b = start_broker(tmp_path, prefix=[sys.executable, "-c", limit])
    try:
        p = Producer({"bootstrap.servers": b.bootstrap, "retries": 0, "linger.ms": 0,
                      "message.timeout.ms": 10000})
        errors: list = []
        for _ in range(15):
            p.produce("full", os.urandom(100_000), partition=0,
                      on_delivery=lambda err, _msg: errors.append(err))
            p.flush(15)
        refused = [e for e in errors if e is not None]
        assert refused and {e.code() for e in refused} == {KafkaError.KAFKA_STORAGE_ERROR}
        assert b.health() == 503
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g"})
        try:
            c.assign([TopicPartition("full", 0, 0)])
            first = c.consume(1, 10)
            assert first and first[0].error() is None and first[0].offset() == 0
        finally:
            c.close()
        p.produce("fresh", b"x", partition=0, on_delivery=lambda err, _msg: errors.append(err))
        p.flush(15)
        assert errors[-1] is None
        deadline = time.monotonic() + 20
        while b.health() != 200 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert b.health() == 200
    finally:
        b.stop()
