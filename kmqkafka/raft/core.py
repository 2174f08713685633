"""The Raft core: a pure, deterministic state machine (no reactor, sockets, files or clock).

Inputs are ``tick()``, ``step(message)``, ``propose()``, ``propose_conf_change()``,
``read_index()``, ``transfer_leadership()`` and ``compact()``. Output is pulled with
``ready()``; the driver then, in this order:

1. persists ``ready.snapshot`` (replaces the whole log), ``ready.entries`` (overwrite from
   ``entries[0].index``: drop every stored entry at or after it, then append) and
   ``ready.hard_state``;
2. sends ``ready.messages`` (never before step 1: they may promise what was persisted);
3. applies ``ready.snapshot`` then ``ready.committed_entries`` to the state machine and serves
   ``ready.read_states`` once it has applied up to their index;
4. calls ``advance(ready)``.

``ready()`` must not be called again before ``advance()``; other inputs may arrive between the
two. A crashed node is rebuilt from what it persisted (``RestoredState``).

Protocol choices (Raft thesis, etcd-io/raft's design): pre-vote (§9.6), check-quorum and a
leader lease that makes voters ignore vote requests while they hear from a leader (§4.2.3,
§6.2), a no-op entry from every new leader (§6.4), read-index reads (§6.4), leadership transfer
with TimeoutNow (§3.10), single-server membership changes that take effect when appended
(§4.1), refused until the leader has committed an entry in its own term (the fix for the
single-server change bug Ongaro posted to raft-dev in 2015).
"""
from __future__ import annotations

import enum
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from kmqkafka.raft.log import HardState, RaftLog, RestoredState
from kmqkafka.raft.messages import (
    Append, AppendResp, ConfChange, ConfChangeOp, Entry, EntryKind, Heartbeat, HeartbeatResp,
    InstallSnapshot, InstallSnapshotResp, Message, PreVote, PreVoteResp, Snapshot, SnapshotMeta,
    TimeoutNow, Vote, VoteResp,
)

__all__ = [
    "ConfChangeInProgress", "NotLeader", "ProposalDropped", "RaftNode", "ReadState", "Ready",
    "Role", "SoftState",
]


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


class ProposalDropped(Exception):
    """The node cannot accept the request now; retrying later (or elsewhere) may succeed."""


class NotLeader(ProposalDropped):
    """Only the leader accepts this; ``leader`` is the best-known leader id (or None)."""

    def __init__(self, leader: int | None) -> None:
        super().__init__(f"not the leader (leader hint: {leader})")
        self.leader = leader


class ConfChangeInProgress(ProposalDropped):
    """A membership change is uncommitted, or this leader has not yet committed in its term."""


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile state the application may want to show or route by; never persisted."""

    leader: int | None
    role: Role


@dataclass(frozen=True, slots=True)
class ReadState:
    """A linearizable read requested with ``context`` may be served once applied >= ``index``."""

    index: int
    context: bytes


@dataclass(frozen=True, slots=True)
class Ready:
    """Everything the driver must do, in the order given in the module docstring.

    Fields that did not change are None (``soft_state``, ``hard_state``, ``snapshot``) or empty.
    """

    soft_state: SoftState | None = None
    hard_state: HardState | None = None
    snapshot: Snapshot | None = None
    entries: tuple[Entry, ...] = ()
    committed_entries: tuple[Entry, ...] = ()
    messages: tuple[Message, ...] = ()
    read_states: tuple[ReadState, ...] = ()


class _Flow(enum.Enum):
    PROBE = "probe"          # one Append outstanding at a time until a match is found
    REPLICATE = "replicate"  # pipelined Appends, bounded by the in-flight window
    SNAPSHOT = "snapshot"    # an InstallSnapshot is outstanding


@dataclass(slots=True)
class _Progress:
    """The leader's view of one follower."""

    match: int
    next: int
    flow: _Flow = _Flow.PROBE
    probe_sent: bool = False
    pending_snapshot: int = 0
    snapshot_elapsed: int = 0
    recent_active: bool = False
    quiet_ticks: int = 0  # leader ticks since the follower was last heard from
    inflight: deque[tuple[int, int]] = field(default_factory=deque)  # (last index, bytes)
    inflight_bytes: int = 0

    def become_probe(self) -> None:
        if self.flow is _Flow.SNAPSHOT:
            self.next = max(self.match + 1, self.pending_snapshot + 1)
        else:
            self.next = self.match + 1
        self.flow = _Flow.PROBE
        self.probe_sent = False
        self._clear_inflight()

    def become_replicate(self) -> None:
        self.flow = _Flow.REPLICATE
        self.next = self.match + 1
        self._clear_inflight()

    def become_snapshot(self, index: int) -> None:
        self.flow = _Flow.SNAPSHOT
        self.pending_snapshot = index
        self.snapshot_elapsed = 0
        self._clear_inflight()

    def _clear_inflight(self) -> None:
        self.inflight.clear()
        self.inflight_bytes = 0

    def free_to(self, index: int) -> None:
        while self.inflight and self.inflight[0][0] <= index:
            self.inflight_bytes -= self.inflight.popleft()[1]

    def update(self, match: int) -> bool:
        """Record an acknowledged match; True if it moved forward."""
        moved = match > self.match
        if moved:
            self.match = match
            self.probe_sent = False
        self.next = max(self.next, match + 1)
        return moved


