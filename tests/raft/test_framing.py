"""Raft link framing without copies: frames parsed from immutable bytes only (large entry data
kept as views of what arrived), and large writes handed to the socket uncopied with the
remainder queued in order (``net/sendmsg.py``)."""
from __future__ import annotations

import random
import socket
from types import SimpleNamespace

from twisted.internet import main, tcp
from twisted.internet.testing import MemoryReactorClock, StringTransport

from kmqkafka.net.sendmsg import DIRECT_MIN, _after, gather_writes, plain_tcp, write_parts
from kmqkafka.raft.messages import (SHARE_MIN, Append, Entry, EntryKind, Gather, Heartbeat,
                                    decode, encode)
from kmqkafka.raft.transport import RAFT, RaftTransport, _HEAD

PEERS = {1: ("127.0.0.1", 1001), 2: ("127.0.0.1", 1002)}


def _incoming(t: RaftTransport) -> object:
    reactor = t._reactor
    link = reactor.tcpServers[0][1].buildProtocol(None)
    link.makeConnection(StringTransport())
    return link


def _messages(rng: random.Random) -> list:
    big = [rng.randbytes(SHARE_MIN + rng.randrange(50_000)) for _ in range(3)]
    return [
        Heartbeat(frm=2, to=1, term=3, commit=7),
        Append(frm=2, to=1, term=3, prev_index=4, prev_term=3,
               entries=(Entry(5, 3, EntryKind.NORMAL, big[0]), Entry(6, 3, EntryKind.NORMAL, b"s"),
                        Entry(7, 3, EntryKind.NORMAL, big[1])), commit=5),
        Append(frm=2, to=1, term=3, prev_index=7, prev_term=3,
               entries=(Entry(8, 3, EntryKind.NORMAL, Gather([b"head", big[2]])),), commit=7),
        Heartbeat(frm=2, to=1, term=3, commit=8),
    ]


def _frame(m: object) -> bytes:
    payload = encode(m)
    return _HEAD.pack(len(payload) + 1, RAFT) + payload


def test_frames_split_anywhere_arrive_whole_and_large_entries_are_shared_views():
    rng = random.Random(7)
    for trial in range(30):
        sent = _messages(rng)
        stream = b"".join(_frame(m) for m in sent)
        got: list = []
        t = RaftTransport(1, PEERS[1], PEERS, MemoryReactorClock(), random.Random(0),
                          run_io=None)
        t.start(SimpleNamespace(receive=got.append))
        link = _incoming(t)
        pos = 0
        while pos < len(stream):   # chunks of 1 byte up to 100 KB, as TCP may cut them
            n = rng.choice([1, 2, 5, 7, 4096, 65536, 100_000])
            link.dataReceived(stream[pos:pos + n])
            pos += n
        assert [type(m) for m in got] == [type(m) for m in sent]
        for m_got, m_sent in zip(got, sent):
            assert encode(m_got) == encode(m_sent)
        big = [e for m in got if isinstance(m, Append) for e in m.entries
               if len(e.data) >= SHARE_MIN]
        assert big and all(type(e.data) is memoryview and e.data.readonly for e in big)
        small = [e for m in got if isinstance(m, Append) for e in m.entries
                 if len(e.data) < SHARE_MIN]
        assert all(type(e.data) is bytes for e in small)


def test_decode_copies_unless_sharing_immutable_bytes():
    m = _messages(random.Random(1))[1]
    wire = encode(m)
    shared = decode(memoryview(wire), share=True)
    assert type(shared.entries[0].data) is memoryview
    held = bytearray(wire)  # a mutable buffer may change later: never shared
    copied = decode(memoryview(held), share=True)
    assert type(copied.entries[0].data) is bytes
    held[:] = b"\0" * len(held)
    assert copied.entries[0].data == m.entries[0].data


class _Transport(tcp.Connection):
    """A Twisted TCP connection as far as ``write_parts`` looks at one, over a real socket
    (no reactor: ``__init__`` is its own)."""

    TLS = False

    def __init__(self, sock: socket.socket) -> None:  # noqa: super().__init__ needs a reactor
        self.socket = sock
        self.connected, self.disconnecting = True, False
        self._tempDataLen, self.dataBuffer, self.offset = 0, b"", 0
        self.queued: list[bytes] = []

    def write(self, data: bytes) -> None:
        assert type(data) is bytes
        self.queued.append(data)
        self._tempDataLen += len(data)

    def loseConnection(self) -> None:
        self.connected = False


def _drain(sock: socket.socket) -> bytes:
    out = bytearray()
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            return bytes(out)
        if not chunk:
            return bytes(out)
        out += chunk


def _small_buffer_pair() -> tuple[socket.socket, socket.socket]:
    """A non-blocking socket pair whose sender fills after 64 KiB."""
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
    a.setblocking(False)
    b.setblocking(False)
    return a, b


