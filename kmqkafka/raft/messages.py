"""Raft wire types: log entries, snapshots and the messages peers exchange.

Everything here is an immutable value. ``encode``/``decode`` give a compact binary form a
transport can carry; entry and snapshot data stay raw bytes (never re-encoded).

Frame layout (big endian): ``u8 version, u8 type, u64 frm, u64 to, u64 term`` followed by the
type's fields in declaration order: integers as u64, booleans as u8, byte strings as
``u32 length + bytes``, entry lists as ``u32 count`` then per entry
``u64 index, u64 term, u8 kind, u32 length, data``, a snapshot as
``u64 index, u64 term, u32 n, n × u64 voter, u64 length, data``.
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar, Union

__all__ = [
    "ELIDED", "Append", "AppendResp", "ConfChange", "ConfChangeOp", "DecodeError", "Entry",
    "EntryKind",
    "Heartbeat", "HeartbeatResp", "InstallSnapshot", "InstallSnapshotResp", "Message", "MsgType",
    "Gather", "PreVote", "PreVoteResp", "Snapshot", "SnapshotMeta", "TimeoutNow", "Vote",
    "VoteResp", "decode", "encode", "encode_parts", "FrameBuffer", "Stored", "loaded",
]

_VERSION = 1


class EntryKind(enum.IntEnum):
    """What a log entry carries: an application command, a membership change, or nothing."""

    NORMAL = 0
    CONF_CHANGE = 1
    NO_OP = 2


class Gather:
    """Entry data kept as the pieces it is made of (zero copy), for the node that proposed
    it: ``DiskStorage`` writes the pieces with one ``pwritev`` and CRCs them in turn, so the
    log record is byte-identical to one written from ``bytes(gather)``, and an Append to a
    follower carries them as they are (``encode_parts``); after a restart, or on any other
    node, the entry is plain bytes.

    ``payload`` is an opaque object the proposing application may attach (e.g. the commands
    the bytes encode, so applying its own entry needs no decode)."""

    __slots__ = ("parts", "size", "payload")

    def __init__(self, parts: list, payload: object = None) -> None:
        self.parts = parts
        self.size = sum(len(p) for p in parts)
        self.payload = payload

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Gather):
            return bytes(self) == bytes(other)
        if isinstance(other, (bytes, bytearray, memoryview)):
            return bytes(self) == bytes(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class Stored:
    """Entry data that lives only in the Raft log's file, once this node has applied it:
    ``DiskStorage`` hands these out, the driver puts them in place of the bytes, and the
    bytes are read back (and checked) only if a lagging follower needs the entry or a
    restarted node replays it. A node's memory then holds the entries it has not applied
    yet, not everything since the last snapshot (256 MiB per node on a busy cluster).

    ``read(at, size)`` returns the data of the record at file offset ``at``; it is a bound
    method of the file's reader, so holding a ``Stored`` keeps that file readable."""

    __slots__ = ("size", "_read", "_at")

    def __init__(self, read: Callable[[int, int], Any], at: int, size: int) -> None:
        self._read = read
        self._at = at
        self.size = size

    def __len__(self) -> int:
        return self.size

    def load(self) -> Any:
        """The bytes (a buffer), read from the file now."""
        return self._read(self._at, self.size)

    def __bytes__(self) -> bytes:
        return bytes(self.load())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Stored, Gather, bytes, bytearray, memoryview)):
            return bytes(self) == bytes(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def loaded(entry: "Entry") -> "Entry":
    """``entry`` with its data in memory (read back if it is ``Stored``)."""
    if type(entry.data) is Stored:
        return Entry(entry.index, entry.term, entry.kind, entry.data.load())
    return entry


class FrameBuffer(bytearray):
    """One received frame, read straight into a buffer of its own by the transport and never
    changed after: a decoder may keep views of it as safely as of ``bytes``."""

    __slots__ = ()


ELIDED = b"\xf1"
"""The data of an entry written to a one-member cluster's Raft log without its command: the
command's effect was made durable by the application itself (see ``RaftDriver``'s
write-through). No command encoding is this one byte."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One log entry. ``(index, term)`` identifies it across the whole cluster."""

    index: int
    term: int
    kind: EntryKind = EntryKind.NORMAL
    data: bytes = b""

    @property
    def size(self) -> int:
        """Bytes this entry costs on the wire (used by flow control)."""
        return len(self.data) + 21


class ConfChangeOp(enum.IntEnum):
    ADD = 0
    REMOVE = 1


@dataclass(frozen=True, slots=True)
class ConfChange:
    """A single-server membership change; the payload of a ``CONF_CHANGE`` entry.

    ``voters`` is the whole configuration after the change, so a node that joins with an empty
    configuration learns it from the first change entry it receives.
    Encoded as ``u8 op, u64 node_id, u32 n, n × u64 voter``.
    """

    op: ConfChangeOp
    node_id: int
    voters: frozenset[int]

    @classmethod
    def of(cls, op: ConfChangeOp, node_id: int, current: frozenset[int]) -> "ConfChange":
        """The change ``op node_id`` applied to the configuration ``current``."""
        after = current | {node_id} if op is ConfChangeOp.ADD else current - {node_id}
        return cls(op, node_id, frozenset(after))

    def encode(self) -> bytes:
        voters = sorted(self.voters)
        return struct.pack(f">BQI{len(voters)}Q", self.op, self.node_id, len(voters), *voters)

    @classmethod
    def decode(cls, data: bytes) -> "ConfChange":
        op, node_id, n = struct.unpack_from(">BQI", data)
        voters = struct.unpack_from(f">{n}Q", data, 13)
        return cls(ConfChangeOp(op), node_id, frozenset(voters))


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """The log position a snapshot covers and the voter set in force at that position."""

    index: int
    term: int
    voters: frozenset[int]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Application state up to ``meta.index``; ``data`` is opaque to Raft."""

    meta: SnapshotMeta
    data: bytes = b""


class MsgType(enum.IntEnum):
    PRE_VOTE = 1
    PRE_VOTE_RESP = 2
    VOTE = 3
    VOTE_RESP = 4
    APPEND = 5
    APPEND_RESP = 6
    HEARTBEAT = 7
    HEARTBEAT_RESP = 8
    INSTALL_SNAPSHOT = 9
    INSTALL_SNAPSHOT_RESP = 10
    TIMEOUT_NOW = 11


@dataclass(frozen=True, slots=True)
class PreVote:
    """"Would you vote for me in ``term``?" ``term`` is the sender's term + 1; nobody changes
    term because of it."""

    type: ClassVar[MsgType] = MsgType.PRE_VOTE
    frm: int
    to: int
    term: int
    last_index: int
    last_term: int


@dataclass(frozen=True, slots=True)
class PreVoteResp:
    """A granted pre-vote echoes the asked term; a refusal carries the voter's own term."""

    type: ClassVar[MsgType] = MsgType.PRE_VOTE_RESP
    frm: int
    to: int
    term: int
    granted: bool


@dataclass(frozen=True, slots=True)
class Vote:
    """A vote request. ``transfer`` is set when campaigning because of TimeoutNow, so voters
    skip their leader-lease check."""

    type: ClassVar[MsgType] = MsgType.VOTE
    frm: int
    to: int
    term: int
    last_index: int
    last_term: int
    transfer: bool = False


@dataclass(frozen=True, slots=True)
class VoteResp:
    type: ClassVar[MsgType] = MsgType.VOTE_RESP
    frm: int
    to: int
    term: int
    granted: bool


@dataclass(frozen=True, slots=True)
class Append:
    """Entries following ``(prev_index, prev_term)``; an empty tuple is a probe."""

    type: ClassVar[MsgType] = MsgType.APPEND
    frm: int
    to: int
    term: int
    prev_index: int
    prev_term: int
    entries: tuple[Entry, ...]
    commit: int


@dataclass(frozen=True, slots=True)
class AppendResp:
    """On success ``match_index`` is the follower's last index known to match the leader.

    On rejection ``reject_index`` is the ``prev_index`` that did not match and
    ``(hint_index, hint_term)`` is the follower's last entry whose term is <= the asked
    ``prev_term``, so the leader can skip a whole term per round trip.
    """

    type: ClassVar[MsgType] = MsgType.APPEND_RESP
    frm: int
    to: int
    term: int
    success: bool
    match_index: int = 0
    reject_index: int = 0
    hint_index: int = 0
    hint_term: int = 0


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """``commit`` is capped at what the follower is known to hold; ``context`` is the
    newest pending read-index request (empty if none)."""

    type: ClassVar[MsgType] = MsgType.HEARTBEAT
    frm: int
    to: int
    term: int
    commit: int
    context: bytes = b""


@dataclass(frozen=True, slots=True)
class HeartbeatResp:
    type: ClassVar[MsgType] = MsgType.HEARTBEAT_RESP
    frm: int
    to: int
    term: int
    context: bytes = b""


@dataclass(frozen=True, slots=True)
class InstallSnapshot:
    type: ClassVar[MsgType] = MsgType.INSTALL_SNAPSHOT
    frm: int
    to: int
    term: int
    snapshot: Snapshot


@dataclass(frozen=True, slots=True)
class InstallSnapshotResp:
    """``match_index``: the follower's log now matches the leader up to here."""

    type: ClassVar[MsgType] = MsgType.INSTALL_SNAPSHOT_RESP
    frm: int
    to: int
    term: int
    match_index: int


@dataclass(frozen=True, slots=True)
class TimeoutNow:
    """Leadership transfer: campaign now, skipping pre-vote."""

    type: ClassVar[MsgType] = MsgType.TIMEOUT_NOW
    frm: int
    to: int
    term: int


Message = Union[PreVote, PreVoteResp, Vote, VoteResp, Append, AppendResp, Heartbeat,
                HeartbeatResp, InstallSnapshot, InstallSnapshotResp, TimeoutNow]

_CLASSES: dict[int, type] = {
    cls.type: cls
    for cls in (PreVote, PreVoteResp, Vote, VoteResp, Append, AppendResp, Heartbeat,
                HeartbeatResp, InstallSnapshot, InstallSnapshotResp, TimeoutNow)
}
# Per class: the fields after (frm, to, term) and their codec kind.
_KIND_OF_TYPE = {"int": "q", "bool": "b", "bytes": "s", "tuple[Entry, ...]": "e", "Snapshot": "n"}
_LAYOUT: dict[type, tuple[tuple[str, str], ...]] = {
    cls: tuple((f.name, _KIND_OF_TYPE[f.type]) for f in fields(cls)[3:])
    for cls in _CLASSES.values()
}

_HEAD = struct.Struct(">BBQQQ")
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_ENTRY_HEAD = struct.Struct(">QQBI")


class DecodeError(ValueError):
    """The bytes are not a valid message frame."""


def encode_parts(message: Message) -> list[bytes]:
    """``encode(message)`` as a list of pieces (bytes, or the views and ``Gather`` parts entry
    data is made of) whose concatenation is the frame.

    Entry, context and snapshot data are referenced, never copied (a transport hands the
    pieces to ``writeSequence``), so encoding an Append for several followers costs only its
    small headers per follower."""
    mtype = message.type
    if mtype is MsgType.APPEND:
        return _append_parts(message)  # type: ignore[arg-type]
    parts: list[bytes] = []
    out = bytearray(_HEAD.pack(_VERSION, mtype, message.frm, message.to, message.term))
    for name, kind in _LAYOUT[type(message)]:
        value = getattr(message, name)
        if kind == "q":
            out += _U64.pack(value)
        elif kind == "b":
            out.append(1 if value else 0)
        elif kind == "s":
            out += _U32.pack(len(value))
            if len(value) <= 64:
                out += value
            else:
                parts.append(bytes(out))
                parts.append(_as_bytes(value))
                out = bytearray()
        elif kind == "e":
            raise AssertionError("entries only in Append")
        else:
            meta = value.meta
            out += _U64.pack(meta.index) + _U64.pack(meta.term) + _U32.pack(len(meta.voters))
            for v in sorted(meta.voters):
                out += _U64.pack(v)
            out += _U64.pack(len(value.data))
            parts.append(bytes(out))
            parts.append(_as_bytes(value.data))
            out = bytearray()
    if out or not parts:
        parts.append(bytes(out))
    return parts


def _as_bytes(data: object) -> bytes:
    if type(data) is bytes:
        return data  # type: ignore[return-value]
    return bytes(data)  # type: ignore[call-overload]


_APPEND_HEAD = struct.Struct(">BBQQQQQ")   # message head, prev_index, prev_term


def _append_parts(m: "Append") -> list[bytes]:
    entries = m.entries
    head = _APPEND_HEAD.pack(_VERSION, MsgType.APPEND, m.frm, m.to, m.term, m.prev_index,
                             m.prev_term) + _U32.pack(len(entries))
    parts: list[bytes] = []
    pack = _ENTRY_HEAD.pack
    for e in entries:
        data = e.data
        size = len(data)
        if size <= 64:
            head += pack(e.index, e.term, e.kind, size) + bytes(data)
        else:
            parts.append(head + pack(e.index, e.term, e.kind, size))
            if type(data) is Gather:
                parts.extend(data.parts)    # a leader's own entry: its pieces, never joined
            elif type(data) is Stored:
                parts.append(data.load())   # applied here already: read back from the log
            else:
                parts.append(data)          # bytes, or a view a follower kept (see decode)
            head = b""
    parts.append(head + _U64.pack(m.commit))
    return parts


def encode(message: Message) -> bytes:
    """Serialize ``message``; ``decode(encode(m)) == m``."""
    parts = encode_parts(message)
    return parts[0] if len(parts) == 1 else b"".join(parts)


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = memoryview(buf)
        self.pos = 0

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if end > len(self.buf):
            raise DecodeError("truncated message")
        chunk = self.buf[self.pos:end]
        self.pos = end
        return chunk

    def unpack(self, s: struct.Struct) -> tuple:
        return s.unpack(self.take(s.size))


_ENTRY_KINDS = {k.value: k for k in EntryKind}


SHARE_MIN = 16 * 1024
"""With ``decode(share=True)``, entry data at least this large stays a view of the frame."""


def _decode_append(data: memoryview, frm: int, to: int, term: int,
                   share: bool) -> "Append":
    """The Append fast path: each entry's data copied into its own ``bytes`` (no reference
    into ``data`` kept past the call), or with ``share`` a large one kept as a read-only
    view of ``data`` (no copy)."""
    end = len(data)
    if end < _APPEND_HEAD.size + 12:
        raise DecodeError("truncated message")
    prev_index, prev_term = struct.unpack_from(">QQ", data, _HEAD.size)
    pos = _APPEND_HEAD.size
    (count,) = _U32.unpack_from(data, pos)
    pos += 4
    entries = []
    unpack = _ENTRY_HEAD.unpack_from
    hsize = _ENTRY_HEAD.size
    kinds = _ENTRY_KINDS
    for _ in range(count):
        if pos + hsize > end:
            raise DecodeError("truncated message")
        index, eterm, ekind, size = unpack(data, pos)
        pos += hsize
        if pos + size > end:
            raise DecodeError("truncated message")
        kind = kinds.get(ekind)
        if kind is None:
            raise DecodeError(f"{ekind} is not a valid EntryKind")
        chunk = data[pos:pos + size]
        entries.append(Entry(index, eterm, kind,
                             chunk if share and size >= SHARE_MIN else bytes(chunk)))
        pos += size
    if pos + 8 > end:
        raise DecodeError("truncated message")
    (commit,) = _U64.unpack_from(data, pos)
    if pos + 8 != end:
        raise DecodeError("trailing bytes after message")
    return Append(frm, to, term, prev_index, prev_term, tuple(entries), commit)


_IMMUTABLE = (bytes, FrameBuffer)


def decode(data: bytes | bytearray | memoryview, share: bool = False) -> Message:
    """Parse one frame produced by ``encode``; raises ``DecodeError`` on malformed input.

    ``data`` may be a view into a caller's buffer: the message keeps no reference into it,
    unless ``share`` says that buffer may be kept alive and is immutable (``bytes`` or a
    ``FrameBuffer``): then an Append's large entries are views of it rather than copies."""
    if len(data) >= _HEAD.size and data[1] == MsgType.APPEND and data[0] == _VERSION:
        _v, _t, frm, to, term = _HEAD.unpack_from(data)
        view = memoryview(data)
        try:
            return _decode_append(view, frm, to, term,
                                  share and type(view.obj) in _IMMUTABLE)
        finally:
            view.release()
    r = _Reader(data)
    version, mtype, frm, to, term = r.unpack(_HEAD)
    if version != _VERSION:
        raise DecodeError(f"unknown version {version}")
    cls = _CLASSES.get(mtype)
    if cls is None:
        raise DecodeError(f"unknown message type {mtype}")
    values: list[object] = [frm, to, term]
    try:
        for _name, kind in _LAYOUT[cls]:
            if kind == "q":
                values.append(r.unpack(_U64)[0])
            elif kind == "b":
                values.append(r.take(1)[0] != 0)
            elif kind == "s":
                values.append(bytes(r.take(r.unpack(_U32)[0])))
            elif kind == "e":
                entries = []
                for _ in range(r.unpack(_U32)[0]):
                    index, eterm, ekind, size = r.unpack(_ENTRY_HEAD)
                    entries.append(Entry(index, eterm, EntryKind(ekind), bytes(r.take(size))))
                values.append(tuple(entries))
            else:
                index, sterm = r.unpack(_U64)[0], r.unpack(_U64)[0]
                voters = frozenset(r.unpack(_U64)[0] for _ in range(r.unpack(_U32)[0]))
                blob = bytes(r.take(r.unpack(_U64)[0]))
                values.append(Snapshot(SnapshotMeta(index, sterm, voters), blob))
    except ValueError as exc:  # a bad enum value
        if isinstance(exc, DecodeError):
            raise
        raise DecodeError(str(exc)) from exc
    if r.pos != len(data):
        raise DecodeError("trailing bytes after message")
    return cls(*values)
