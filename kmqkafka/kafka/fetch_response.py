"""Fetch responses (v4-v18) encoded by hand: a consumer asks several times a second per
partition, and kio took two thirds of an empty long-poll answer's cost to encode it.

The layout, from Apache Kafka's FetchResponse.json: the throttle time, then (v7+) an error
code and the session id, then ``responses``: per topic its name, or from v13 its id, then its
partitions: index, error code, high watermark, last stable offset, log start offset (v5+),
aborted transactions (a nullable array), the preferred read replica (v11+) and the records
(nullable bytes). From v12 the message is flexible (compact arrays and strings, a tagged-field
section after every struct). A response with a tagged field set (a partition's
``diverging_epoch``, ``current_leader`` or ``snapshot_id``, the top-level ``node_endpoints``,
v16+) is left to kio: ``encode_body`` returns None.

Stored batches are not copied here: the body comes back as pieces, the records values among
them as they are (a ``RecordChain`` contributes its parts), as ``net/chunks.py`` keeps them.
"""
from __future__ import annotations

import struct
import sys
from typing import Any

from kio.index import load_response_schema

from kmqkafka.net import fast_bodies
from kmqkafka.net.fast_bodies import NO_TAGS, ZERO_UUID, count, string, uvarint
from kmqkafka.net.chunks import RecordChain

API_KEY = 1
FIRST_VERSION = 4
LAST_VERSION = 18

_I32 = struct.Struct(">i")
_TOP_V7 = struct.Struct(">ihi")         # throttle, error code, session id
_PART = struct.Struct(">ihqq")          # index, error code, high watermark, last stable offset
_PART_V5 = struct.Struct(">ihqqq")      # ... and log start offset
_ABORTED = struct.Struct(">qq")
_SMALL = 16 * 1024  # smaller records values are joined with the fields around them


class _Encoder:
    """The body encoder of one FetchResponse version."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.flexible = version >= 12
        module = sys.modules[load_response_schema(API_KEY, version).__module__]
        self.defaults = None
        if self.flexible:
            self.defaults = (module.EpochEndOffset(epoch=-1, end_offset=-1),
                             module.LeaderIdAndEpoch(leader_id=-1, leader_epoch=-1),
                             module.SnapshotId(end_offset=-1, epoch=-1))

    def _count(self, n: int) -> bytes:
        return count(n, self.flexible)

    def __call__(self, response: Any) -> list[Any] | None:
        v = self.version
        flexible = self.flexible
        if v >= 16 and response.node_endpoints:
            return None
        throttle = round(response.throttle_time.total_seconds() * 1000)
        pending: list[bytes] = [
            _TOP_V7.pack(throttle, response.error_code.value, response.session_id) if v >= 7
            else _I32.pack(throttle),
            self._count(len(response.responses)),
        ]
        out: list[Any] = []
        for topic in response.responses:
            if v >= 13:
                pending.append(ZERO_UUID if topic.topic_id is None else topic.topic_id.bytes)
            else:
                pending.append(string(topic.topic, flexible))
            pending.append(self._count(len(topic.partitions)))
            for p in topic.partitions:
                if flexible and (p.diverging_epoch, p.current_leader, p.snapshot_id) \
                        != self.defaults:
                    return None
                if v >= 5:
                    pending.append(_PART_V5.pack(p.partition_index, p.error_code.value,
                                                 p.high_watermark, p.last_stable_offset,
                                                 p.log_start_offset))
                else:
                    pending.append(_PART.pack(p.partition_index, p.error_code.value,
                                              p.high_watermark, p.last_stable_offset))
                aborted = p.aborted_transactions
                if aborted is None:
                    pending.append(b"\x00" if flexible else _I32.pack(-1))
                else:
                    pending.append(self._count(len(aborted)))
                    for a in aborted:
                        pending.append(_ABORTED.pack(a.producer_id, a.first_offset))
                        if flexible:
                            pending.append(NO_TAGS)
                if v >= 11:
                    pending.append(_I32.pack(p.preferred_read_replica))
                records = p.records
                if records is None:
                    pending.append(b"\x00" if flexible else _I32.pack(-1))
                else:
                    size = len(records)
                    pending.append(uvarint(size + 1) if flexible else _I32.pack(size))
                    if size < _SMALL:
                        pending.append(bytes(records) if type(records) is not bytes
                                       else records)
                    else:
                        out.append(b"".join(pending))
                        pending = []
                        if type(records) is RecordChain:
                            out.extend(records.parts)
                        else:
                            out.append(records)
                if flexible:
                    pending.append(NO_TAGS)
            if flexible:
                pending.append(NO_TAGS)
        if flexible:
            pending.append(NO_TAGS)
        out.append(b"".join(pending))
        return out


def install() -> None:
    """Register the encoders of every supported version with ``net/fast_bodies``."""
    for version in range(FIRST_VERSION, LAST_VERSION + 1):
        fast_bodies.register(load_response_schema(API_KEY, version), _Encoder(version))
