"""The Kafka front door: framing, version checks, ordering, limits, TLS and lifecycle.

The first part drives ``KafkaProtocol`` in memory (StringTransport, task.Clock); the rest talks to
a real ``twistd -n kmqkafka`` subprocess over loopback sockets.
"""
from __future__ import annotations

import datetime
import os
import signal
import socket
import ssl
import struct
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsV0
from kio.schema.api_versions.v3.response import ApiVersionsResponse as ApiVersionsV3
from kio.schema.errors import ErrorCode
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.serial import entity_reader
from prometheus_client import CollectorRegistry
from twisted.internet import task
from twisted.internet.defer import Deferred
from twisted.internet.testing import StringTransport

from kmqkafka.net.fast_bodies import uvarint
from kmqkafka.dispatch import NO_RESPONSE, Dispatcher
from kmqkafka.kafka import api_versions
from kmqkafka.metrics import Metrics
from kmqkafka.net.protocol import MAX_IN_FLIGHT, ConnectionLimiter, KafkaFactory

from conftest import HOST, BrokerProcess, http_get, make_self_signed, start_broker

# -- raw frames ------------------------------------------------------------------------------


def api_versions_frame(version: int, correlation_id: int, client_id: str = "wire-test",
                       software: bytes = b"wire-test") -> bytes:
    """A complete size-prefixed ApiVersions request (header v1 for v0-2, v2 for v3+)."""
    cid = client_id.encode()
    header = struct.pack(">hhih", 18, version, correlation_id, len(cid)) + cid
    if version >= 3:
        header += b"\x00"  # header tagged fields
        # compact strings (software name, version) + body tagged fields
        body = bytes([len(software) + 1]) + software + b"\x041.0\x00"
    else:
        body = b""
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return bytes(data)


