"""The consumer protocol embedded in classic groups' JoinGroup and SyncGroup payloads.

``ConsumerProtocolSubscription`` (a member's JoinGroup metadata) and
``ConsumerProtocolAssignment`` (what SyncGroup hands each member) are an int16 version followed
by the body; clients write versions 0-3. The coordinators read subscriptions (the topics a
classic group follows) and, for groups that change between the classic and the KIP-848
protocol, read and write assignments.
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Any

from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32

_MAX_EMBEDDED_VERSION = 3


class CustomAssignment(Exception):
    """An assignment with user data: a client-side assignor's state a server cannot keep."""


@dataclass(frozen=True, slots=True)
class Subscription:
    """A decoded ``ConsumerProtocolSubscription``; ``owned`` is topic name -> partitions."""

    version: int
    topics: tuple[str, ...]
    owned: dict[str, frozenset[int]]
    rack_id: str | None


def _schema(kind: str, version: int) -> Any:
    v = min(max(version, 0), _MAX_EMBEDDED_VERSION)
    module = __import__(f"kio.schema.consumer_protocol_{kind}.v{v}.data", fromlist=["_"])
    return module, v


def embedded_version(metadata: bytes) -> int:
    """The version a member's subscription was written in (its assignment is answered in it)."""
    if len(metadata) < 2:
        return 0
    return min(max(struct.unpack_from(">h", metadata, 0)[0], 0), _MAX_EMBEDDED_VERSION)


def _read(kind: str, data: bytes) -> tuple[int, Any]:
    """(version, body) of an embedded ``kind`` message; ``ValueError`` if it does not decode."""
    try:
        (version,) = struct.unpack_from(">h", data, 0)
        module, _v = _schema(kind, version)
        name = "ConsumerProtocol" + kind.capitalize()
        body, _ = entity_reader(getattr(module, name))(data, 2)
    except Exception as exc:
        raise ValueError(f"malformed consumer protocol {kind}: {exc}") from None
    return version, body


def decode_subscription(metadata: bytes) -> Subscription:
    """Raises ``ValueError`` when the bytes are not a consumer-protocol subscription."""
    version, sub = _read("subscription", metadata)
    owned = {tp.topic: frozenset(int(p) for p in tp.partitions)
             for tp in getattr(sub, "owned_partitions", ()) if tp.partitions}
    return Subscription(version, tuple(sub.topics), owned, getattr(sub, "rack_id", None))


def decode_assignment(data: bytes) -> dict[str, frozenset[int]]:
    """Topic name -> partitions of a ``ConsumerProtocolAssignment`` (empty bytes: nothing).

    Raises ``ValueError`` for bytes that do not decode, and ``CustomAssignment`` for an
    assignment carrying user data (a custom assignor's, which a server assignor cannot keep)."""
    if not data:
        return {}
    _version, assignment = _read("assignment", data)
    if assignment.user_data:
        raise CustomAssignment("an assignment with user data (a custom client-side assignor) "
                                "cannot be kept by a consumer group")
    return {tp.topic: frozenset(int(p) for p in tp.partitions)
            for tp in assignment.assigned_partitions if tp.partitions}


def encode_assignment(partitions: dict[str, frozenset[int]], version: int) -> bytes:
    """``ConsumerProtocolAssignment`` of topic name -> partitions, in ``version``."""
    module, v = _schema("assignment", version)
    body = module.ConsumerProtocolAssignment(
        assigned_partitions=tuple(
            module.TopicPartition(topic=name, partitions=tuple(i32(p) for p in sorted(ps)))
            for name, ps in sorted(partitions.items()) if ps),
        user_data=None)
    out = io.BytesIO()
    out.write(struct.pack(">h", v))
    entity_writer(module.ConsumerProtocolAssignment)(out, body)
    return out.getvalue()




__all__ = ["CustomAssignment", "Subscription", "decode_assignment", "decode_subscription",
           "embedded_version", "encode_assignment"]
