"""The snapshot tar a leader streams to a lagging follower: its size is known before the first
byte (the frame announces it), it unpacks to the same tree, the sender never reads more than
one chunk ahead of what the socket took, and the follower unpacks it as it arrives, pausing its
link while the unpacking lags (no temporary tar on either side)."""
from __future__ import annotations

import io
import os
import tarfile
import threading
from pathlib import Path
from typing import Any, Callable

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionLost
from twisted.internet.testing import StringTransport

from kmqkafka.raft.snapshot_tar import CHUNK, TarPipe, plan, unpack
from kmqkafka.raft.transport import SNAPSHOT_TAR, _HEAD, _U64, _TarSender


def _tree(root: Path) -> dict[str, bytes]:
    files = {
        "snapshot.json": b'{"last_applied": 7}',
        "channels/kafka.t/00000000000000000001.log": os.urandom(2 * CHUNK + 123),
        "channels/kafka.t/00000000000000000001.index": b"",
        "channels/kafka.t~1/00000000000000000001.log": os.urandom(511),
        "channels/" + "k" * 150 + "/00000000000000000001.log": os.urandom(4096),
        "coordinator/offsets.log": os.urandom(70_000),
    }
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (root / "channels" / "empty-dir").mkdir()
    os.link(root / "coordinator/offsets.log", root / "coordinator/offsets-link.log")
    files["coordinator/offsets-link.log"] = files["coordinator/offsets.log"]
    return files


def _unpacked(data: bytes, dest: Path) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(dest, filter="data")
    return {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*") if p.is_file()}


def test_the_planned_size_is_exact_and_the_stream_unpacks_to_the_same_tree(tmp_path: Path) -> None:
    files = _tree(tmp_path / "snap")
    tar = plan(tmp_path / "snap")
    chunks = list(tar.chunks())
    data = b"".join(chunks)
    assert len(data) == tar.size
    assert all(len(c) <= 2 * CHUNK for c in chunks) and len(chunks) > 2
    assert _unpacked(data, tmp_path / "out") == files
    assert (tmp_path / "out" / "channels" / "empty-dir").is_dir()
    with tarfile.open(fileobj=io.BytesIO(data)) as t:  # the second name is a hard link
        assert t.getmember("./coordinator/offsets.log").islnk() != \
            t.getmember("./coordinator/offsets-link.log").islnk()


def test_a_file_that_changed_after_planning_fails_the_stream(tmp_path: Path) -> None:
    _tree(tmp_path / "snap")
    tar = plan(tmp_path / "snap")
    (tmp_path / "snap" / "coordinator" / "offsets.log").write_bytes(b"short")
    with pytest.raises(OSError):
        b"".join(tar.chunks())


class _Socket(StringTransport):
    """A transport whose buffer fills: it pauses its producer past ``limit`` bytes, as Twisted
    does, until the test drains it."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.aborted = False

    def write(self, data: bytes) -> None:
        super().write(data)
        if len(self.value()) > self.limit and self.producer is not None:
            self.producer.pauseProducing()

    def drain(self) -> bytes:
        out = self.value()
        self.clear()
        if self.producer is not None:
            self.producer.resumeProducing()
        return out

    def abortConnection(self) -> None:
        self.aborted = True


class _ManualIO:
    """``run_io`` whose calls run only when the test says so, like a busy I/O thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[Callable[..., Any], tuple, Deferred]] = []

    def __call__(self, f: Callable[..., Any], *args: Any) -> Deferred:
        d: Deferred = Deferred()
        self.calls.append((f, args, d))
        return d

    def run_one(self) -> None:
        f, args, d = self.calls.pop(0)
        try:
            result = f(*args)
        except Exception as e:  # noqa: BLE001 - handed to the Deferred, as a thread pool does
            d.errback(e)
        else:
            d.callback(result)


def test_the_sender_reads_one_chunk_ahead_of_the_socket_and_sends_it_all(tmp_path: Path) -> None:
    files = _tree(tmp_path / "snap")
    tar = plan(tmp_path / "snap")
    sock, io_ = _Socket(limit=64 * 1024), _ManualIO()
    done = _TarSender(tar, sock, io_).start()
    received = bytearray(sock.drain())
    assert bytes(received) == _HEAD.pack(9, SNAPSHOT_TAR) + _U64.pack(tar.size)
    received.clear()
    for _ in range(100):
        if done.called:
            break
        assert len(io_.calls) <= 1  # one read at a time
        if io_.calls:
            io_.run_one()
        assert len(sock.value()) <= 2 * CHUNK  # the socket's chunk plus at most one ahead
        received += sock.drain()
    assert done.called and not io_.calls
    assert len(received) == tar.size
    assert _unpacked(bytes(received), tmp_path / "out") == files


def test_a_follower_that_goes_away_stops_the_reads_and_closes_the_files(tmp_path: Path) -> None:
    _tree(tmp_path / "snap")
    tar = plan(tmp_path / "snap")
    sock, io_ = _Socket(limit=64 * 1024), _ManualIO()
    sender = _TarSender(tar, sock, io_)
    done = sender.start()
    io_.run_one()  # a first chunk goes out; the next read is queued
    sender.stopProducing()
    failures: list = []
    done.addErrback(failures.append)
    assert failures and failures[0].check(ConnectionLost)
    while io_.calls:
        io_.run_one()  # the queued read, then the generator's close
    assert sender._chunks.gi_frame is None  # closed: its open file is closed with it