def read_response(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", recv_exact(sock, 4))
    return recv_exact(sock, size)


def decode_api_versions(payload: bytes, version: int) -> tuple[int, Any]:
    """(correlation id, decoded body): ApiVersions responses always use response header v0."""
    header, used = entity_reader(ResponseHeaderV0)(payload, 0)
    cls = ApiVersionsV0 if version == 0 else ApiVersionsV3
    body, n = entity_reader(cls)(payload, used)
    assert used + n == len(payload)
    return header.correlation_id, body


def is_closed(sock: socket.socket, timeout: float = 5.0) -> bool:
    """True if the peer closes (EOF or reset) within ``timeout`` without sending anything."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def connect(port: int) -> socket.socket:
    sock = socket.create_connection((HOST, port), timeout=5)
    sock.settimeout(5)
    return sock


def roundtrip_ok(port: int) -> None:
    with connect(port) as sock:
        sock.sendall(api_versions_frame(0, 99))
        corr, body = decode_api_versions(read_response(sock), 0)
        assert corr == 99 and body.error_code == ErrorCode.none


# -- in-memory protocol ---------------------------------------------------------------------


class Harness:
    """A KafkaFactory with ApiVersions plus test handlers, and one connection."""

    def __init__(self, max_frame: int = 1 << 20, limit: int = 10) -> None:
        self.clock = task.Clock()
        self.dispatcher = Dispatcher()
        api_versions.register(self.dispatcher)
        self.metrics = Metrics(CollectorRegistry())
        self.factory = KafkaFactory(self.dispatcher, self.metrics, self.clock, max_frame,
                                    ConnectionLimiter(limit))

    def connect(self) -> tuple[Any, StringTransport]:
        proto = self.factory.buildProtocol(None)
        transport = StringTransport()
        proto.makeConnection(transport)
        return proto, transport


def responses(data: bytes) -> list[tuple[int, bytes]]:
    """Split written bytes into (correlation id, rest) per response frame."""
    out = []
    pos = 0
    while pos < len(data):
        (size,) = struct.unpack_from(">i", data, pos)
        frame = data[pos + 4: pos + 4 + size]
        out.append((struct.unpack_from(">i", frame, 0)[0], frame))
        pos += 4 + size
    return out


def kio_frame(request: Any, api_key: int, version: int, correlation_id: int,
              client_id: str) -> bytes:
    """``request`` (a kio request object) encoded with its header as one size-prefixed frame."""
    from kio.serial import entity_writer

    from kmqkafka.net.chunks import ChunkWriter

    out = ChunkWriter()
    header = request.__header_schema__(request_api_key=api_key, request_api_version=version,
                                       correlation_id=correlation_id, client_id=client_id)
    entity_writer(type(header))(out, header)
    entity_writer(type(request))(out, request)
    body = out.getvalue()
    return struct.pack(">i", len(body)) + body


def produce_frame(correlation_id: int) -> bytes:
    """A size-prefixed Produce v9 naming no topic (header v2): for handlers the tests replace."""
    import importlib

    mod = importlib.import_module("kio.schema.produce.v9.request")
    request = mod.ProduceRequest(transactional_id=None, acks=1,
                                 timeout=datetime.timedelta(seconds=1), topic_data=())
    return kio_frame(request, 0, 9, correlation_id, "wire-test")


def produce_response() -> Any:
    import importlib

    mod = importlib.import_module("kio.schema.produce.v9.response")
    return mod.ProduceResponse(responses=(), throttle_time=datetime.timedelta(0))


def parking() -> tuple[dict[int, Deferred[Any]], Any]:
    """A handler that parks every request it gets, and the parked Deferreds by correlation id."""
    parked: dict[int, Deferred[Any]] = {}

    def slow(request: Any, ctx: Any) -> Deferred[Any]:
        parked[ctx.correlation_id] = Deferred()
        return parked[ctx.correlation_id]

    return parked, slow


def test_responses_are_written_in_request_order_when_handlers_finish_out_of_order() -> None:
    """Pipelined Produces run at once (their appends are proposed in request order); their
    answers still go out in request order."""
    h = Harness()
    parked, slow = parking()
    h.dispatcher.register(0, slow, 9, 9)
    proto, transport = h.connect()
    proto.dataReceived(b"".join(produce_frame(c) for c in (1, 2, 3)))
    assert sorted(parked) == [1, 2, 3]
    assert transport.value() == b""
    for c in (3, 2):
        parked[c].callback(produce_response())
    assert transport.value() == b"", "response 3 and 2 must wait for 1"
    parked[1].callback(produce_response())
    assert [c for c, _ in responses(transport.value())] == [1, 2, 3]


def test_a_request_starts_once_every_earlier_one_on_its_connection_is_answered() -> None:
    """Kafka mutes a channel from a request's arrival until its answer is sent, so a request
    sees what every earlier one on its connection did (a ListOffsets right behind a
    DeleteRecords saw the old log start). Only a Produce behind Produces overlaps them."""
    h = Harness()
    h.dispatcher._registry.clear()
    parked, slow = parking()
    h.dispatcher.register(18, slow, 0, 4)
    h.dispatcher.register(0, slow, 9, 9)
    proto, transport = h.connect()
    # ApiVersions 1, Produce 2 and 3, ApiVersions 4, Produce 5.
    proto.dataReceived(api_versions_frame(0, 1) + produce_frame(2) + produce_frame(3)
                       + api_versions_frame(0, 4) + produce_frame(5))
    assert sorted(parked) == [1]
    parked[1].callback(api_versions.build_response(h.dispatcher, 0, ErrorCode.none))
    assert sorted(parked) == [1, 2, 3]  # the two Produces together
    parked[3].callback(produce_response())
    assert sorted(parked) == [1, 2, 3]
    parked[2].callback(produce_response())
    assert sorted(parked) == [1, 2, 3, 4]
    parked[4].callback(api_versions.build_response(h.dispatcher, 0, ErrorCode.none))
    assert sorted(parked) == [1, 2, 3, 4, 5]
    parked[5].callback(produce_response())
    assert [c for c, _ in responses(transport.value())] == [1, 2, 3, 4, 5]


def test_requests_another_node_relays_overlap() -> None:
    """A follower relays many clients' quick calls over one pooled connection; each client's
    order was kept on the connection it came in on, so the leader runs them at once."""
    from kmqkafka.net.forward import wrap

    h = Harness()
    h.dispatcher._registry.clear()
    parked, slow = parking()
    h.dispatcher.register(18, slow, 0, 4)
    proto, transport = h.connect()
    proto.dataReceived(b"".join(api_versions_frame(0, c, wrap("10.0.0.%d:1" % c, "User:ANONYMOUS", "app"))
                                for c in (1, 2, 3)))
    assert sorted(parked) == [1, 2, 3]
    for c in (3, 2, 1):
        parked[c].callback(api_versions.build_response(h.dispatcher, 0, ErrorCode.none))
    assert [c for c, _ in responses(transport.value())] == [1, 2, 3]


def test_no_response_keeps_order_and_writes_nothing() -> None:
    h = Harness()
    h.dispatcher._registry.clear()
    d: Deferred[Any] = Deferred()
    h.dispatcher.register(18, lambda req, ctx: d if ctx.correlation_id == 1 else
                          (NO_RESPONSE if ctx.correlation_id == 2 else
                           api_versions.build_response(h.dispatcher, 0, ErrorCode.none)), 0, 4)
    proto, transport = h.connect()
    proto.dataReceived(b"".join(api_versions_frame(0, c) for c in (1, 2, 3)))
    assert transport.value() == b""
    d.callback(NO_RESPONSE)
    assert [c for c, _ in responses(transport.value())] == [3]


def test_frames_split_across_reads_are_reassembled() -> None:
    h = Harness()
    proto, transport = h.connect()
    data = b"".join(api_versions_frame(v, c) for c, v in enumerate((0, 1, 2, 3, 4)))
    for i in range(len(data)):
        proto.dataReceived(data[i:i + 1])
    assert [c for c, _ in responses(transport.value())] == [0, 1, 2, 3, 4]
    assert not transport.disconnecting


@pytest.mark.parametrize("size", [-1, (1 << 20) + 1, 0x7FFFFFFF])
def test_frame_size_outside_cap_closes_without_buffering(size: int) -> None:
    h = Harness(max_frame=1 << 20)
    proto, transport = h.connect()
    proto.dataReceived(struct.pack(">i", size) + b"x" * 10)
    assert transport.disconnecting
    assert len(proto._buf) == 0


def test_frame_size_at_cap_is_read() -> None:
    h = Harness(max_frame=64)
    proto, transport = h.connect()
    frame = api_versions_frame(0, 5)
    assert len(frame) - 4 <= 64
    proto.dataReceived(frame)
    assert responses(transport.value())[0][0] == 5


def test_handler_exception_becomes_unknown_server_error() -> None:
    h = Harness()
    h.dispatcher._registry.clear()

    def boom(request: Any, ctx: Any) -> Any:
        raise RuntimeError("boom")

    h.dispatcher.register(18, boom, 0, 4)
    proto, transport = h.connect()
    proto.dataReceived(api_versions_frame(3, 7))
    corr, body = decode_api_versions(responses(transport.value())[0][1], 3)
    assert corr == 7 and body.error_code == ErrorCode.unknown_server_error
    assert not transport.disconnecting


def _flood_parked_api_versions(count: int) -> int:
    """Send ``count`` ApiVersions requests whose handler parks each answer; check that
    reading paused, answer them all, check that reading resumed and every answer went out.
    Returns how many requests were read (pending) while reading was paused."""
    h = Harness()
    h.dispatcher._registry.clear()
    parked: list[Deferred[Any]] = []

    def slow(request: Any, ctx: Any) -> Deferred[Any]:
        parked.append(Deferred())
        return parked[-1]

    h.dispatcher.register(18, slow, 0, 4)
    proto, transport = h.connect()
    proto.dataReceived(b"".join(api_versions_frame(0, c) for c in range(count)))
    assert transport.producerState == "paused"
    assert len(parked) == 1  # one at a time
    read = len(proto._pending)
    while parked:
        parked.pop(0).callback(api_versions.build_response(h.dispatcher, 0, ErrorCode.none))
    assert transport.producerState == "producing"
    assert len(responses(transport.value())) == count
    return read


def test_too_many_in_flight_pauses_reading_and_resumes_when_drained() -> None:
    # The rest stays in the buffer unread.
    assert _flood_parked_api_versions(MAX_IN_FLIGHT + 10) == MAX_IN_FLIGHT + 1


def test_in_flight_request_bytes_pause_reading_too(monkeypatch) -> None:
    """Few but large requests (produces) awaiting their answers also pause reading: the
    count limit is generous so a group commit can take many small ones, and the bytes bound
    what a connection holds."""
    from kmqkafka.net import protocol

    monkeypatch.setattr(protocol, "MAX_IN_FLIGHT_BYTES", 5 * (len(api_versions_frame(0, 0)) - 4))
    assert _flood_parked_api_versions(20) == 6  # up to just past the byte limit


@pytest.mark.parametrize("wait_only", [True, False])
def test_connection_lost_cancels_only_waiting_handlers(wait_only: bool) -> None:
    """A wait (parked Fetch, JoinGroup) is cancelled with its connection; any other request
    runs to the end, as in Kafka (a Produce whose client hung up is still appended). One
    read but not started yet is dropped, as the unread bytes of a muted Kafka channel."""
    h = Harness()
    h.dispatcher._registry.clear()
    cancelled: list[int] = []
    pending: list[Deferred[Any]] = []

    def slow(request: Any, ctx: Any) -> Deferred[Any]:
        d: Deferred[Any] = Deferred(lambda d: cancelled.append(ctx.correlation_id))
        pending.append(d)
        return d

    h.dispatcher.register(18, slow, 0, 4, wait_only=wait_only)
    proto, transport = h.connect()
    proto.dataReceived(b"".join(api_versions_frame(0, c) for c in (1, 2)))
    proto.connectionLost(None)
    assert cancelled == ([1] if wait_only else [])
    assert len(pending) == 1
    assert h.factory.limiter.open == 0
    if not wait_only:  # finishing after the close writes nothing and raises nothing
        written = transport.value()
        for d in pending:
            d.callback(api_versions.build_response(h.dispatcher, 0, ErrorCode.none))
        assert transport.value() == written


def test_connection_cap_refuses_beyond_limit() -> None:
    h = Harness(limit=1)
    first, t1 = h.connect()
    second, t2 = h.connect()
    assert not t1.disconnecting and t2.disconnecting
    first.connectionLost(None)
    third, t3 = h.connect()
    assert not t3.disconnecting


# -- real daemon over sockets ----------------------------------------------------------------


def test_api_versions_v0_over_socket(broker: BrokerProcess) -> None:
    with connect(broker.kafka_port) as sock:
        sock.sendall(api_versions_frame(0, 11))
        corr, body = decode_api_versions(read_response(sock), 0)
    assert corr == 11
    assert body.error_code == ErrorCode.none
    assert (18, 0, 4) in [(k.api_key, k.min_version, k.max_version) for k in body.api_keys]


def test_api_versions_v3_over_socket(broker: BrokerProcess) -> None:
    with connect(broker.kafka_port) as sock:
        sock.sendall(api_versions_frame(3, 12))
        corr, body = decode_api_versions(read_response(sock), 3)
    assert corr == 12 and body.error_code == ErrorCode.none
    assert body.throttle_time == datetime.timedelta(0)


def test_api_versions_reports_kafka_4_1_features(broker: BrokerProcess) -> None:
    """KIP-584 features, as a Kafka 4.1 broker reports them: metadata.version 4.1-IV1 (27),
    group.version 1 (KIP-848) and share.version 1 (KIP-932) finalized, epoch at least 0; a v3
    answer leaves out the supported
    features whose minimum is 0 (KAFKA-17011) but lists the same finalized ones."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="features")
    try:
        assert admin.describe_features() == {
            "metadata.version": {"supported": (7, 27), "finalized": (27, 27),
                                 "finalized_epoch": 0},
            "group.version": {"supported": (0, 1), "finalized": (1, 1), "finalized_epoch": 0},
            "share.version": {"supported": (0, 1), "finalized": (1, 1), "finalized_epoch": 0},
        }
    finally:
        admin.close()
    with connect(broker.kafka_port) as sock:
        sock.sendall(api_versions_frame(3, 16))
        _, body = decode_api_versions(read_response(sock), 3)
    assert [(f.name, f.min_version, f.max_version) for f in body.supported_features] == [
        ("metadata.version", 7, 27)]
    assert [(f.name, f.min_version_level, f.max_version_level)
            for f in body.finalized_features] == [("metadata.version", 27, 27),
                                                  ("group.version", 1, 1),
                                                  ("share.version", 1, 1)]
    assert body.finalized_features_epoch == 0


def test_unsupported_api_versions_version_answers_v0_layout_with_error_35(
    broker: BrokerProcess,
) -> None:
    with connect(broker.kafka_port) as sock:
        sock.sendall(api_versions_frame(99, 13))
        corr, body = decode_api_versions(read_response(sock), 0)
        assert corr == 13
        assert body.error_code == ErrorCode.unsupported_version
        # Kafka's getErrorResponse lists ApiVersions' own range and nothing else (KIP-511).
        assert [(k.api_key, k.min_version, k.max_version) for k in body.api_keys] == [(18, 0, 4)]
        # The connection stays usable: the client retries with a supported version.
        sock.sendall(api_versions_frame(3, 14))
        assert decode_api_versions(read_response(sock), 3)[0] == 14


def test_malformed_client_software_name_is_invalid_request_with_no_table(
    broker: BrokerProcess,
) -> None:
    """Kafka answers an ApiVersions v3+ whose software name breaks KIP-511's pattern with
    INVALID_REQUEST and an empty api_keys (getErrorResponse lists keys only for 35)."""
    with connect(broker.kafka_port) as sock:
        sock.sendall(api_versions_frame(3, 15, software=b"-bad-"))
        corr, body = decode_api_versions(read_response(sock), 3)
    assert corr == 15 and body.error_code == ErrorCode.invalid_request
    assert body.api_keys == ()


def test_random_bytes_close_only_that_connection(broker: BrokerProcess) -> None:
    with connect(broker.kafka_port) as other:
        with connect(broker.kafka_port) as sock:
            sock.sendall(b"\x00\x00\x00\x10" + os.urandom(16))
            assert is_closed(sock)
        other.sendall(api_versions_frame(0, 1))
        assert decode_api_versions(read_response(other), 0)[0] == 1
    roundtrip_ok(broker.kafka_port)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_two_gib_length_prefix_closes_without_reading(broker: BrokerProcess) -> None:
    before = _rss_kib(broker.pid)
    with connect(broker.kafka_port) as sock:
        sock.sendall(struct.pack(">I", 0x7FFFFFFF) + b"\x00" * 65536)
        assert is_closed(sock)
    assert _rss_kib(broker.pid) - before < 50 * 1024
    roundtrip_ok(broker.kafka_port)


def test_unknown_api_key_closes(broker: BrokerProcess) -> None:
    with connect(broker.kafka_port) as sock:
        payload = struct.pack(">hhih", 31000, 0, 1, 0)
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        assert is_closed(sock)
    roundtrip_ok(broker.kafka_port)


def test_truncated_body_closes(broker: BrokerProcess) -> None:
    frame = api_versions_frame(3, 5)
    # Declare a frame that ends in the middle of the body's first compact string.
    cut = frame[4:-8]
    with connect(broker.kafka_port) as sock:
        sock.sendall(struct.pack(">i", len(cut)) + cut)
        assert is_closed(sock)
    roundtrip_ok(broker.kafka_port)


def _header_v2(api_key: int, version: int) -> bytes:
    return struct.pack(">hhih", api_key, version, 7, 4) + b"fuzz" + b"\x00"


HUGE = 2**32 - 2
# Tiny frames whose array, string or tag counts claim billions of elements: kio's native
# reader reserves capacity from such a count, and the failed allocation aborted the process.
HOSTILE_COUNTS = {
    "metadata topics": _header_v2(3, 12) + uvarint(HUGE),
    "header tagged fields": struct.pack(">hhih", 3, 12, 7, 4) + b"fuzz" + uvarint(HUGE),
    "api versions string": _header_v2(18, 3) + uvarint(HUGE),
    "produce records": _header_v2(0, 9) + b"\x00\xff\xff" + struct.pack(">i", 1000)
    + b"\x02\x09fz-topic\x02" + struct.pack(">i", 0) + uvarint(HUGE),
    "fetch partitions": _header_v2(1, 12) + struct.pack(">iiiib", -1, 100, 1, 1000, 0)
    + struct.pack(">ii", 0, -1) + b"\x02\x09fz-topic" + uvarint(HUGE),
    "legacy array": struct.pack(">hhih", 3, 4, 7, 4) + b"fuzz" + struct.pack(">i", 2**31 - 1),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_COUNTS))
