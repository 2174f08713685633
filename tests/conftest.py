"""Shared fixtures: a real ``twistd -n kmqkafka`` daemon on free loopback ports.

``start_broker(tmp_path, env=..., args=...)`` starts one and waits (bounded) for ``/health`` to
answer 200; the returned ``BrokerProcess`` knows its ports and can be stopped with SIGTERM,
killed with SIGKILL (``kill()``), or restarted on the same data dir and ports (``restart()``).
The ``broker`` fixture is a Kafka-enabled daemon that is always stopped at the end of the test.
Every wait is bounded; everything binds 127.0.0.1 only.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import pytest

HOST = "127.0.0.1"
TWISTD = Path(sys.executable).parent / "twistd"
_OWN_PREFIXES = ("CONNECTORS_KAFKA_", "KMQKAFKA_")


def peak_rss_kb(pid: int) -> int:
    """A process's resident-set high-water mark as the kernel keeps it (VmHWM), in kB: it
    catches peaks that sampling the RSS would miss."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmHWM for process {pid}")


def resident_bytes(path: Path, start: int = 0, end: int | None = None) -> int:
    """How many bytes of [start, end) of ``path`` sit in the page cache (whole pages), as
    the kernel reports it (mincore on a private mapping of the file, which copies nothing)."""
    import ctypes
    import mmap

    size = path.stat().st_size
    end = size if end is None else min(end, size)
    if end <= start:
        return 0
    page = mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
        try:
            vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
            addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
            if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
            return sum(vec[i] & 1 for i in range(start // page, (end + page - 1) // page)) * page
        finally:
            del addr
            mm.close()


def on_tmpfs(path: Path) -> bool:
    """Whether ``path`` lies on tmpfs, whose pages are memory: the kernel never drops them."""
    best, kind = "", ""
    with open("/proc/mounts") as mounts:
        for line in mounts:
            _dev, mnt, fstype = line.split()[:3]
            if str(path).startswith(mnt) and len(mnt) > len(best):
                best, kind = mnt, fstype
    return kind == "tmpfs"


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind port 0, read it, close), and
    not one this process handed out before: the kernel may offer a just-closed port again,
    and two nodes of one test were once given the same TLS port."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no fresh free port in 100 tries")


def base_env() -> dict[str, str]:
    """The test process environment without any kmqkafka setting leaking in."""
    return {k: v for k, v in os.environ.items() if not k.startswith(_OWN_PREFIXES)}


@dataclass
class BrokerProcess:
    """A running daemon and how to reach it."""

    proc: subprocess.Popen[bytes]
    data_dir: Path
    kafka_port: int
    tls_port: int
    http_port: int
    log_path: Path
    env: dict[str, str]
    args: list[str]
    cwd: Path
    host: str = HOST
    history: list[subprocess.Popen[bytes]] = field(default_factory=list)
    prefix: tuple[str, ...] = ()  # the wrapper command it runs under, again on restart

    @property
    def bootstrap(self) -> str:
        """``host:port`` of the plaintext Kafka listener."""
        return f"{self.host}:{self.kafka_port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        """Everything the daemon has written to stdout/stderr so far."""
        return self.log_path.read_text(errors="replace")

    def health(self, timeout: float = 2.0) -> int:
        """HTTP status of ``/health`` (0 when nothing answers)."""
        return http_status(self.http_port, "/health", timeout)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait; returns the exit status (SIGKILLs and fails if it hangs)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise AssertionError(f"daemon ignored SIGTERM for {timeout}s:\n{self.log()}")
        return self.proc.returncode

    def kill(self) -> int:
        """SIGKILL (crash simulation) and reap; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait(10)

    def restart(self, timeout: float = 30.0) -> None:
        """Start a new daemon with the same settings, data dir and ports (after stop/kill)."""
        assert self.proc.poll() is not None, "stop() or kill() the daemon first"
        self.history.append(self.proc)
        self.proc = _spawn(self.cwd, self.env, self.args, self.log_path, self.prefix)
        _wait_healthy(self, timeout)


def http_status(port: int, path: str, timeout: float = 2.0) -> int:
    """Status code of GET http://127.0.0.1:port/path, 0 if the connection fails."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, urllib.error.URLError):
        return 0


def http_get(port: int, path: str, timeout: float = 5.0) -> bytes:
    """Body of GET http://127.0.0.1:port/path (raises on failure)."""
    with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=timeout) as r:
        return r.read()