@dataclass(slots=True)
class _PendingRead:
    index: int
    acks: set[int]


class RaftNode:
    """One Raft participant. Single-threaded: every method is called from the driver's thread.

    ``voters`` is the bootstrap configuration, used only when ``storage`` holds no snapshot;
    membership-change entries in the restored log are applied on top of it. A node joining an
    existing cluster starts with ``voters=set()`` and learns the configuration from the leader.
    """

    def __init__(self, node_id: int, voters: set[int] | frozenset[int],
                 storage: RestoredState, *, election_ticks: int = 10, heartbeat_ticks: int = 1,
                 rng: random.Random, pre_vote: bool = True, check_quorum: bool = True,
                 max_msg_bytes: int = 1 << 20, max_inflight_msgs: int = 128,
                 max_inflight_bytes: int = 32 << 20) -> None:
        """``max_inflight_msgs``/``max_inflight_bytes`` bound the Appends a leader pipelines to
        one follower before it waits for acknowledgements. 8 MiB was 40 ms of a 1 KiB
        produce stream, shorter than a loaded follower's write and fsync: alternating 8 and
        64 MiB within one 3-node cluster, produce ran at 208-284k against 240-300k msg/s;
        32 MiB did as well as 64 (bench/README.md)."""
        if node_id < 0:
            raise ValueError("node ids are integers from 0 up")
        if not 0 < heartbeat_ticks < election_ticks:
            raise ValueError("need 0 < heartbeat_ticks < election_ticks")
        self.id = node_id
        self._election_ticks = election_ticks
        self._heartbeat_ticks = heartbeat_ticks
        self._rng = rng
        self._pre_vote = pre_vote
        self._check_quorum = check_quorum
        self._max_msg_bytes = max_msg_bytes
        self._max_inflight_msgs = max_inflight_msgs
        self._max_inflight_bytes = max_inflight_bytes

        self.role = Role.FOLLOWER
        snap = storage.snapshot
        meta = snap.meta if snap is not None else SnapshotMeta(0, 0, frozenset(voters))
        self._log = RaftLog(meta, storage.entries)
        self._snapshot = snap
        # (index, voters in force from that index on); the first element is the base.
        self._conf: list[tuple[int, frozenset[int]]] = [(meta.index, meta.voters)]
        self._track_conf(self._log.entries)

        hs = storage.hard_state
        self.term = hs.term
        self.vote: int | None = hs.vote
        if hs.commit > self._log.last_index():
            raise ValueError(f"persisted commit {hs.commit} is beyond the log's last index")
        self._log.commit_to(hs.commit)
        self._prev_hard = HardState(self.term, self.vote, self._log.committed)

        self.leader: int | None = None
        self._prev_soft = SoftState(None, Role.FOLLOWER)
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._timeout = self._election_ticks
        self._votes: dict[int, bool] = {}
        self._progress: dict[int, _Progress] = {}
        self._transferee: int | None = None
        self._pending_conf_index = 0
        self._reads: dict[bytes, _PendingRead] = {}
        self._deferred_reads: list[bytes] = []
        self._msgs: list[Message] = []
        self._read_states: list[ReadState] = []
        self._pending_snapshot: Snapshot | None = None
        self._ready_out = False
        self._randomize_timeout()

    # ------------------------------------------------------------------ introspection

    @property
    def voters(self) -> frozenset[int]:
        """The configuration in force: the latest membership entry in the log, committed or not."""
        return self._conf[-1][1]

    @property
    def commit_index(self) -> int:
        return self._log.committed

    @property
    def applied_index(self) -> int:
        return self._log.applied

    @property
    def last_index(self) -> int:
        return self._log.last_index()

    def term_at(self, index: int) -> int | None:
        """The term of the local entry at ``index`` (None if compacted or absent)."""
        return self._log.term_at(index)

    def entries(self, lo: int, hi: int) -> list[Entry] | None:
        """Local entries ``[lo, hi)``; None if ``lo`` is compacted."""
        return self._log.slice(lo, hi)

    @property
    def snapshot_index(self) -> int:
        return self._log.snap_index

    def slowest_follower(self) -> int | None:
        """Leader: the lowest match index among the other voters heard from lately that the
        log can still catch up without a snapshot (above the snapshot index); None otherwise.
        Compacting
        the log past it would turn that follower's catch-up into a snapshot transfer."""
        if self.role is not Role.LEADER:
            return None
        # Heard within a few election timeouts: a follower busy catching up (or starved of CPU
        # by its neighbours) can miss one check-quorum round without being gone.
        window = 5 * self._election_ticks
        matches = [pr.match for v, pr in self._progress.items()
                   if v != self.id and pr.quiet_ticks <= window
                   and pr.match >= self._log.snap_index]
        return min(matches) if matches else None

    # ------------------------------------------------------------------ inputs

    def tick(self) -> None:
        """Advance logical time by one tick (the driver calls this on a fixed interval)."""
        if self.role is Role.LEADER:
            self._tick_leader()
            return
        self._election_elapsed += 1
        if self._promotable() and (self._election_elapsed >= self._timeout
                                   or self.voters == {self.id}):
            # A sole voter needs nobody's permission: it campaigns on its first tick.
            self._campaign(transfer=False)

    def propose(self, data: bytes) -> int:
        """Append an application command; returns its log index (commit is not promised).

        Raises ``NotLeader`` on a non-leader and ``ProposalDropped`` during a transfer.
        """
        return self._propose(EntryKind.NORMAL, data)

    def propose_conf_change(self, op: ConfChangeOp, node_id: int) -> int:
        """Add or remove one voter; returns the entry's index. The new configuration is used
        as soon as the entry is appended.

        Raises ``ConfChangeInProgress`` while a previous change is uncommitted or before this
        leader committed an entry in its term, and ``ValueError`` for a no-op change or one
        that would leave no voters.
        """
        self._require_leader()
        if self._pending_conf_index > self._log.committed or not self._committed_in_term():
            raise ConfChangeInProgress("a membership change is already in progress")
        change = ConfChange.of(op, node_id, self.voters)
        if change.voters == self.voters or not change.voters:
            raise ValueError(f"invalid membership change {op.name} {node_id} of "
                             f"{sorted(self.voters)}")
        index = self._propose(EntryKind.CONF_CHANGE, change.encode())
        self._pending_conf_index = index
        return index

    def read_index(self, context: bytes) -> None:
        """Start a linearizable read. A ``ReadState(index, context)`` appears in a later Ready
        once a quorum confirmed this node was still leader; the caller serves the read after
        applying up to ``index``. ``context`` must be unique among outstanding reads. Reads are
        silently dropped if leadership is lost (callers time out and retry)."""
        self._require_leader()
        if not context:
            raise ValueError("read contexts must be non-empty")
        if self.voters == {self.id}:
            self._read_states.append(ReadState(self._log.committed, context))
            return
        if not self._committed_in_term():
            # The commit index is not known to be current until our no-op commits.
            self._deferred_reads.append(context)
            return
        self._reads[context] = _PendingRead(self._log.committed, {self.id})
        self._broadcast_heartbeat(context)

    def transfer_leadership(self, to: int) -> None:
        """Hand leadership to voter ``to``: catch it up, then send it TimeoutNow. Proposals are
        refused until the transfer finishes or is abandoned after an election timeout."""
        self._require_leader()
        if to == self.id:
            return
        if to not in self.voters:
            raise ValueError(f"{to} is not a voter")
        self._transferee = to
        self._election_elapsed = 0
        pr = self._progress[to]
        if pr.match == self._log.last_index():
            self._send(TimeoutNow(self.id, to, self.term))
        else:
            self._send_append(to)

    def transfer_target(self) -> int | None:
        """The voter a leader should hand over to: the most up-to-date follower (highest
        match), preferring ones heard from in the current election timeout; None if this node
        is not a leader or leads alone."""
        if self.role is not Role.LEADER:
            return None
        best: tuple[tuple[bool, int, int], int] | None = None
        for v in self.voters - {self.id}:
            pr = self._progress.get(v)
            if pr is None:
                continue
            key = (pr.recent_active, pr.match, -v)
            if best is None or key > best[0]:
                best = (key, v)
        return best[1] if best is not None else None

    def match_of(self, peer: int) -> int:
        """Leader only: the highest index known replicated on ``peer`` (-1 otherwise)."""
        pr = self._progress.get(peer) if self.role is Role.LEADER else None
        return pr.match if pr is not None else -1

    def match_indexes(self) -> dict[int, int]:
        """Leader only: the highest index known replicated on each other voter ({} otherwise);
        what replication lag is measured against."""
        if self.role is not Role.LEADER:
            return {}
        return {peer: pr.match for peer, pr in self._progress.items() if peer != self.id}

    @property
    def transferring(self) -> int | None:
        """The voter a transfer in progress hands leadership to, if any."""
        return self._transferee

    def swap_applied(self, entries: Sequence[Entry]) -> int:
        """Replace applied, persisted entries by copies with the same index and term: a
        one-member cluster's ELIDED entries, or any node's ``Stored`` ones (their bytes left
        in the Raft log's file), so the log does not hold applied data until the next
        compaction."""
        return self._log.swap_applied(entries)

    def compact(self, index: int, data: bytes) -> Snapshot:
        """The application saved its state up to ``index`` (<= applied) as ``data``: drop the
        log prefix. Returns the snapshot; the driver persists it (``MemoryStorage.compact``)
        and it is what lagging followers receive."""
        if index <= self._log.snap_index:
            raise ValueError(f"already compacted to {self._log.snap_index}")
        term = self._log.term_at(index)
        if term is None or index > self._log.applied:
            raise ValueError(f"cannot compact to {index}: applied is {self._log.applied}")
        snapshot = Snapshot(SnapshotMeta(index, term, self._voters_at(index)), data)
        self._log.compact(index)
        self._conf = [(index, snapshot.meta.voters)] + [c for c in self._conf if c[0] > index]
        self._snapshot = snapshot
        return snapshot

    def step(self, m: Message) -> None:
        """Handle one message from a peer. Messages may be lost, duplicated or reordered."""
        if m.to != self.id:
            return
        if m.term > self.term:
            if isinstance(m, (PreVote, Vote)):
                transfer = isinstance(m, Vote) and m.transfer
                if not transfer and self._in_lease():
                    return  # we hear from a leader: do not let a straggler disrupt it
            if isinstance(m, PreVote) or (isinstance(m, PreVoteResp) and m.granted):
                pass  # pre-votes never change anybody's term
            elif isinstance(m, (Append, Heartbeat, InstallSnapshot)):
                self._become_follower(m.term, m.frm)
            else:
                self._become_follower(m.term, None)
        elif m.term < self.term:
            if isinstance(m, (Append, Heartbeat)) and (self._check_quorum or self._pre_vote):
                # A stale leader may never hear of our term otherwise (pre-vote and leases stop
                # us from disrupting it): tell it.
                self._send(AppendResp(self.id, m.frm, self.term, False))
            elif isinstance(m, PreVote):
                self._send(PreVoteResp(self.id, m.frm, self.term, False))
            return

        if isinstance(m, (PreVote, Vote)):
            self._handle_vote_request(m)
        elif self.role is Role.LEADER:
            self._step_leader(m)
        elif self.role is Role.FOLLOWER:
            self._step_follower(m)
        else:
            self._step_candidate(m)

    # ------------------------------------------------------------------ output

    def has_ready(self) -> bool:
        """True if ``ready()`` would return something."""
        log = self._log
        return bool(
            self._msgs or self._read_states or self._pending_snapshot is not None
            or log.unstable <= log.last_index() or log.committed > log.applied
            or self._hard_state() != self._prev_hard or self._soft_state() != self._prev_soft)

    def ready(self) -> Ready | None:
        """What to persist, send and apply now; None if nothing. Call ``advance`` after."""
        if self._ready_out:
            raise RuntimeError("ready() called again before advance()")
        if not self.has_ready():
            return None
        hard, soft = self._hard_state(), self._soft_state()
        log = self._log
        committed = log.slice(log.applied + 1, log.committed + 1) or []
        self._ready_out = True
        return Ready(
            soft_state=soft if soft != self._prev_soft else None,
            hard_state=hard if hard != self._prev_hard else None,
            snapshot=self._pending_snapshot,
            entries=tuple(log.unstable_entries()),
            committed_entries=tuple(committed),
            messages=tuple(self._msgs),
            read_states=tuple(self._read_states),
        )

    def advance(self, ready: Ready) -> None:
        """The driver persisted, sent and applied everything in ``ready``."""
        self._ready_out = False
        if ready.hard_state is not None:
            self._prev_hard = ready.hard_state
        if ready.soft_state is not None:
            self._prev_soft = ready.soft_state
        if ready.snapshot is not None and ready.snapshot is self._pending_snapshot:
            self._pending_snapshot = None
        if ready.entries:
            last = ready.entries[-1]
            self._log.stable_to(last.index, last.term)
        if ready.committed_entries:
            self._log.applied = max(self._log.applied, ready.committed_entries[-1].index)
        del self._msgs[:len(ready.messages)]
        del self._read_states[:len(ready.read_states)]

    # ------------------------------------------------------------------ roles

    def _reset(self, term: int) -> None:
        if term != self.term:
            self.term = term
            self.vote = None
        self.leader = None
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._randomize_timeout()
        self._votes = {}
        self._progress = {}
        self._transferee = None
        self._reads = {}
        self._deferred_reads = []

    def _become_follower(self, term: int, leader: int | None) -> None:
        self._reset(term)
        self.role = Role.FOLLOWER
        self.leader = leader

    def _campaign(self, transfer: bool) -> None:
        if self._pre_vote and not transfer:
            # Ask first, at term+1, without touching our own term or vote.
            self.role = Role.PRE_CANDIDATE
            self.leader = None
            self._votes = {}
            self._election_elapsed = 0
            self._randomize_timeout()
            term = self.term + 1
            if self._poll(self.id, True):
                self._campaign(transfer=True)
                return
            for peer in sorted(self.voters - {self.id}):
                self._send(PreVote(self.id, peer, term, self._log.last_index(),
                                   self._log.last_term()))
            return
        self._reset(self.term + 1)
        self.role = Role.CANDIDATE
        self.vote = self.id
        if self._poll(self.id, True):
            self._become_leader()
            return
        for peer in sorted(self.voters - {self.id}):
            self._send(Vote(self.id, peer, self.term, self._log.last_index(),
                            self._log.last_term(), transfer))

    def _poll(self, voter: int, granted: bool) -> bool | None:
        """Record a (pre-)vote; True once a quorum granted, False once a quorum refused."""
        if voter in self.voters:
            self._votes.setdefault(voter, granted)
        yes = sum(1 for g in self._votes.values() if g)
        if yes >= self._quorum():
            return True
        if len(self._votes) - yes >= self._quorum():
            return False
        return None

    def _become_leader(self) -> None:
        self._reset(self.term)
        self.role = Role.LEADER
        self.leader = self.id
        last = self._log.last_index()
        self._progress = {v: _Progress(match=0, next=last + 1) for v in self.voters}
        if self.id in self._progress:
            self._progress[self.id].match = last
        self._pending_conf_index = last
        self._append([Entry(0, 0, EntryKind.NO_OP)])
        self._broadcast_append()

    def _step_down_if_removed(self) -> None:
        """A leader outside the configuration leaves once its removal is committed."""
        if (self.role is Role.LEADER and self.id not in self.voters
                and self._conf[-1][0] <= self._log.committed):
            self._become_follower(self.term, None)

    # ------------------------------------------------------------------ votes

    def _handle_vote_request(self, m: PreVote | Vote) -> None:
        pre = isinstance(m, PreVote)
        can_vote = (self.vote == m.frm or (self.vote is None and self.leader is None)
                    or (pre and m.term > self.term))
        if can_vote and self._log.is_up_to_date(m.last_index, m.last_term):
            if pre:
                self._send(PreVoteResp(self.id, m.frm, m.term, True))
            else:
                self._election_elapsed = 0
                self.vote = m.frm
                self._send(VoteResp(self.id, m.frm, m.term, True))
        elif pre:
            self._send(PreVoteResp(self.id, m.frm, self.term, False))
        else:
            self._send(VoteResp(self.id, m.frm, self.term, False))

    def _step_candidate(self, m: Message) -> None:
        if isinstance(m, (Append, Heartbeat, InstallSnapshot)):
            # Same term: somebody else won.
            self._become_follower(self.term, m.frm)
            self._step_follower(m)
        elif isinstance(m, PreVoteResp) and self.role is Role.PRE_CANDIDATE:
            result = self._poll(m.frm, m.granted)
            if result is True:
                self._campaign(transfer=True)
            elif result is False:
                self._become_follower(self.term, None)
        elif isinstance(m, VoteResp) and self.role is Role.CANDIDATE:
            result = self._poll(m.frm, m.granted)
            if result is True:
                self._become_leader()
            elif result is False:
                self._become_follower(self.term, None)

    # ------------------------------------------------------------------ follower

    def _step_follower(self, m: Message) -> None:
        if isinstance(m, Append):
            self._election_elapsed = 0
            self.leader = m.frm
            self._handle_append(m)
        elif isinstance(m, Heartbeat):
            self._election_elapsed = 0
            self.leader = m.frm
            if m.commit > self._log.committed:
                self._log.commit_to(min(m.commit, self._log.last_index()))
            self._send(HeartbeatResp(self.id, m.frm, self.term, m.context))
        elif isinstance(m, InstallSnapshot):
            self._election_elapsed = 0
            self.leader = m.frm
            self._handle_snapshot(m)
        elif isinstance(m, TimeoutNow):
            if self._promotable():
                self._campaign(transfer=True)

    def _handle_append(self, m: Append) -> None:
        log = self._log
        if m.prev_index < log.committed:
            self._send(AppendResp(self.id, m.frm, self.term, True, match_index=log.committed))
            return
        if log.match_term(m.prev_index, m.prev_term):
            last_new = m.prev_index + len(m.entries)
            conflict = log.find_conflict(m.entries)
            if conflict:
                fresh = m.entries[conflict - m.prev_index - 1:]
                log.append(fresh)
                self._conf = [c for c in self._conf if c[0] < conflict]
                self._track_conf(fresh)
            log.commit_to(min(m.commit, last_new))
            self._send(AppendResp(self.id, m.frm, self.term, True, match_index=last_new))
            return
        hint = log.find_conflict_by_term(min(m.prev_index, log.last_index()), m.prev_term)
        self._send(AppendResp(self.id, m.frm, self.term, False, reject_index=m.prev_index,
                              hint_index=hint, hint_term=log.term_at(hint) or 0))

    def _handle_snapshot(self, m: InstallSnapshot) -> None:
        log = self._log
        meta = m.snapshot.meta
        if meta.index <= log.committed:
            self._send(InstallSnapshotResp(self.id, m.frm, self.term, log.committed))
            return
        if log.match_term(meta.index, meta.term):
            # We already hold the covered entries: just learn that they are committed.
            log.commit_to(meta.index)
        else:
            log.restore(meta)
            self._conf = [(meta.index, meta.voters)]
            self._snapshot = m.snapshot
            self._pending_snapshot = m.snapshot
        self._send(InstallSnapshotResp(self.id, m.frm, self.term, meta.index))

    # ------------------------------------------------------------------ leader

    def _tick_leader(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        for pr in self._progress.values():
            pr.quiet_ticks += 1
            if pr.flow is _Flow.SNAPSHOT:
                pr.snapshot_elapsed += 1
                if pr.snapshot_elapsed >= self._election_ticks:
                    pr.become_probe()  # the snapshot (or its answer) was lost: try again
        if self._election_elapsed >= self._election_ticks:
            self._election_elapsed = 0
            if self._check_quorum:
                active = {v for v, pr in self._progress.items() if pr.recent_active}
                active.add(self.id)
                for v, pr in self._progress.items():
                    pr.recent_active = False
                if len(active & self.voters) < self._quorum():
                    self._become_follower(self.term, None)
                    return
            self._transferee = None  # a transfer that did not finish in time is abandoned
        if self._heartbeat_elapsed >= self._heartbeat_ticks:
            self._heartbeat_elapsed = 0
            context = next(reversed(self._reads)) if self._reads else b""
            self._broadcast_heartbeat(context)

    def _step_leader(self, m: Message) -> None:
        pr = self._progress.get(m.frm)
        if pr is None or m.frm == self.id:
            return  # not (or no longer) in the configuration
        if isinstance(m, AppendResp):
            pr.recent_active, pr.quiet_ticks = True, 0
            self._handle_append_resp(m, pr)
        elif isinstance(m, HeartbeatResp):
            pr.recent_active, pr.quiet_ticks = True, 0
            pr.probe_sent = False
            if pr.flow is _Flow.REPLICATE and self._window_full(pr) and pr.inflight:
                pr.inflight_bytes -= pr.inflight.popleft()[1]
            if pr.match < self._log.last_index():
                self._send_append(m.frm, send_empty=True)
            if m.context in self._reads:
                self._ack_read(m.frm, m.context)
        elif isinstance(m, InstallSnapshotResp):
            pr.recent_active, pr.quiet_ticks = True, 0
            moved = pr.update(m.match_index)
            if pr.flow is _Flow.SNAPSHOT:
                pr.become_probe()
                self._after_match(m.frm)
            elif moved:
                self._after_match(m.frm)

    def _handle_append_resp(self, m: AppendResp, pr: _Progress) -> None:
        if not m.success:
            if self._back_off(pr, m):
                self._send_append(m.frm)
            return
        moved = pr.update(m.match_index)
        if not moved and not (pr.flow is _Flow.PROBE and m.match_index == pr.match):
            return  # a duplicate or reordered acknowledgement
        if pr.flow is _Flow.PROBE:
            pr.become_replicate()
        elif pr.flow is _Flow.SNAPSHOT and pr.match >= pr.pending_snapshot:
            pr.become_replicate()
        elif pr.flow is _Flow.REPLICATE:
            pr.free_to(pr.match)
        self._after_match(m.frm)

    def _after_match(self, peer: int) -> None:
        if self._maybe_commit():
            # Followers that already hold everything learn the new commit now, not at the
            # next heartbeat: they serve reads (Fetch, Metadata) up to it, and a topic created
            # through the leader was unknown on them for up to a tick after the answer.
            self._broadcast_append(send_empty=True)
            self._step_down_if_removed()
            if self.role is not Role.LEADER:
                return
        while self._send_append(peer):
            pass
        if peer == self._transferee and self._progress[peer].match == self._log.last_index():
            self._send(TimeoutNow(self.id, peer, self.term))

    def _back_off(self, pr: _Progress, m: AppendResp) -> bool:
        """Move ``next`` back after a rejection; False if the rejection is stale."""
        if pr.flow is _Flow.REPLICATE:
            if m.reject_index <= pr.match:
                return False
            pr.become_probe()  # everything after the known match is in doubt
            return True
        if pr.flow is _Flow.SNAPSHOT or pr.next - 1 != m.reject_index:
            return False
        if m.hint_index < pr.match:
            # The answer to our one probe says the follower holds less than it acknowledged:
            # its log was lost (a wiped data dir under the same id). Forget the match, or we
            # would probe at it forever; a stale answer only costs a resend, since the commit
            # index never moves back.
            pr.match = m.hint_index
        pr.next = max(pr.match + 1, self._probe_from(m))
        pr.probe_sent = False
        return True

    def _probe_from(self, m: AppendResp) -> int:
        """The next index to try after a rejection, skipping entries the hint rules out."""
        probe = m.hint_index
        if m.hint_term > 0:
            probe = self._log.find_conflict_by_term(m.hint_index, m.hint_term)
        return min(m.reject_index, probe + 1)

    def _window_full(self, pr: _Progress) -> bool:
        return (len(pr.inflight) >= self._max_inflight_msgs
                or pr.inflight_bytes >= self._max_inflight_bytes)

    def _send_append(self, to: int, send_empty: bool = False) -> bool:
        """Send ``to`` what it lacks (entries, an empty probe, or a snapshot); False if
        nothing was sent because flow control holds it back or there is nothing to send."""
        pr = self._progress[to]
        if pr.flow is _Flow.SNAPSHOT or (pr.flow is _Flow.PROBE and pr.probe_sent):
            return False
        if pr.flow is _Flow.REPLICATE and self._window_full(pr):
            return False
        log = self._log
        prev_term = log.term_at(pr.next - 1)
        entries = log.slice(pr.next, log.last_index() + 1, self._max_msg_bytes)
        if prev_term is None or entries is None:
            self._send_snapshot(to, pr)
            return True
        if not entries and not send_empty:
            return False
        self._send(Append(self.id, to, self.term, pr.next - 1, prev_term, tuple(entries),
                          log.committed))
        if pr.flow is _Flow.PROBE:
            pr.probe_sent = True
        elif entries:
            last = entries[-1].index
            pr.inflight.append((last, sum(e.size for e in entries)))
            pr.inflight_bytes += pr.inflight[-1][1]
            pr.next = last + 1
        return bool(entries) and pr.flow is _Flow.REPLICATE

    def _send_snapshot(self, to: int, pr: _Progress) -> None:
        snap = self._snapshot
        if snap is None or snap.meta.index != self._log.snap_index:
            raise AssertionError("log is compacted but no matching snapshot is held")
        pr.become_snapshot(snap.meta.index)
        self._send(InstallSnapshot(self.id, to, self.term, snap))

    def _broadcast_append(self, send_empty: bool = False) -> None:
        for peer in sorted(self._progress):
            if peer != self.id:
                self._send_append(peer, send_empty)

    def _broadcast_heartbeat(self, context: bytes) -> None:
        for peer in sorted(self._progress):
            if peer != self.id:
                pr = self._progress[peer]
                self._send(Heartbeat(self.id, peer, self.term,
                                     min(pr.match, self._log.committed), context))

    def _maybe_commit(self) -> bool:
        """Commit the highest index a quorum of voters holds, if it is from our term."""
        matches = sorted((self._progress[v].match for v in self.voters), reverse=True)
        index = matches[self._quorum() - 1]
        if index <= self._log.committed or self._log.term_at(index) != self.term:
            return False
        first_in_term = not self._committed_in_term()
        self._log.commit_to(index)
        if first_in_term and self._deferred_reads:
            deferred, self._deferred_reads = self._deferred_reads, []
            for context in deferred:
                self.read_index(context)
        return True

    def _ack_read(self, voter: int, context: bytes) -> None:
        self._reads[context].acks.add(voter)
        if len(self._reads[context].acks & self.voters) < self._quorum():
            return
        # A quorum answered a heartbeat sent after every earlier read: release them all.
        while self._reads:
            ctx = next(iter(self._reads))
            self._read_states.append(ReadState(self._reads.pop(ctx).index, ctx))
            if ctx == context:
                break

    def _propose(self, kind: EntryKind, data: bytes) -> int:
        self._require_leader()
        if self._transferee is not None:
            raise ProposalDropped(f"leadership is being transferred to {self._transferee}")
        self._append([Entry(0, 0, kind, data)])
        self._broadcast_append()
        return self._log.last_index()

    def _append(self, entries: Sequence[Entry]) -> None:
        """Leader-side append: stamp index and term, adopt configuration changes at once."""
        first = self._log.last_index() + 1
        stamped = [Entry(first + n, self.term, e.kind, e.data) for n, e in enumerate(entries)]
        self._log.append(stamped)
        self._track_conf(stamped)
        if self.id in self._progress:
            self._progress[self.id].update(self._log.last_index())
        if self._maybe_commit():  # only a one-voter configuration commits here
            self._step_down_if_removed()

    # ------------------------------------------------------------------ helpers

    def _track_conf(self, entries: Sequence[Entry]) -> None:
        """Adopt the membership changes among newly appended ``entries``."""
        for e in entries:
            if e.kind is EntryKind.CONF_CHANGE:
                self._conf.append((e.index, ConfChange.decode(e.data).voters))
        if self.role is Role.LEADER:
            last = self._log.last_index()
            for v in self.voters - self._progress.keys():
                self._progress[v] = _Progress(match=0, next=last + 1, recent_active=True)
            for v in self._progress.keys() - self.voters - {self.id}:
                del self._progress[v]
                if self._transferee == v:
                    self._transferee = None

    def _voters_at(self, index: int) -> frozenset[int]:
        voters = self._conf[0][1]
        for at, conf in self._conf:
            if at > index:
                break
            voters = conf
        return voters

    def _quorum(self) -> int:
        return len(self.voters) // 2 + 1

    def _promotable(self) -> bool:
        return self.id in self.voters

    def _in_lease(self) -> bool:
        return (self._check_quorum and self.leader is not None
                and self._election_elapsed < self._election_ticks)

    def _committed_in_term(self) -> bool:
        return self._log.term_at(self._log.committed) == self.term

    def _require_leader(self) -> None:
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader)

    def _randomize_timeout(self) -> None:
        self._timeout = self._rng.randrange(self._election_ticks, 2 * self._election_ticks)

    def _send(self, m: Message) -> None:
        self._msgs.append(m)

    def _hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self._log.committed)

    def _soft_state(self) -> SoftState:
        return SoftState(self.leader, self.role)