def test_counts_beyond_the_frame_close_only_that_connection(broker: BrokerProcess,
                                                           name: str) -> None:
    body = HOSTILE_COUNTS[name]
    with connect(broker.kafka_port) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        assert is_closed(sock)
    assert broker.proc.poll() is None, broker.log()[-2000:]
    roundtrip_ok(broker.kafka_port)


def test_unknown_tagged_fields_are_skipped(broker: BrokerProcess) -> None:
    """KIP-482: a receiver skips tagged fields it does not know, in the header, the body and
    nested structs (a newer client may send them). They closed the connection, with an
    unhandled KeyError from kio in the log."""
    from kio.index import load_response_schema

    header = struct.pack(">hhih", 18, 3, 1, 4) + b"fuzz" + b"\x01\x03\x02hi"  # tag 3
    body = b"\x0awire-test\x041.0" + b"\x02\x07\x01\x00\x41\x00"  # tags 7 and 65
    with connect(broker.kafka_port) as sock:
        sock.sendall(struct.pack(">i", len(header + body)) + header + body)
        assert decode_api_versions(read_response(sock), 3)[0] == 1
        topic = bytes(16) + b"\x07tagged" + b"\x01\x09\x03abc"  # a topic with tag 9
        metadata = _header_v2(3, 12) + b"\x02" + topic + b"\x01\x00" + b"\x00"
        sock.sendall(struct.pack(">i", len(metadata)) + metadata)
        payload = read_response(sock)
    response_type = load_response_schema(3, 12)
    head, used = entity_reader(response_type.__header_schema__)(payload, 0)
    response, _ = entity_reader(response_type)(payload, used)
    assert head.correlation_id == 7
    assert [t.name for t in response.topics] == ["tagged"]
    assert "Unhandled" not in broker.log()