def test_write_parts_sends_what_fits_and_queues_the_rest_in_order():
    a, b = _small_buffer_pair()
    tr = _Transport(a)
    rng = random.Random(3)
    parts = [b"head", rng.randbytes(3 << 20), memoryview(rng.randbytes(500_000))[7:], b"tail"]
    whole = b"".join(parts)
    write_parts(tr, parts, len(whole))
    direct = _drain(b)
    assert 0 < len(direct) < len(whole)            # the socket took some, not all
    assert direct + b"".join(tr.queued) == whole    # the rest queued, once, in order
    # Something queued now: the next write must go behind it, not to the socket.
    more = rng.randbytes(DIRECT_MIN * 2)
    write_parts(tr, [more], len(more))
    assert _drain(b) == b"" and tr.queued[-1] == more
    a.close()
    b.close()


class _GatherTransport(tcp.Connection):
    """A Twisted TCP connection with Twisted's own ``write`` and buffers over a real socket;
    the reactor's part (``startWriting``/``stopWriting``) is recorded."""

    TLS = False

    def __init__(self, sock: socket.socket) -> None:  # noqa: super().__init__ needs a reactor
        self.socket = sock
        self.connected, self.disconnecting = True, False
        self._writeDisconnected = self._writeDisconnecting = False
        self.dataBuffer, self.offset = b"", 0
        self._tempDataBuffer, self._tempDataLen = [], 0
        self.producer = None
        self.writing = False

    def startWriting(self) -> None:
        self.writing = True

    def stopWriting(self) -> None:
        self.writing = False


def test_gathered_writes_keep_views_queued_and_send_them_in_order():
    a, b = _small_buffer_pair()
    tr = _GatherTransport(a)
    assert gather_writes(tr)
    rng = random.Random(5)
    big = rng.randbytes(3 << 20)
    parts = [b"head", memoryview(big)[1:], b"tail"]
    write_parts(tr, parts, sum(len(p) for p in parts))
    got = bytearray(_drain(b))
    assert 0 < len(got) < len(big) and tr.writing
    # The rest is queued as views of the caller's data: no joined copy.
    assert any(isinstance(p, memoryview) and p.obj is big for p in tr._tempDataBuffer)
    tr.write(b"small")                               # Twisted's own path, behind the views
    more = rng.randbytes(DIRECT_MIN * 3)
    write_parts(tr, [more], len(more))               # busy: queued, not sent ahead
    tr.disconnecting = True
    for _ in range(10_000):
        result = tr.doWrite()
        got += _drain(b)
        if not tr.writing:
            break
    assert bytes(got) == b"head" + big[1:] + b"tail" + b"small" + more
    assert tr._tempDataLen == 0 and result == main.CONNECTION_DONE
    a.close()
    b.close()


def test_many_small_queued_pieces_are_joined_and_still_arrive_in_order():
    a, b = _small_buffer_pair()
    tr = _GatherTransport(a)
    assert gather_writes(tr)
    rng = random.Random(7)
    big = rng.randbytes(DIRECT_MIN * 4)
    tr.startWriting()
    smalls = [rng.randbytes(40) for _ in range(5000)]
    tr._tempDataBuffer.extend([*smalls[:2500], memoryview(big), *smalls[2500:]])
    tr._tempDataLen = sum(len(p) for p in tr._tempDataBuffer)
    got = bytearray()
    tr.doWrite()
    assert len(tr._tempDataBuffer) <= 3           # joined runs around the one large view
    for _ in range(10_000):
        got += _drain(b)
        if not tr.writing:
            break
        tr.doWrite()
    got += _drain(b)
    assert bytes(got) == b"".join(smalls[:2500]) + big + b"".join(smalls[2500:])
    a.close()
    b.close()


def test_small_writes_take_the_ordinary_path():
    a, b = socket.socketpair()
    tr = _Transport(a)
    write_parts(tr, [b"x" * 10, b"y" * 10], 20)
    assert tr.queued == [b"x" * 10 + b"y" * 10]
    a.close()
    b.close()


def test_after_drops_exactly_the_sent_bytes():
    parts = [b"abc", b"defgh", memoryview(b"ijk")]
    whole = b"".join(parts)
    for sent in range(len(whole) + 1):
        assert b"".join(_after(parts, sent)) == whole[sent:]


class _ReadTransport(StringTransport, tcp.Connection):
    """A StringTransport with the socket and ``doRead`` of a plain Twisted TCP transport
    (and its type: only those take the direct read path)."""

    TLS = False

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.socket = sock
        self.plain_reads = 0

    def doRead(self) -> None:
        self.plain_reads += 1
        data = self.socket.recv(1 << 20)
        if data:
            self.protocol.dataReceived(data)


