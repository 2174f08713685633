"""Every mutation of the store as a serialisable command.

Commands are what Raft orders and what ``StateMachine.apply`` executes. They
carry everything apply needs to be deterministic (notably ``now_ms``), so
every node that applies the same commands in the same order ends with the
same Sequences, the same segment boundaries and the same queue state.

Wire form (``encode``/``decode``): one tag byte, a 4-byte big-endian length,
that many bytes of JSON for the small fields, then the raw payload (a
RecordBatch for appends, nested encodings for ``Batch``).
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

_LEN = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class Command:
    tag: ClassVar[int] = 0
    payload_field: ClassVar[str | None] = None


@dataclass(frozen=True, slots=True)
class CreateChannel(Command):
    """Create an Events Store (``kind="events"``) or Queue (``kind="queue"``) channel."""

    tag: ClassVar[int] = 1
    name: str
    kind: str = "events"
    config: dict = field(default_factory=dict)
    exist_ok: bool = False


@dataclass(frozen=True, slots=True)
class DeleteChannel(Command):
    tag: ClassVar[int] = 2
    name: str
    missing_ok: bool = False


@dataclass(frozen=True, slots=True)
class SetChannelConfig(Command):
    """Replace a channel's LogConfig fields named in ``changes``."""

    tag: ClassVar[int] = 3
    name: str
    changes: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Append(Command):
    """Append one raw RecordBatch v2 to an Events Store channel."""

    tag: ClassVar[int] = 4
    payload_field: ClassVar[str | None] = "batch"
    name: str
    now_ms: int
    # bytes, or a read-only view of the request buffer the batch arrived in (never written
    # again: ``net/fast_requests``), so a produced batch is not copied before it is stored.
    batch: bytes | memoryview = b""
    # This node validated ``batch`` (CRC and all) before proposing it, so applying it here
    # skips a second CRC pass (the two took 9 % of a lone broker's produce CPU). Never
    # encoded: every other node, and a replay, checks the batch.
    checked: bool = field(default=False, compare=False, metadata={"local": True})


@dataclass(frozen=True, slots=True)
class TruncatePrefix(Command):
    """DeleteRecords: move the log start of a channel up to ``sequence``."""

    tag: ClassVar[int] = 5
    name: str
    sequence: int


@dataclass(frozen=True, slots=True)
class EnforceRetention(Command):
    """Drop whole segments past MaxAge/MaxBytes/MaxMsgs in every channel."""

    tag: ClassVar[int] = 6
    now_ms: int


@dataclass(frozen=True, slots=True)
class Compact(Command):
    """Start a compaction pass of one channel (installed when the I/O work is done)."""

    tag: ClassVar[int] = 7
    name: str
    now_ms: int


@dataclass(frozen=True, slots=True)
class QueueSend(Command):
    tag: ClassVar[int] = 10
    payload_field: ClassVar[str | None] = "batch"
    name: str
    now_ms: int
    batch: bytes = b""


@dataclass(frozen=True, slots=True)
class QueueReceive(Command):
    tag: ClassVar[int] = 11
    name: str
    max_messages: int
    visibility_ms: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class QueueAck(Command):
    tag: ClassVar[int] = 12
    name: str
    sequences: tuple = ()


@dataclass(frozen=True, slots=True)
class QueueNack(Command):
    tag: ClassVar[int] = 13
    name: str
    sequences: tuple = ()
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class QueueModifyDeadline(Command):
    tag: ClassVar[int] = 14
    name: str
    sequences: tuple = ()
    visibility_ms: int = 0
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class QueueExpire(Command):
    tag: ClassVar[int] = 15
    name: str
    now_ms: int


@dataclass(frozen=True, slots=True)
class KeyedPut(Command):
    """Write (key, value-or-None) pairs to a coordinator family; None deletes.

    ``expect`` holds (key, value-or-None) pairs that must match the applied
    state, or nothing is written (KeyConflict): a compare-and-set decided at
    apply time, so two nodes racing to create the same topic cannot both win.
    """

    tag: ClassVar[int] = 20
    family: str
    pairs: tuple = ()
    now_ms: int = 0
    expect: tuple = ()


@dataclass(frozen=True, slots=True)
class Batch(Command):
    """Several commands applied in order as one entry (e.g. create a topic's partitions).

    Apply stops at the first failing command and reports which one failed;
    commands before it stay applied.
    """

    tag: ClassVar[int] = 30
    commands: tuple = ()


_BY_TAG: dict[int, type[Command]] = {
    cls.tag: cls
    for cls in (
        CreateChannel, DeleteChannel, SetChannelConfig, Append, TruncatePrefix,
        EnforceRetention, Compact, QueueSend, QueueReceive, QueueAck, QueueNack,
        QueueModifyDeadline, QueueExpire, KeyedPut, Batch,
    )
}


def _to_json(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"b64"}:
            return base64.b64decode(value["b64"])
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_from_json(v) for v in value)
    return value


def encode(command: Command) -> bytes:
    """Serialise a command for the Raft log or a snapshot."""
    if isinstance(command, Batch):
        parts = [encode(c) for c in command.commands]
        payload = b"".join(_LEN.pack(len(p)) + p for p in parts)
        head = b"{}"
    else:
        small = {}
        payload = b""
        for f in fields(command):
            if f.metadata.get("local"):
                continue
            value = getattr(command, f.name)
            if f.name == command.payload_field:
                payload = bytes(value)
            else:
                small[f.name] = _to_json(value)
        head = json.dumps(small, separators=(",", ":")).encode()
    return bytes([command.tag]) + _LEN.pack(len(head)) + head + payload


def decode(data: bytes | memoryview) -> Command:
    """Inverse of ``encode``; raises ValueError on anything malformed."""
    view = memoryview(data)
    if len(view) < 5:
        raise ValueError("command too short")
    cls = _BY_TAG.get(view[0])
    if cls is None:
        raise ValueError(f"unknown command tag {view[0]}")
    (head_len,) = _LEN.unpack_from(view, 1)
    head = json.loads(bytes(view[5 : 5 + head_len]))
    payload = view[5 + head_len :]
    if cls is Batch:
        inner = []
        pos = 0
        while pos < len(payload):
            (n,) = _LEN.unpack_from(payload, pos)
            inner.append(decode(payload[pos + 4 : pos + 4 + n]))
            pos += 4 + n
        return Batch(commands=tuple(inner))
    kwargs = {k: _from_json(v) for k, v in head.items()}
    for k, v in list(kwargs.items()):
        if isinstance(v, tuple) and cls.__dataclass_fields__[k].type in ("dict",):
            kwargs[k] = dict(v)
    if cls.payload_field is not None:
        kwargs[cls.payload_field] = bytes(payload)
    return cls(**kwargs)


def as_dict(command: Command) -> dict:
    """A loggable view of a command (payloads summarised by size)."""
    out = asdict(command)
    if command.payload_field:
        out[command.payload_field] = f"<{len(getattr(command, command.payload_field))} bytes>"
    out["type"] = type(command).__name__
    return out