NOT_KAFKA = {
    # ListOffsets v5: topics (not nullable) sent as null.
    "null array": struct.pack(">hhih", 2, 5, 7, 4) + b"fuzz" + struct.pack(">ib", -1, 0)
    + struct.pack(">i", -1),
    # FindCoordinator v4: coordinator_keys (not nullable) null.
    "null compact array": _header_v2(10, 4) + b"\x00" + b"\x00" + b"\x00",
    # OffsetCommit v9: a group id of 40,000 characters (Kafka allows 32,767).
    "long compact string": _header_v2(8, 9) + uvarint(40_001) + b"g" * 40_000
    + struct.pack(">i", -1) + b"\x01" + b"\x00" + b"\x01" + b"\x00",
}


@pytest.mark.parametrize("name", sorted(NOT_KAFKA))
def test_what_kafkas_readers_refuse_closes_the_connection(broker: BrokerProcess,
                                                         name: str) -> None:
    """A null for a field that is not nullable, or a string over 32,767 bytes: Kafka fails
    such a request while parsing it. A handler met the null as None (a traceback, then
    UNKNOWN_SERVER_ERROR or a closed connection); the long group id was stored, and every
    later ListGroups v0-2 response failed to encode."""
    body = NOT_KAFKA[name]
    with connect(broker.kafka_port) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        assert is_closed(sock)
    log = broker.log()
    assert "malformed" in log and "Traceback" not in log, log[-3000:]
    roundtrip_ok(broker.kafka_port)


