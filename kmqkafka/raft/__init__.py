"""Raft: orders the store's commands. ``core`` is the pure state machine; see its docstring
for the driver contract (persist, send, apply, advance)."""
from kmqkafka.raft.core import (
    ConfChangeInProgress, NotLeader, ProposalDropped, RaftNode, ReadState, Ready, Role, SoftState,
)
from kmqkafka.raft.log import HardState, MemoryStorage, RaftLog, RestoredState
from kmqkafka.raft.messages import (
    ConfChange, ConfChangeOp, DecodeError, Entry, EntryKind, Message, Snapshot, SnapshotMeta,
    decode, encode,
)

__all__ = [
    "ConfChange", "ConfChangeInProgress", "ConfChangeOp", "DecodeError", "Entry", "EntryKind",
    "HardState", "MemoryStorage", "Message", "NotLeader", "ProposalDropped", "RaftLog", "RaftNode",
    "ReadState", "Ready", "RestoredState", "Role", "Snapshot", "SnapshotMeta", "SoftState",
    "decode", "encode",
]
