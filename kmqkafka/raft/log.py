"""The in-memory Raft log the core works on, and a memory-backed persisted state.

``RaftLog`` is owned by ``RaftNode``: entries after the last snapshot, the commit and apply
positions, and the boundary between entries already handed out for persistence and entries not
yet handed out ("unstable"). ``MemoryStorage`` is what a driver persists from ``Ready``; a
node restarts from it. A disk-backed storage exposes the same three attributes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, Sequence

from kmqkafka.raft.messages import Entry, Snapshot, SnapshotMeta

if TYPE_CHECKING:
    from kmqkafka.raft.core import Ready

__all__ = ["HardState", "MemoryStorage", "RaftLog", "RestoredState"]


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be durable before any message that depends on it is sent."""

    term: int = 0
    vote: int | None = None
    commit: int = 0


class RestoredState(Protocol):
    """What a node is restarted from: the persisted hard state, snapshot and log entries.

    ``entries`` are contiguous and start right after ``snapshot.meta.index`` (or at 1).
    """

    hard_state: HardState
    snapshot: Snapshot | None
    entries: Sequence[Entry]


@dataclass
class MemoryStorage:
    """Persisted Raft state held in memory (tests, simulations, and the model for disk storage)."""

    hard_state: HardState = field(default_factory=HardState)
    snapshot: Snapshot | None = None
    entries: list[Entry] = field(default_factory=list)

    def save(self, ready: "Ready", sync_entries: bool = True) -> None:
        """Persist one Ready in its required order: snapshot, then entries, then hard state.
        (``sync_entries`` means nothing in memory; ``DiskStorage.save`` explains it.)

        A snapshot replaces the whole persisted log. ``ready.entries`` overwrite from their first
        index: every stored entry at or after ``ready.entries[0].index`` is dropped first.
        """
        if ready.snapshot is not None:
            self.snapshot = ready.snapshot
            self.entries = []
        if ready.entries:
            first = ready.entries[0].index
            base = self.snapshot.meta.index if self.snapshot else 0
            del self.entries[max(0, first - base - 1):]
            self.entries.extend(ready.entries)
        if ready.hard_state is not None:
            self.hard_state = ready.hard_state

    def compact(self, snapshot: Snapshot) -> None:
        """Persist a snapshot the application took locally and drop the entries it covers."""
        base = self.snapshot.meta.index if self.snapshot else 0
        del self.entries[:max(0, snapshot.meta.index - base)]
        self.snapshot = snapshot


class RaftLog:
    """Entries ``(snap_index, last_index]`` plus commit/apply/persist positions.

    Invariants: ``snap_index <= applied <= committed <= last_index`` (except right after a
    snapshot restore, where applied == committed == snap_index) and
    ``snap_index < unstable <= last_index + 1``.
    """

    def __init__(self, snapshot: SnapshotMeta, entries: Sequence[Entry]) -> None:
        self.snap_index = snapshot.index
        self.snap_term = snapshot.term
        self.entries: list[Entry] = list(entries)
        for offset, e in enumerate(self.entries):
            if e.index != self.snap_index + 1 + offset:
                raise ValueError("restored entries are not contiguous after the snapshot")
        self.committed = self.snap_index
        self.applied = self.snap_index
        self.unstable = self.last_index() + 1

    def last_index(self) -> int:
        return self.snap_index + len(self.entries)

    def first_index(self) -> int:
        return self.snap_index + 1

    def last_term(self) -> int:
        return self.entries[-1].term if self.entries else self.snap_term

    def term_at(self, index: int) -> int | None:
        """The term of the entry at ``index``; None if compacted away or beyond the end."""
        if index == self.snap_index:
            return self.snap_term
        offset = index - self.snap_index - 1
        if 0 <= offset < len(self.entries):
            return self.entries[offset].term
        return None

    def match_term(self, index: int, term: int) -> bool:
        return self.term_at(index) == term

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Raft's voting rule: is a candidate's log at least as up to date as ours?"""
        mine = self.last_term()
        return last_term > mine or (last_term == mine and last_index >= self.last_index())

    def slice(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry] | None:
        """Entries ``[lo, hi)``, cut after ``max_bytes`` (at least one entry); None if ``lo`` is
        compacted."""
        if lo <= self.snap_index:
            return None
        hi = min(hi, self.last_index() + 1)
        if lo >= hi:
            return []
        out = self.entries[lo - self.snap_index - 1:hi - self.snap_index - 1]
        if max_bytes is not None:
            total = 0
            for n, e in enumerate(out):
                total += e.size
                if total > max_bytes and n > 0:
                    return out[:n]
        return out

    def append(self, entries: Sequence[Entry]) -> None:
        """Write ``entries`` from their first index, dropping anything at or after it."""
        if not entries:
            return
        first = entries[0].index
        if not self.snap_index < first <= self.last_index() + 1:
            raise AssertionError(f"append at {first} outside ({self.snap_index}, "
                                 f"{self.last_index() + 1}]")
        if first <= self.committed:
            raise AssertionError(f"overwriting committed entry {first} <= {self.committed}")
        del self.entries[first - self.snap_index - 1:]
        self.entries.extend(entries)
        self.unstable = min(self.unstable, first)

    def find_conflict(self, entries: Sequence[Entry]) -> int:
        """Index of the first entry whose term differs from ours (or that we lack); 0 if none."""
        for e in entries:
            if self.term_at(e.index) != e.term:
                return e.index
        return 0

    def find_conflict_by_term(self, index: int, term: int) -> int:
        """The largest index ``<= index`` whose entry has term ``<= term`` (or the snapshot)."""
        index = min(index, self.last_index())
        while index > self.snap_index:
            t = self.term_at(index)
            if t is not None and t <= term:
                break
            index -= 1
        return index

    def commit_to(self, index: int) -> bool:
        """Raise the commit index (never lowers it). Returns True if it moved."""
        if index <= self.committed:
            return False
        if index > self.last_index():
            raise AssertionError(f"commit {index} beyond last index {self.last_index()}")
        self.committed = index
        return True

    def unstable_entries(self) -> list[Entry]:
        return self.entries[self.unstable - self.snap_index - 1:]

    def stable_to(self, index: int, term: int) -> None:
        """Entries up to ``(index, term)`` were persisted. Ignored if the log changed since (a
        matching (index, term) implies an identical prefix, so the check suffices)."""
        if self.term_at(index) == term and index >= self.unstable:
            self.unstable = index + 1

    def swap_applied(self, entries: Sequence[Entry]) -> int:
        """Put other copies (same index and term, e.g. without their data) in place of
        applied, persisted entries; others are left alone. Returns how many were swapped."""
        n = 0
        for e in entries:
            offset = e.index - self.snap_index - 1
            if (0 <= offset < len(self.entries) and e.index <= self.applied
                    and e.index < self.unstable and self.entries[offset].term == e.term):
                self.entries[offset] = e
                n += 1
        return n

    def restore(self, meta: SnapshotMeta) -> None:
        """Replace the whole log by a snapshot."""
        self.snap_index, self.snap_term = meta.index, meta.term
        self.entries = []
        self.committed = self.applied = meta.index
        self.unstable = meta.index + 1

    def compact(self, index: int) -> None:
        """Drop entries up to ``index`` (which must be applied)."""
        if index <= self.snap_index:
            return
        if index > self.applied:
            raise ValueError(f"cannot compact to {index}: only applied up to {self.applied}")
        term = self.term_at(index)
        assert term is not None
        del self.entries[:index - self.snap_index]
        self.snap_index, self.snap_term = index, term