def test_a_request_naming_too_many_elements_closes_only_that_connection(
        broker: BrokerProcess) -> None:
    """A legal but enormous request (300,000 partitions in one DescribeProducers) would hold
    the reactor for seconds; the guard refuses it before any handler runs."""
    import io
    import sys

    from kio.index import load_request_schema
    from kio.serial import entity_writer

    from kmqkafka.net.guard import MAX_ELEMENTS

    request_type = load_request_schema(61, 0)
    topic_type = sys.modules[request_type.__module__].TopicRequest
    request = request_type(topics=tuple(
        topic_type(name=f"t{i}", partition_indexes=tuple(range(300))) for i in range(1000)))
    assert 1000 * 300 > MAX_ELEMENTS
    buf = io.BytesIO()
    header_type = request_type.__header_schema__
    entity_writer(header_type)(buf, header_type(request_api_key=61, request_api_version=0,
                                                correlation_id=1, client_id="big"))
    entity_writer(request_type)(buf, request)
    started = time.monotonic()
    with connect(broker.kafka_port) as sock:
        sock.sendall(struct.pack(">i", len(buf.getvalue())) + buf.getvalue())
        assert is_closed(sock)
    assert time.monotonic() - started < 3
    roundtrip_ok(broker.kafka_port)


def test_idle_connections_are_closed_but_a_parked_fetch_is_not_idle(tmp_path: Path) -> None:
    """Kafka's connections.max.idle.ms (1 s here): a silent connection goes; one waiting on
    a long-poll Fetch is busy, not idle, and gets its answer."""
    import datetime

    from kio.index import load_request_schema

    b = start_broker(tmp_path, env={"CONNECTORS_KAFKA_CONNECTIONS_MAX_IDLE_MS": "1000"})
    try:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("idle", 1)])["idle"].result(15)
        silent = connect(b.kafka_port)
        request_type = load_request_schema(1, 4)
        types = sys.modules[request_type.__module__]
        fetch = request_type(
            replica_id=-1, max_wait=datetime.timedelta(seconds=3), min_bytes=1,
            max_bytes=1 << 20, isolation_level=0, topics=(types.FetchTopic(
                topic="idle", partitions=(types.FetchPartition(
                    partition=0, fetch_offset=0, partition_max_bytes=1 << 20),)),))
        from rawkafka import RawClient

        with RawClient(b.kafka_port) as raw:
            started = time.monotonic()
            raw.call(fetch)  # parked for max_wait: 3 s, three idle periods
            assert time.monotonic() - started >= 2.5
        silent.settimeout(5)
        assert is_closed(silent)
        roundtrip_ok(b.kafka_port)
    finally:
        b.stop()


