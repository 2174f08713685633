"""A tiny synchronous Kafka client for tests: send one kio request, read its kio response.

For error paths real clients never take (and to check exact fields); real
client libraries remain the tests' main tool.
"""

from __future__ import annotations

import io
import socket
import struct
import sys
from typing import Any

from kio.index import load_response_schema
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32


class RawClient:
    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.correlation = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "RawClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, request: Any, client_id: str = "raw-test") -> int:
        self.correlation += 1
        header_type = request.__header_schema__
        header = header_type(request_api_key=request.__api_key__,
                             request_api_version=request.__version__,
                             correlation_id=self.correlation, client_id=client_id)
        buf = io.BytesIO()
        entity_writer(header_type)(buf, header)
        entity_writer(type(request))(buf, request)
        payload = buf.getvalue()
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        return self.correlation

    def receive(self, request: Any) -> Any:
        size = struct.unpack(">i", self._exact(4))[0]
        frame = self._exact(size)
        response_type = load_response_schema(request.__api_key__, request.__version__)
        header, used = entity_reader(response_type.__header_schema__)(frame, 0)
        response, _ = entity_reader(response_type)(frame, used)
        return response

    def call(self, request: Any) -> Any:
        self.send(request)
        return self.receive(request)

    def authenticate(self, mechanism: str, user: str, password: str) -> Any:
        """SASL over SaslHandshake v1 and SaslAuthenticate v2; returns the last response."""
        from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
        from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

        from kmqkafka.net.sasl import client_steps

        r = self.call(SaslHandshakeRequest(mechanism=mechanism))
        if r.error_code != 0:
            return r
        steps = client_steps(mechanism, user, password)
        token = next(steps)
        while True:
            r = self.call(SaslAuthenticateRequest(auth_bytes=token))
            if r.error_code != 0:
                return r
            try:
                token = steps.send(bytes(r.auth_bytes))
            except StopIteration:
                return r

    def _exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("connection closed")
            out += chunk
        return bytes(out)


def kio_response_frame(correlation_id: int, response: Any, header_version: int) -> bytes:
    """A whole response frame (length, header, body) as kio encodes it: the reference the
    hand-written encoders are held to."""
    header_type = {0: ResponseHeaderV0, 1: ResponseHeaderV1}[header_version]
    buf = io.BytesIO()
    entity_writer(header_type)(buf, header_type(correlation_id=i32(correlation_id)))
    entity_writer(type(response))(buf, response)
    return struct.pack(">i", len(buf.getvalue())) + buf.getvalue()


def response_types(api_key: int, version: int) -> tuple[Any, Any]:
    """A kio response class and the module holding its nested types (one per version)."""
    rt = load_response_schema(api_key, version)
    return rt, sys.modules[rt.__module__]


def topic_lists(partitions: Any) -> Any:
    """Hypothesis: up to three (name, topic id, partitions) of a response, ``partitions``
    drawing each partition's fields."""
    from hypothesis import strategies as st

    return st.lists(st.tuples(st.from_regex(r"[a-zA-Z0-9._-]{1,20}", fullmatch=True),
                              st.uuids(), st.lists(partitions, max_size=3)), max_size=3)


def build_topics(data: list, partition: Any, topic: Any) -> tuple:
    """A response's topics from ``topic_lists`` draws: ``partition(fields)`` builds each
    partition from a copy of its drawn fields, ``topic(name, topic_id, partitions)`` each
    topic."""
    return tuple(topic(name, topic_id, tuple(partition(dict(p)) for p in parts))
                 for name, topic_id, parts in data)