def test_a_large_frame_is_read_into_its_own_buffer_and_its_entries_shared():
    rng = random.Random(11)
    sent = _messages(rng)
    big = Append(frm=2, to=1, term=3, prev_index=8, prev_term=3,
                 entries=(Entry(9, 3, EntryKind.NORMAL, rng.randbytes(700_000)),), commit=8)
    sent.append(big)
    stream = b"".join(_frame(m) for m in sent)
    got: list = []
    t = RaftTransport(1, PEERS[1], PEERS, MemoryReactorClock(), random.Random(0), run_io=None)
    t.start(SimpleNamespace(receive=got.append))
    a, b = socket.socketpair()
    a.setblocking(False)
    link = t._reactor.tcpServers[0][1].buildProtocol(None)
    tr = _ReadTransport(a)
    tr.protocol = link
    link.makeConnection(tr)
    cut = len(stream) - 600_000           # the last frame's head arrives with the rest
    link.dataReceived(stream[:cut])
    assert link._fill is not None and len(got) == len(sent) - 1
    pos = cut
    while pos < len(stream):
        n = b.send(stream[pos:pos + 100_000])
        pos += n
        tr.doRead()                       # the installed reader: recv_into the frame
    assert tr.plain_reads == 0 and link._fill is None
    assert encode(got[-1]) == encode(big)
    data = got[-1].entries[0].data
    assert type(data) is memoryview and type(data.obj).__name__ == "FrameBuffer"
    b.send(_frame(sent[0]))               # a small frame: the ordinary read again
    tr.doRead()
    assert tr.plain_reads == 1 and encode(got[-1]) == encode(sent[0])
    a.close()
    b.close()


def test_a_length_prefix_alone_never_gets_a_large_buffer():
    """A buffer of its own is allocated whole, so a frame gets one only once 64 KiB of it
    are here and only up to 16 MiB: a peer cannot make the node allocate a huge buffer for a
    few bytes (the frame then grows as its data arrives, as before)."""
    got: list = []
    t = RaftTransport(1, PEERS[1], PEERS, MemoryReactorClock(), random.Random(0), run_io=None)
    t.start(SimpleNamespace(receive=got.append))
    a, b = socket.socketpair()
    link = t._reactor.tcpServers[0][1].buildProtocol(None)
    tr = _ReadTransport(a)
    tr.protocol = link
    link.makeConnection(tr)
    link.dataReceived(_HEAD.pack(200 << 20, RAFT) + b"x" * 100)   # 200 MiB claimed
    assert link._fill is None and link._held_len == 105
    link2 = t._reactor.tcpServers[0][1].buildProtocol(None)
    tr2 = _ReadTransport(b)
    tr2.protocol = link2
    link2.makeConnection(tr2)
    link2.dataReceived(_HEAD.pack(1 << 20, RAFT) + b"x" * 1000)   # 1 MiB, little of it here
    assert link2._fill is None
    a.close()
    b.close()


def test_a_tls_wrapper_over_a_tcp_connection_is_never_written_to_directly():
    """The TLS listener's transport answers ``socket`` and ``TLS`` from the connection under
    it; the bytes must still go through it to be encrypted."""
    from twisted.protocols.tls import BufferingTLSTransport

    a, b = socket.socketpair()
    under = _Transport(a)
    assert plain_tcp(under)
    wrapper = BufferingTLSTransport.__new__(BufferingTLSTransport)
    wrapper.__dict__["_protocol"] = SimpleNamespace(transport=under)
    assert not plain_tcp(wrapper)
    a.close()
    b.close()


def test_a_message_whose_stored_entry_fails_its_check_is_dropped_not_raised():
    """An applied entry read back from the Raft log for a follower (``Stored``) that fails
    its CRC check costs that one message, as a lost packet would; later messages still go."""
    from kmqkafka.raft.messages import Stored
    from kmqkafka.raft.storage import CorruptLog

    def damaged(at: int, size: int) -> bytes:
        raise CorruptLog("the entry record is gone or damaged")

    t = RaftTransport(1, PEERS[1], PEERS, MemoryReactorClock(), random.Random(0), run_io=None)
    sent: list = []
    t._peers[2].link = SimpleNamespace(send_parts=lambda kind, parts: sent.append(parts))
    bad = Append(frm=1, to=2, term=3, prev_index=4, prev_term=3,
                 entries=(Entry(5, 3, EntryKind.NORMAL, Stored(damaged, 0, 500)),), commit=5)
    t.send([bad, Heartbeat(frm=1, to=2, term=3, commit=5)])
    assert [decode(b"".join(bytes(p) for p in parts)) for parts in sent] == [
        Heartbeat(frm=1, to=2, term=3, commit=5)]