def test_an_idle_tls_peer_that_never_answers_the_close_is_cut_off(tmp_path: Path) -> None:
    """TLS closes by waiting for the peer's close_notify; a silent peer never sends it, and its
    connection held a slot forever (logged again at every sweep). It goes within
    ``IDLE_ABORT_S`` of its close now, as Kafka closes the socket whatever the peer does."""
    cert, key = make_self_signed(tmp_path)
    b = start_broker(tmp_path, env={"CONNECTORS_KAFKA_CONNECTIONS_MAX_IDLE_MS": "1000",
                                    "KMQKAFKA_TLS_CERT": str(cert), "KMQKAFKA_TLS_KEY": str(key)})

    def open_tls() -> float:
        text = http_get(b.http_port, "/metrics").decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("kmqkafka_kafka_connections_open{"))

    try:
        context = ssl.create_default_context(cafile=str(cert))
        silent = [context.wrap_socket(socket.create_connection((HOST, b.tls_port), timeout=5),
                                      server_hostname=HOST) for _ in range(3)]
        assert open_tls() == 3
        deadline = time.monotonic() + 15  # 1 s idle, a sweep, then IDLE_ABORT_S
        while open_tls() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert open_tls() == 0
        assert b.log().count("closing Kafka connection") == 3
        for s in silent:
            s.close()
    finally:
        b.stop()


def test_pipelined_requests_are_answered_in_order(broker: BrokerProcess) -> None:
    versions = [0, 3, 1, 4, 2, 99, 3, 0] * 8
    with connect(broker.kafka_port) as sock:
        sock.sendall(b"".join(api_versions_frame(v, i) for i, v in enumerate(versions)))
        got = [struct.unpack_from(">i", read_response(sock), 0)[0] for _ in versions]
    assert got == list(range(len(versions)))


def test_a_request_sees_what_the_one_before_it_on_its_connection_did(
        broker: BrokerProcess) -> None:
    """librdkafka sends an admin client's DeleteRecords and the ListOffsets right after it on
    one connection without waiting: Kafka runs the second once the first is answered, so
    the earliest offset is the new log start. kmqkafka ran both at once and answered 0."""
    from confluent_kafka import Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(3):
        topic = f"sees-before-{i}"
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)
        for v in (b"a", b"b", b"c"):
            producer.produce(topic, v)
        assert producer.flush(15) == 0
        deleted = admin.delete_records([TopicPartition(topic, 0, 2)])
        earliest = admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.earliest()})
        assert list(deleted.values())[0].result(15).low_watermark == 2
        assert list(earliest.values())[0].result(15).offset == 2


def test_connection_cap(tmp_path: Path) -> None:
    b = start_broker(tmp_path, env={"CONNECTORS_KAFKA_MAX_CONNECTIONS": "2"})
    try:
        a, c = connect(b.kafka_port), connect(b.kafka_port)
        for i, sock in enumerate((a, c)):
            sock.sendall(api_versions_frame(0, i))
            assert decode_api_versions(read_response(sock), 0)[0] == i
        try:
            third = connect(b.kafka_port)
        except ConnectionResetError:
            pass  # the broker's reset can reach a loaded client before connect() returns
        else:
            with third:
                assert is_closed(third)
        a.close()
        deadline = time.monotonic() + 5
        while True:  # the broker notices the close asynchronously
            try:
                roundtrip_ok(b.kafka_port)
                break
            except (ConnectionError, OSError):
                assert time.monotonic() < deadline
                time.sleep(0.05)
        c.close()
    finally:
        assert b.stop() == 0


def test_connections_are_capped_to_what_the_open_file_limit_holds(tmp_path: Path) -> None:
    """With 1,000 descriptors and the default cap of 1,000 connections, clients took the
    last descriptors and the next checkpoint write failed: the node refused every write
    until restarted. The cap now leaves the store its reserve."""
    from confluent_kafka import Producer

    b = start_broker(tmp_path, prefix=["prlimit", "--nofile=1000:1000"])
    flood: list[socket.socket] = []
    try:
        assert "does not fit the open-file limit (1000); allowing 440" in b.log()
        producer = Producer({"bootstrap.servers": b.bootstrap, "acks": "all",
                             "message.timeout.ms": 10000})
        producer.produce("fd-cap", b"before")
        assert producer.flush(15) == 0
        for _ in range(1000):
            try:
                flood.append(socket.create_connection((HOST, b.kafka_port), timeout=2))
            except OSError:
                break
        time.sleep(1.0)  # the broker accepts (and refuses) what it can
        failures: list[Any] = []
        for i in range(50):
            producer.produce("fd-cap", b"during-%d" % i,
                             on_delivery=lambda err, msg: err and failures.append(err))
        assert producer.flush(15) == 0
        assert not failures, failures[:3]
        assert b.health() == 200
    finally:
        for sock in flood:
            sock.close()
        assert b.stop() == 0


