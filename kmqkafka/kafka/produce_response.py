"""Produce responses (v3-v13) encoded by hand: the answer sent most often, by far.

The layout, from Apache Kafka's ProduceResponse.json: ``responses`` (per topic: its name, or
from v13 its id, then ``partition_responses``: index, error code, base offset, log append time
(v2+), log start offset (v5+), record errors and error message (v8+)), then the throttle time.
From v9 the message is flexible: compact arrays and strings, and an empty tagged-field section
after every struct. v10 added two tagged fields (a partition's ``current_leader``, the top-level
``node_endpoints``); a response that sets either is left to kio (``encode_body`` returns None),
as is any value these writers do not expect.
"""
from __future__ import annotations

import struct
import sys
from typing import Any

from kio.index import load_response_schema

from kmqkafka.net import fast_bodies
from kmqkafka.net.fast_bodies import NO_TAGS, ZERO_UUID, count, string

API_KEY = 0
FIRST_VERSION = 3
LAST_VERSION = 13

_I32 = struct.Struct(">i")
_PARTITION = struct.Struct(">ihqq")       # index, error code, base offset, log append time
_PARTITION_V5 = struct.Struct(">ihqqq")   # ... and log start offset


def _ms(value: Any) -> int:
    """kio's datetime_i64 (None for -1) as milliseconds."""
    return -1 if value is None else round(value.timestamp() * 1000)


class _Encoder:
    """The body encoder of one ProduceResponse version."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.flexible = version >= 9
        self.by_id = version >= 13
        module = sys.modules[load_response_schema(API_KEY, version).__module__]
        leader_cls = getattr(module, "LeaderIdAndEpoch", None)
        self.no_leader = None if leader_cls is None else leader_cls(leader_id=-1, leader_epoch=-1)

    def _count(self, n: int) -> bytes:
        return count(n, self.flexible)

    def _string(self, value: str | None) -> bytes:
        return string(value, self.flexible)

    def __call__(self, response: Any) -> bytes | None:
        v = self.version
        if v >= 10 and response.node_endpoints:
            return None
        out = [self._count(len(response.responses))]
        for topic in response.responses:
            if self.by_id:
                out.append(ZERO_UUID if topic.topic_id is None else topic.topic_id.bytes)
            else:
                out.append(self._string(topic.name))
            parts = topic.partition_responses
            out.append(self._count(len(parts)))
            for p in parts:
                if v >= 10 and p.current_leader != self.no_leader:
                    return None
                if v >= 5:
                    out.append(_PARTITION_V5.pack(p.index, p.error_code.value, p.base_offset,
                                                  _ms(p.log_append_time), p.log_start_offset))
                else:
                    out.append(_PARTITION.pack(p.index, p.error_code.value, p.base_offset,
                                               _ms(p.log_append_time)))
                if v >= 8:
                    out.append(self._count(len(p.record_errors)))
                    for e in p.record_errors:
                        out.append(_I32.pack(e.batch_index))
                        out.append(self._string(e.batch_index_error_message))
                        if self.flexible:
                            out.append(NO_TAGS)
                    out.append(self._string(p.error_message))
                if self.flexible:
                    out.append(NO_TAGS)
            if self.flexible:
                out.append(NO_TAGS)
        out.append(_I32.pack(round(response.throttle_time.total_seconds() * 1000)))
        if self.flexible:
            out.append(NO_TAGS)
        return b"".join(out)


def install() -> None:
    """Register the encoders of every supported version with ``net/fast_bodies``."""
    for version in range(FIRST_VERSION, LAST_VERSION + 1):
        fast_bodies.register(load_response_schema(API_KEY, version), _Encoder(version))