def test_a_failed_read_aborts_the_connection(tmp_path: Path) -> None:
    _tree(tmp_path / "snap")
    tar = plan(tmp_path / "snap")
    (tmp_path / "snap" / "channels" / "kafka.t" / "00000000000000000001.log").unlink()
    sock, io_ = _Socket(limit=1 << 30), _ManualIO()
    done = _TarSender(tar, sock, io_).start()
    failures: list = []
    done.addErrback(failures.append)
    while io_.calls and not failures:
        io_.run_one()
    assert failures and failures[0].check(OSError) and sock.aborted


class _Reactor:
    """``callFromThread`` for a test with no reactor running: calls are kept and run later."""

    def __init__(self) -> None:
        self.calls: list = []
        self.lock = threading.Lock()

    def __call__(self, f: Callable[..., Any], *args: Any) -> None:
        with self.lock:
            self.calls.append((f, args))

    def run(self) -> None:
        with self.lock:
            calls, self.calls = self.calls, []
        for f, args in calls:
            f(*args)


def _unpacking(pipe: TarPipe, final: Path) -> tuple[threading.Thread, list]:
    """``unpack`` on a thread of its own, as the follower runs it; its error lands in the list."""
    errors: list = []

    def run() -> None:
        try:
            unpack(pipe, final)
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def test_a_follower_unpacks_the_stream_as_it_arrives_pausing_its_link_when_behind(tmp_path):
    files = _tree(tmp_path / "snap")
    data = b"".join(plan(tmp_path / "snap").chunks())
    events: list[str] = []
    reactor = _Reactor()
    pipe = TarPipe(pause=lambda: events.append("pause"), resume=lambda: events.append("resume"),
                   call_in_reactor=reactor, high=256 * 1024, low=64 * 1024)
    final = tmp_path / "snapshots" / f"{9:020d}"
    final.parent.mkdir()

    for pos in range(0, len(data), 100_000):  # arrives before the reader starts: it pauses
        pipe.write(data[pos:pos + 100_000])
    pipe.close()
    assert events[:1] == ["pause"]
    thread, errors = _unpacking(pipe, final)
    thread.join(30)
    reactor.run()
    assert not errors and not thread.is_alive()
    assert events == ["pause", "resume"]
    got = {str(p.relative_to(final)): p.read_bytes() for p in final.rglob("*") if p.is_file()}
    assert got == files
    assert not (final.parent / (final.name + ".part")).exists()


def test_an_aborted_transfer_leaves_no_partial_tree(tmp_path):
    _tree(tmp_path / "snap")
    data = b"".join(plan(tmp_path / "snap").chunks())
    reactor = _Reactor()
    pipe = TarPipe(pause=lambda: None, resume=lambda: None, call_in_reactor=reactor)
    final = tmp_path / f"{9:020d}"

    thread, errors = _unpacking(pipe, final)
    pipe.write(data[:len(data) // 2])
    pipe.abort()  # the link went away half way
    thread.join(30)
    assert errors and isinstance(errors[0], OSError)
    assert not final.exists() and not (tmp_path / (final.name + ".part")).exists()


def _fetching(tmp_path: Path):
    """A transport on a fake reactor, and a snapshot download from node 2 it has started."""
    import random
    from types import SimpleNamespace

    from twisted.internet.testing import MemoryReactorClock

    from kmqkafka.raft.messages import Snapshot, SnapshotMeta
    from kmqkafka.raft.transport import RaftTransport

    peers = {1: ("127.0.0.1", 1001), 2: ("127.0.0.1", 1002)}
    reactor = MemoryReactorClock()
    t = RaftTransport(1, peers[1], peers, reactor, random.Random(0), run_io=None)
    t.start(SimpleNamespace(snapshot_dir=tmp_path))
    snap = Snapshot(SnapshotMeta(9, 1, frozenset({1, 2})), b"kmq-snapshot:9")
    return reactor, t.fetch_snapshot(2, snap)


def test_a_download_that_moves_no_byte_fails_after_the_stall_timeout(tmp_path: Path) -> None:
    """A frozen leader (or a link that hangs without closing) must not hold the follower's
    catch-up forever: the next leader's snapshot can only be fetched once this one gave up."""
    from kmqkafka.raft.errors import TransportError
    from kmqkafka.raft.transport import FETCH_STALL_S

    reactor, d = _fetching(tmp_path)
    failures: list = []
    d.addErrback(failures.append)
    reactor.advance(FETCH_STALL_S - 1)
    assert not failures
    reactor.advance(1)
    assert failures and failures[0].check(TransportError)
    assert "no snapshot data" in failures[0].getErrorMessage()


def test_a_cancelled_download_stops(tmp_path: Path) -> None:
    reactor, d = _fetching(tmp_path)
    failures: list = []
    d.addErrback(failures.append)
    d.cancel()
    assert failures
    stall_timers = [c for c in reactor.getDelayedCalls() if "_check_progress" in repr(c.func)]
    assert not stall_timers  # the stall timer went with it