def test_kafka_disabled_never_binds(tmp_path: Path) -> None:
    b = start_broker(tmp_path, kafka=False)
    try:
        for port in (b.kafka_port, b.tls_port):
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((HOST, port), timeout=5)
        assert b.health() == 200
    finally:
        assert b.stop() == 0


def test_tls_listener_answers_api_versions(tmp_path: Path) -> None:
    cert, key = make_self_signed(tmp_path)
    b = start_broker(tmp_path, env={"KMQKAFKA_TLS_CERT": str(cert), "KMQKAFKA_TLS_KEY": str(key)})
    try:
        context = ssl.create_default_context(cafile=str(cert))
        with socket.create_connection((HOST, b.tls_port), timeout=5) as raw:
            with context.wrap_socket(raw, server_hostname=HOST) as sock:
                sock.sendall(api_versions_frame(3, 21))
                corr, body = decode_api_versions(read_response(sock), 3)  # type: ignore[arg-type]
        assert corr == 21 and body.error_code == ErrorCode.none
        roundtrip_ok(b.kafka_port)  # plaintext still open beside TLS
    finally:
        assert b.stop() == 0


def test_tls_enabled_without_certificate_refuses_to_start(tmp_path: Path) -> None:
    b = start_broker(tmp_path, env={"CONNECTORS_KAFKA_TLS_ENABLE": "true"}, wait=False)
    assert b.proc.wait(30) != 0
    lines = [l for l in b.log().splitlines() if l.strip()]
    assert len(lines) == 1 and "CONNECTORS_KAFKA_TLS_ENABLE" in lines[0]


def test_sigterm_exits_zero(broker: BrokerProcess) -> None:
    roundtrip_ok(broker.kafka_port)
    assert broker.stop() == 0
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((HOST, broker.kafka_port), timeout=5)


def test_health_and_metrics(broker: BrokerProcess) -> None:
    assert broker.health() == 200
    roundtrip_ok(broker.kafka_port)
    text = http_get(broker.http_port, "/metrics").decode()
    assert 'kmqkafka_kafka_requests_total{api="api_versions",version="0"}' in text
    assert "kmqkafka_kafka_request_latency_seconds_bucket" in text
    assert "kmqkafka_kafka_connections_open" in text


def _answer_across_sigterm(b: Any, raw: Any, request: Any) -> Any:
    """Send ``request`` (one the broker parks), SIGTERM the daemon half a second later, and
    return its answer; the daemon must exit 0 within 3 s of the signal, far inside its 5 s
    drain."""
    raw.send(request)
    time.sleep(0.5)  # parked now
    started = time.monotonic()
    b.proc.send_signal(signal.SIGTERM)
    answer = raw.receive(request)
    assert b.proc.wait(10) == 0
    assert time.monotonic() - started < 3
    return answer


def test_sigterm_answers_a_parked_fetch_before_exiting(tmp_path: Path) -> None:
    """SIGTERM finishes in-flight requests: a Fetch parked for 30 s on an empty partition is
    answered at once (with no records) and the daemon exits 0 well within its drain timeout.
    It used to hold the drain for its whole 5 s and then lose its answer."""
    import importlib

    from rawkafka import RawClient

    def req(name: str) -> Any:
        return getattr(importlib.import_module("kio.schema.fetch.v11.request"), name)

    b = start_broker(tmp_path)
    try:
        produce_ok = RawClient(b.kafka_port)
        metadata = importlib.import_module("kio.schema.metadata.v12.request")
        produce_ok.call(metadata.MetadataRequest(
            topics=(metadata.MetadataRequestTopic(name="parked", topic_id=None),),
            allow_auto_topic_creation=True, include_topic_authorized_operations=False))
        produce_ok.close()
        raw = RawClient(b.kafka_port, timeout=20)
        request = req("FetchRequest")(
            replica_id=-1, max_wait=datetime.timedelta(seconds=30), min_bytes=1,
            max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
            topics=(req("FetchTopic")(topic="parked", partitions=(req("FetchPartition")(
                partition=0, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
                partition_max_bytes=1 << 20),)),),
            forgotten_topics_data=(), rack_id="")
        response = _answer_across_sigterm(b, raw, request)
        (part,) = response.responses[0].partitions
        assert part.error_code == ErrorCode.none and not part.records
        raw.close()
    finally:
        if b.proc.poll() is None:
            b.kill()