def _spawn(cwd: Path, env: Mapping[str, str], args: Sequence[str], log_path: Path,
           prefix: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    log = open(log_path, "ab")
    try:
        return subprocess.Popen(
            [*prefix, str(TWISTD), "-n", "--pidfile=", "kmqkafka", *args],
            cwd=cwd, env=dict(env), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    finally:
        log.close()


def _wait_healthy(broker: BrokerProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if broker.proc.poll() is not None:
            raise AssertionError(
                f"daemon exited with {broker.proc.returncode} before /health:\n{broker.log()}"
            )
        if broker.health(timeout=1.0) == 200:
            return
        time.sleep(0.05)
    broker.kill()
    raise AssertionError(f"/health not 200 within {timeout}s:\n{broker.log()}")


def start_broker(
    tmp_path: Path,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    kafka: bool = True,
    data_dir: Path | None = None,
    wait: bool = True,
    timeout: float = 30.0,
    prefix: Sequence[str] = (),
) -> BrokerProcess:
    """Start ``twistd -n kmqkafka`` on free 127.0.0.1 ports with a data dir under ``tmp_path``.

    ``env`` entries override the defaults set here (ports, hosts, data dir, Kafka enabled);
    ``args`` are appended to the command line, ``prefix`` goes before it (a wrapper). With ``wait`` (default) returns once ``/health``
    is 200, raising (with the daemon's log) if it exits or is not healthy within ``timeout``.
    The caller must ``stop()`` or ``kill()`` it; prefer the ``broker`` fixture when possible.
    """
    data_dir = data_dir or tmp_path / "data"
    kafka_port, tls_port, http_port = free_port(), free_port(), free_port()
    full_env = base_env()
    full_env.update({
        "CONNECTORS_KAFKA_ENABLE": "true" if kafka else "false",
        "CONNECTORS_KAFKA_PORT": str(kafka_port),
        "CONNECTORS_KAFKA_TLS_PORT": str(tls_port),
        "CONNECTORS_KAFKA_BIND_HOST": HOST,
        "KMQKAFKA_HTTP_PORT": str(http_port),
        "KMQKAFKA_HTTP_HOST": HOST,
        "KMQKAFKA_DATA_DIR": str(data_dir),
        # 128 MiB of zeros per cluster node: tests that want them ask (test_kafka_cluster).
        "KMQKAFKA_RAFT_PREALLOCATE": "false",
    })
    full_env.update(env or {})
    kafka_port = int(full_env["CONNECTORS_KAFKA_PORT"])
    tls_port = int(full_env["CONNECTORS_KAFKA_TLS_PORT"])
    http_port = int(full_env["KMQKAFKA_HTTP_PORT"])
    log_path = tmp_path / f"kmqkafka-{kafka_port}.log"
    broker = BrokerProcess(
        proc=_spawn(tmp_path, full_env, list(args), log_path, prefix),
        data_dir=data_dir, kafka_port=kafka_port, tls_port=tls_port, http_port=http_port,
        log_path=log_path, env=full_env, args=list(args), cwd=tmp_path, prefix=tuple(prefix),
    )
    if wait:
        _wait_healthy(broker, timeout)
    return broker


def make_self_signed(directory: Path, *, expired: bool = False,
                     passphrase: bytes | None = None) -> tuple[Path, Path]:
    """A self-signed EC certificate for 127.0.0.1/localhost: (cert.pem, key.pem) in ``directory``
    (``expired``: it ran out yesterday; ``passphrase``: the key is encrypted with it)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kmqkafka-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=3 if expired else 0, minutes=5))
        .not_valid_after(now + datetime.timedelta(days=-1 if expired else 1))
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]),
            critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "server.pem", directory / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(passphrase) if passphrase
        else serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory,
                  request: pytest.FixtureRequest) -> Iterator[BrokerProcess]:
    """One daemon for a whole test module, for tests that neither stop nor kill it."""
    b = start_broker(tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2]))
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A Kafka-enabled daemon on free loopback ports, stopped (SIGTERM, then SIGKILL) at the end."""
    b = start_broker(tmp_path)
    try:
        yield b
    finally:
        if b.proc.poll() is None:
            b.proc.send_signal(signal.SIGTERM)
            try:
                b.proc.wait(20)
            except subprocess.TimeoutExpired:
                b.proc.kill()
                b.proc.wait(10)


def auth_errors(common: dict) -> list:
    """The errors a confluent-kafka client reports while it tries to connect with ``common``
    for up to 5 s (it stops at the first): empty when the connection was accepted."""
    from confluent_kafka import Producer

    errors: list = []
    p = Producer({**common, "error_cb": errors.append, "reconnect.backoff.ms": 500})
    for _ in range(20):
        p.poll(0.25)
        if errors:
            break
    return errors


def authenticates(common: dict, topic: str = "auth-check") -> bool:
    """A confluent-kafka producer with ``common`` gets one record acknowledged within 10 s."""
    from confluent_kafka import Producer

    p = Producer({**common, "acks": "all", "message.timeout.ms": 10000})
    p.produce(topic, value=b"x")
    return p.flush(12) == 0


def round_trip(common: dict, topic: str, n: int = 20) -> list[bytes]:
    """confluent-kafka with ``common``: ``n`` records produced (acks=all), then read back by a
    consumer group from the start; returns the values read."""
    from confluent_kafka import Consumer, Producer

    p = Producer({**common, "acks": "all"})
    for i in range(n):
        p.produce(topic, value=b"v%d" % i)
    assert p.flush(20) == 0
    c = Consumer({**common, "group.id": "g-" + topic, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got: list[bytes] = []
    for _ in range(60):
        msg = c.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(msg.value())
        if len(got) == n:
            break
    c.close()
    return got


def kafka_python_round_trip(common: dict, topic: str, n: int) -> list[bytes]:
    """``round_trip`` with kafka-python (``common`` as KafkaProducer/KafkaConsumer kwargs)."""
    from kafka import KafkaConsumer, KafkaProducer

    p = KafkaProducer(acks="all", **common)
    for i in range(n):
        p.send(topic, b"v%d" % i).get(timeout=10)
    p.close()
    c = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=10000, **common)
    got: list[bytes] = []
    for m in c:
        got.append(m.value)
        if len(got) == n:
            break
    c.close()
    return got
