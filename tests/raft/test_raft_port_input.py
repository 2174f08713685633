"""What reaches a node's Raft port that is not one of its peers' frames fails alone.

A stranger's FORWARD frame whose command no member can decode was once proposed as it came:
it committed, every member's apply raised on it, and the whole cluster stopped applying for
good (a replay meets the same entry). The leader now refuses such a command before it reaches
the log (``check_readable``; FORWARD_ERR back). Frames of a known kind whose payload has a
size that kind never has close the link, as any malformed frame does, without acting on it.
"""
from __future__ import annotations

import json
import random
import socket
import struct
from types import SimpleNamespace

import pytest
from twisted.internet.testing import MemoryReactorClock, StringTransport

from kmqkafka.raft.errors import MalformedCommand
from kmqkafka.raft.proposer import _GROUP, check_readable
from kmqkafka.raft.transport import (
    FORWARD, FORWARD_ERR, FORWARD_OK, SNAPSHOT_GET, SNAPSHOT_TAR, RaftTransport, _HEAD, _U64,
)
from kmqkafka.store import commands as c

from tests.raft.test_cluster import produce, read_all, start_cluster, wait_leader

PEERS = {1: ("127.0.0.1", 1001), 2: ("127.0.0.1", 1002)}
_LEN = struct.Struct(">I")


def group(*parts: bytes) -> bytes:
    return bytes([_GROUP]) + b"".join(_LEN.pack(len(p)) + p for p in parts)


APPEND = c.encode(c.Append("kafka.t", 1_700_000_000_000, b"\x00" * 70))
CREATE = c.encode(c.CreateChannel("kafka.t"))


@pytest.mark.parametrize("data", [APPEND, CREATE, group(APPEND, CREATE), group(CREATE)])
def test_commands_a_member_encodes_are_readable(data: bytes) -> None:
    check_readable(memoryview(data))


def _append_head(head: dict) -> bytes:
    raw = json.dumps(head).encode()
    return bytes([c.Append.tag]) + _LEN.pack(len(raw)) + raw + b"batch"


@pytest.mark.parametrize("data", [
    b"", b"\x04", b"\xfb" + bytes(40),                    # too short, unknown tag
    bytes([c.Append.tag]) + _LEN.pack(1000) + b"{}",      # head runs past the entry
    bytes([c.Append.tag]) + _LEN.pack(3) + b"{\xff}",     # head not JSON
    _append_head({"now_ms": 1}),                          # head without a name
    CREATE[:1] + _LEN.pack(24) + b'{"name": "x", "oops": 2}',  # a field it does not have
    group(APPEND)[:-5],                                   # a part runs past the entry
    group(APPEND, b"\xfb" + bytes(10)),                   # one bad part
])
def test_what_no_member_could_apply_is_not_readable(data: bytes) -> None:
    with pytest.raises(ValueError):
        check_readable(memoryview(data))


def _incoming(forward=None) -> tuple[object, list]:
    handled: list = []

    def handle_forward(data: bytes) -> tuple[int, int]:
        handled.append(bytes(data))
        if forward is not None:
            raise forward
        return 5, 2

    t = RaftTransport(1, PEERS[1], PEERS, MemoryReactorClock(), random.Random(0), run_io=None)
    t.start(SimpleNamespace(receive=lambda m: handled.append(m), handle_forward=handle_forward,
                            hold_snapshot=lambda index: handled.append(index)))
    link = t._reactor.tcpServers[0][1].buildProtocol(None)
    link.makeConnection(StringTransport())
    return link, handled


@pytest.mark.parametrize("kind, payload", [
    (FORWARD, b"1234567"), (FORWARD_OK, bytes(23)), (FORWARD_OK, bytes(25)),
    (FORWARD_ERR, bytes(15)), (SNAPSHOT_GET, b""), (SNAPSHOT_GET, bytes(9)),
    (SNAPSHOT_TAR, bytes(4)), (SNAPSHOT_TAR, bytes(12)),
])
def test_a_known_kind_with_a_size_it_never_has_closes_the_link_unread(kind, payload) -> None:
    link, handled = _incoming()
    link.dataReceived(_HEAD.pack(len(payload) + 1, kind) + payload)
    assert link.transport.disconnecting and handled == []


def test_a_forwarded_command_the_leader_refuses_is_answered_forward_err() -> None:
    link, handled = _incoming(MalformedCommand("malformed command: unknown command tag 251"))
    link.dataReceived(_HEAD.pack(1 + 8 + 3, FORWARD) + _U64.pack(77) + b"\xfb\x00\x01")
    assert handled == [b"\xfb\x00\x01"]
    out = link.transport.value()
    length, kind = _HEAD.unpack_from(out)
    assert kind == FORWARD_ERR and out[5:13] == _U64.pack(77)
    assert out[13:21] == _U64.pack(0)  # no leader hint: asking again elsewhere will not help
    assert b"unknown command tag" in out[21:4 + length]
    assert not link.transport.disconnecting


@pytest.mark.timeout(120)
def test_a_stranger_on_the_raft_ports_cannot_stop_the_cluster(tmp_path) -> None:
    ids = [1, 2, 3]
    brokers: dict = {}
    try:
        raft_ports = start_cluster(tmp_path, ids, brokers)
        leader = wait_leader(brokers)
        assert produce(brokers[leader].bootstrap, "kept", [b"a%d" % i for i in range(20)]) \
            == list(range(20))

        # What no member could apply, forwarded to the leader: refused, never proposed.
        with socket.create_connection(("127.0.0.1", raft_ports[leader]), timeout=5) as s:
            s.sendall(_HEAD.pack(1 + 8 + 41, FORWARD) + _U64.pack(9) + b"\xfb" + bytes(40))
            head = s.recv(5)
            assert _HEAD.unpack(head)[1] == FORWARD_ERR
        # Random frames of every kind to every node.
        rng = random.Random(3)
        for n in range(300):
            payload = rng.randbytes(rng.choice([0, 4, 8, 16, 24, 41, 200]))
            frame = _HEAD.pack(len(payload) + 1, rng.randrange(1, 9)) + payload
            if n % 10 == 0:
                frame = rng.randbytes(64)
            with socket.create_connection(
                    ("127.0.0.1", raft_ports[rng.choice(ids)]), timeout=5) as s:
                s.sendall(frame)
                s.settimeout(0.05)
                try:
                    s.recv(100)
                except OSError:
                    pass

        leader = wait_leader(brokers)
        assert produce(brokers[leader].bootstrap, "kept", [b"b%d" % i for i in range(20)]) \
            == list(range(20, 40))
        expect = list(enumerate([b"a%d" % i for i in range(20)] + [b"b%d" % i for i in range(20)]))
        for i, b in brokers.items():
            assert read_all(b.bootstrap, "kept", 40) == expect, f"node {i}"
        for i, b in brokers.items():
            log = b.log()
            for bad in ("Unhandled Error", "while handling timed call", "Traceback"):
                assert bad not in log, f"node {i}: {bad}\n{log[-3000:]}"
    finally:
        for b in brokers.values():
            if b.proc.poll() is None:
                b.stop()