def _fetch_frame(topic: str, correlation_id: int, max_bytes: int) -> bytes:
    """A size-prefixed Fetch v11 of partition 0 from offset 0 (header v1)."""
    import importlib

    mod = importlib.import_module("kio.schema.fetch.v11.request")
    request = mod.FetchRequest(
        replica_id=-1, max_wait=datetime.timedelta(milliseconds=100), min_bytes=1,
        max_bytes=max_bytes, isolation_level=0, session_id=0, session_epoch=-1,
        topics=(mod.FetchTopic(topic=topic, partitions=(mod.FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
            partition_max_bytes=max_bytes),)),),
        forgotten_topics_data=(), rack_id="")
    return kio_frame(request, 1, 11, correlation_id, "no-reader")


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_a_client_that_never_reads_its_responses_does_not_grow_the_broker(
        broker: BrokerProcess) -> None:
    """Pipelined Fetches of a large log from a client that reads nothing: the broker stops
    reading that connection once its unsent answers pass a bound (Kafka mutes the channel),
    serves everyone else meanwhile, and answers every request in order once the client
    reads. Before, each answer was queued in the broker's memory: 300 Fetches of 1 MiB grew
    it by ~300 MB."""
    from confluent_kafka import Producer

    topic = "never-read"
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all",
                         "linger.ms": 5})
    value = os.urandom(1024)
    for _ in range(8192):  # 8 MiB: every Fetch below is answered with 1 MiB
        producer.produce(topic, value)
        producer.poll(0)
    assert producer.flush(30) == 0
    before = _rss_kb(broker.pid)
    count = 300
    frames = [_fetch_frame(topic, c, 1 << 20) for c in range(count)]
    with socket.create_connection((HOST, broker.kafka_port), timeout=5) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.settimeout(0.5)
        sent = 0
        deadline = time.monotonic() + 20
        while sent < count and time.monotonic() < deadline:
            try:
                sock.sendall(frames[sent])  # blocks once the broker stops reading us
            except socket.timeout:
                break
            sent += 1
        time.sleep(1.0)
        grown_mb = (_rss_kb(broker.pid) - before) / 1024
        roundtrip_ok(broker.kafka_port)  # another client is served meanwhile
        assert grown_mb < 64, f"{grown_mb:.0f} MB held for a client that reads nothing"
        pending = b"".join(frames[sent:])  # what did not fit goes now, as answers are read
        got: list[int] = []
        sock.setblocking(False)
        buf = bytearray()
        deadline = time.monotonic() + 60
        while len(got) < count and time.monotonic() < deadline:
            if pending:
                try:
                    pending = pending[sock.send(pending):]
                except BlockingIOError:
                    pass
            try:
                chunk = sock.recv(1 << 20)
            except BlockingIOError:
                time.sleep(0.001)
                continue
            assert chunk, "the broker closed the connection"
            buf += chunk
            while len(buf) >= 8:
                size = struct.unpack_from(">i", buf, 0)[0]
                if len(buf) < 4 + size:
                    break
                got.append(struct.unpack_from(">i", buf, 4)[0])
                del buf[:4 + size]
    assert got == list(range(count))


def test_announced_large_frames_do_not_make_the_broker_allocate_them_all(
        broker: BrokerProcess) -> None:
    """Connections that announce a 16 MiB request, send 64 KiB of it and stall: each got a
    16 MiB buffer (100 of them held 1.6 GB). Past a shared budget, a frame's buffer grows only
    with the bytes that arrive."""
    before = _rss_kb(broker.pid)
    size = 16 << 20
    stalled: list[socket.socket] = []
    try:
        for i in range(60):
            sock = socket.create_connection((HOST, broker.kafka_port), timeout=5)
            head = struct.pack(">ihhi", size, 18, 0, i) + b"\0\0"
            sock.sendall(head + bytes(64 * 1024 + 16))
            stalled.append(sock)
        time.sleep(1.0)
        grown_mb = (_rss_kb(broker.pid) - before) / 1024
        roundtrip_ok(broker.kafka_port)
        assert grown_mb < 400, f"{grown_mb:.0f} MB for 60 stalled frames of 64 KiB"
    finally:
        for sock in stalled:
            sock.close()
    roundtrip_ok(broker.kafka_port)


def test_sigterm_answers_a_parked_join_group_not_coordinator(tmp_path: Path) -> None:
    """A JoinGroup waiting for its group's first rebalance (here 60 s of
    group.initial.rebalance.delay.ms) is answered NOT_COORDINATOR when the drain begins, as
    Kafka's controlled shutdown unloads the groups it coordinates; its client looks for the
    coordinator again. It held the drain for the whole 5 s and then lost its answer."""
    import importlib

    from rawkafka import RawClient

    join = importlib.import_module("kio.schema.join_group.v9.request")

    def request(member_id: str) -> Any:
        return join.JoinGroupRequest(
            group_id="parked-join", session_timeout=datetime.timedelta(seconds=30),
            rebalance_timeout=datetime.timedelta(seconds=60), member_id=member_id,
            group_instance_id=None, protocol_type="consumer",
            protocols=(join.JoinGroupRequestProtocol(name="range", metadata=b""),), reason=None)

    b = start_broker(tmp_path, env={"CONNECTORS_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "60000"})
    try:
        raw = RawClient(b.kafka_port, timeout=20)
        first = raw.call(request(""))
        assert first.error_code == ErrorCode.member_id_required
        answer = _answer_across_sigterm(b, raw, request(first.member_id))
        assert answer.error_code == ErrorCode.not_coordinator
        raw.close()
    finally:
        if b.proc.poll() is None:
            b.kill()
