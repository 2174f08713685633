"""Runs the pure Raft core on the reactor: ticks, the Ready loop, compaction.

The Ready loop follows the core's contract (persist, send, apply, advance)::

    ready = node.ready()
    run_io(storage.save, ready)      # I/O thread: snapshot, entries, hard state; fsync
    transport.send(ready.messages)   # only now: they may promise what was just persisted
    app.restore(ready.snapshot)      # reactor: install an InstallSnapshot'ed state
    app.apply(entry) for each committed entry, in log order
    node.advance(ready)

Only one Ready is outstanding at a time. Everything that reaches the core while a ``save`` runs
on the I/O thread (proposals, peer messages, ticks) piles up in the core and goes out in the next
Ready, so one fsync covers every entry proposed meanwhile: that is the group commit that keeps
produce throughput with Raft in front of the store.

Ticks come from an injected ``IReactorTime`` every ``tick_s`` seconds (default 100 ms; an
election timeout is ``election_ticks`` ticks, randomized by the core with the injected
``random.Random``).

Log compaction: once the log holds ``compact_entries`` applied entries past the last snapshot
(or the WAL passes ``compact_bytes``), the loop pauses, the application snapshots its state at
the applied index (``app.take_snapshot(index) -> Deferred[bytes]``; the bytes are a reference,
see ``RaftProposer``), the core and the storage drop the covered prefix, and the loop resumes.
The core's timers stand still during that pause (``tick``).
An application with ``compaction_point(applied) -> (index, data) | None`` instead names a state
that is durable already (a one-member cluster: its applied-index checkpoint); the loop then
only pauses for the storage's small COMPACT write.

Write-through (one-member cluster only): with ``can_stage(entry)``/``stage(entries)``/
``write_through()``/``publish()`` the application applies the leading committed entries of a
Ready first, then makes its own state durable (``write_through() -> Deferred``: segments and an
applied-index checkpoint) while ``storage.save`` writes those entries *elided* (``ELIDED``: the
position and term only), and answers for them at ``publish``, once both returned. A record is
then written to disk once (its segment), not twice (Raft log, then segment). Crash recovery
copes with either write missing (``RaftProposer.stage`` states the argument). Only while the
persisted term and vote stay as they are, so an elided entry's term is always the saved one.

Optional application hooks: ``has_pending()`` / ``before_ready()`` let the application keep
proposals in its own outbox and hand them to the core right before a Ready is cut (so many
proposals become one entry); ``request_ready()`` tells the driver there is something.

An ``InstallSnapshot`` from the leader carries only that reference: before stepping it into the
core the driver asks the transport to fetch the snapshot's files into the local snapshot
directory (``app.has_snapshot``/``transport.fetch_snapshot``), so ``app.restore`` always finds
the files it needs.

Reactor-thread only, except ``storage.save``/``storage.compact``, which run through ``run_io``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Protocol, Sequence

from twisted.internet.defer import Deferred, FirstError, fail, gatherResults, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from kmqkafka.raft.core import RaftNode, Ready, Role, SoftState
from kmqkafka.raft.messages import (
    ELIDED, Append, AppendResp, Entry, EntryKind, Heartbeat, HeartbeatResp, InstallSnapshot,
    Message, Snapshot, loaded,
)

__all__ = ["Application", "RaftDriver", "Transport"]

log = Logger()

_EARLY = (Append, Heartbeat)  # a leader sends these before its own save (see ``_process``)
_FOLLOWER_ANSWERS = (AppendResp, HeartbeatResp)  # each is a KRaft fetch (``replica_times``)
HOLD_MAX_S = 5.0  # longest a leader holds proposals for a lagging follower at a time
PREPARE_PAUSE_S = 0.02  # between two steps of preparing free Raft log files
FETCH_BACKOFF_MIN_S = 0.5  # first wait before fetching a snapshot again after a failed download
FETCH_BACKOFF_MAX_S = 30.0

IORunner = Callable[..., Deferred]


def _first_error(failure: Failure) -> Failure:
    """The failure inside ``gatherResults``' FirstError (the driver logs the real cause)."""
    return failure.value.subFailure if failure.check(FirstError) else failure


class Application(Protocol):
    """What the driver drives (``RaftProposer`` over a ``StateMachine``)."""

    def apply(self, entry: Entry) -> None:
        """Apply one committed entry (any kind); called in log order, exactly once per run."""

    def restore(self, snapshot: Snapshot) -> None:
        """Replace the state by the snapshot ``snapshot.data`` refers to (files are local)."""

    def take_snapshot(self, index: int) -> Deferred:
        """Snapshot the state at ``index`` (== last applied); fires with reference bytes."""

    def has_snapshot(self, snapshot: Snapshot) -> bool:
        """True if the files of ``snapshot`` are present locally."""

    def on_soft_state(self, soft: SoftState) -> None:
        """Leadership or role changed."""


class Transport(Protocol):
    """Carries Raft messages between nodes (see ``kmqkafka.raft.transport``)."""

    def send(self, messages: Sequence[Message]) -> None: ...

    def fetch_snapshot(self, frm: int, snapshot: Snapshot) -> Deferred: ...


class RaftDriver:
    """One node's Raft loop. ``storage`` is a ``DiskStorage`` (or ``MemoryStorage`` in tests)."""

    def __init__(
        self,
        node: RaftNode,
        storage: Any,
        app: Application,
        transport: Transport,
        clock: IReactorTime,
        run_io: IORunner,
        *,
        tick_s: float = 0.1,
        compact_entries: int = 10_000,
        compact_bytes: int = 256 << 20,
        prepare_free: bool = False,
    ) -> None:
        self.node = node
        self._prepare_free_files = prepare_free
        self.storage = storage
        self._app = app
        self._transport = transport
        self._clock = clock
        self._run_io = run_io
        self._tick_s = tick_s
        self._compact_entries = compact_entries
        self._compact_bytes = compact_bytes
        self._busy = False       # a Ready is being persisted/applied, or a compaction runs
        self._compacting = False  # the loop is paused for a snapshot or a compaction
        self._scheduled = False
        self._stopped = False
        self._ticker: LoopingCall | None = None
        self._fetching: tuple[int, int, Deferred] | None = None  # (term, from, download)
        self._fetch_backoff = FETCH_BACKOFF_MIN_S
        self._fetch_retry_at = 0.0
        self._applied_waiters: list[tuple[int, Deferred]] = []
        self._idle: list[Deferred] = []
        self._transfers: list[tuple[Deferred, Any]] = []  # (waiter, timeout call)
        self.failed: Failure | None = None
        self.ready_count = 0
        self.compactions = 0
        self._taken: tuple[int, bytes] | None = None  # a snapshot waiting for slow followers
        self._held_since: float | None = None  # proposals held for a slow follower since
        hs = getattr(storage, "hard_state", None)
        # (term, vote) as last saved: write-through only while a Ready leaves them alone.
        self._saved_vote = (hs.term, hs.vote) if hs is not None else (0, 0)
        self.elided_entries = 0
        self._dropped_to = 0  # applied entries up to here hold no bytes (``Stored``)
        # Leader only, this term: when each follower last answered (fetched, in Kafka's
        # words) and last answered holding our whole log (``replica_times``).
        self._heard_term = 0
        self._answered_at: dict[int, float] = {}
        self._caught_up_at: dict[int, float] = {}

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start ticking. A sole voter campaigns on its first tick, run at once. With
        ``prepare_free``, a member of a larger cluster also prepares its Raft log's free files
        (``storage.prepare_free``), a step at a time between saves, unless it has them."""
        self._ticker = LoopingCall(self.tick)
        self._ticker.clock = self._clock
        self._ticker.start(self._tick_s, now=True).addErrback(self._fatal)
        if self._prepare_free_files and len(self.node.voters) > 1:
            self._prepare_free()

    def _prepare_free(self) -> None:
        if self._stopped or self.failed is not None:
            return

        def next_step(more: bool) -> None:
            if more:
                self._clock.callLater(PREPARE_PAUSE_S, self._prepare_free)

        def failed(f: Failure) -> None:  # only a head start: the log rolls without it
            log.warn("preparing free raft log files failed: {why}", why=f.getErrorMessage())

        self._run_io(self.storage.prepare_free).addCallbacks(next_step, failed)

    def stop(self) -> Deferred:
        """Stop ticking and taking input (a snapshot download in progress is abandoned); fires
        once the outstanding Ready is done."""
        self._stopped = True
        if self._ticker is not None and self._ticker.running:
            self._ticker.stop()
        if self._fetching is not None:
            download, self._fetching = self._fetching[2], None
            download.cancel()
        if not self._busy:
            return succeed(None)
        d: Deferred = Deferred()
        self._idle.append(d)
        return d

    # ------------------------------------------------------------------ inputs

    def tick(self) -> None:
        """Advance the core's timers; not while the loop is paused for compaction, when this
        node can send nothing: every member snapshots at the same index, so a leader's
        silence then is its followers' too, and counting it would elect a new leader."""
        if self._stopped or self._compacting:
            return
        self.node.tick()
        self._kick()

    def step(self, message: Message) -> None:
        """A message from a peer (any order, possibly duplicated or stale)."""
        if self._stopped:
            return
        if isinstance(message, InstallSnapshot) and message.term >= self.node.term:
            snap = message.snapshot
            if snap.meta.index > self.node.commit_index and not self._app.has_snapshot(snap):
                self._fetch(message)
                return
        self.node.step(message)
        if type(message) in _FOLLOWER_ANSWERS:
            self._note_answer(message.frm)
        self._kick()

    def _note_answer(self, peer: int) -> None:
        node = self.node
        if node.role is not Role.LEADER:
            return
        if self._heard_term != node.term:
            self._heard_term = node.term
            self._answered_at.clear()
            self._caught_up_at.clear()
        now = self._clock.seconds()
        self._answered_at[peer] = now
        if node.match_of(peer) >= node.last_index:
            self._caught_up_at[peer] = now

    def replica_times(self, peer: int) -> tuple[float | None, float | None]:
        """(last answer, last answer holding this leader's whole log) of follower ``peer``,
        in clock seconds, this term only (None: not yet). What KRaft's DescribeQuorum reports
        as a voter's last fetch and last caught-up timestamps."""
        if self.node.role is not Role.LEADER or self._heard_term != self.node.term:
            return None, None
        return self._answered_at.get(peer), self._caught_up_at.get(peer)

    def now(self) -> float:
        """The driver's clock, in seconds."""
        return self._clock.seconds()

    def propose(self, data: bytes) -> int:
        """Append a command on the leader; returns its index. Raises the core's NotLeader /
        ProposalDropped."""
        index = self.node.propose(data)
        self._kick()
        return index

    def transfer_leadership(self, timeout_s: float) -> Deferred:
        """Graceful hand-over (shutdown): a leader of a multi-node cluster transfers leadership
        to its most up-to-date follower (``RaftNode.transfer_target``: the core catches it up,
        then sends it TimeoutNow). Fires with the new leader's id once this node learned it,
        or with None at once (not a leader, alone, stopped) or after ``timeout_s`` (the core
        itself abandons a transfer after an election timeout). Never errbacks."""
        node = self.node
        target = node.transfer_target() if not self._stopped else None
        if target is None:
            return succeed(None)
        if node.transferring is None:
            try:
                node.transfer_leadership(target)
            except Exception as e:  # NotLeader in a race: nothing to hand over
                log.info("leadership transfer to {to} not started: {e}", to=target, e=e)
                return succeed(None)
            log.info("transferring leadership to node {to}", to=target)
        d: Deferred = Deferred()
        timer = self._clock.callLater(timeout_s, self._transfer_timeout, d)
        self._transfers.append((d, timer))
        self._kick()
        return d

    def _transfer_timeout(self, d: Deferred) -> None:
        self._transfers = [(w, t) for w, t in self._transfers if w is not d]
        leader = self.node.leader
        log.info("leadership transfer: timed out (leader now {leader})", leader=leader)
        d.callback(leader if leader != self.node.id and not self.is_leader() else None)

    def _check_transfers(self) -> None:
        leader = self.node.leader
        if not self._transfers or self.is_leader() or leader is None or leader == self.node.id:
            return
        transfers, self._transfers = self._transfers, []
        for d, timer in transfers:
            if timer.active():
                timer.cancel()
            d.callback(leader)

    def _fetch(self, message: InstallSnapshot) -> None:
        """Fetch the files of the snapshot ``message`` names, then step it into the core.

        One download at a time: the leader repeats InstallSnapshot every election timeout,
        naming its newest snapshot, and a full download for each filled the follower's disk
        with trees it never installed and made catch-up take many times longer. A download
        from an older term's leader (possibly frozen or gone: the transport times out a link
        that stops sending) gives way to the newer one. After a failure the next attempt waits
        ``_fetch_backoff`` seconds (doubling up to ``FETCH_BACKOFF_MAX_S``): a follower whose
        disk is full must not make the leader stream its store twice a second."""
        current = self._fetching
        if current is not None:
            term, _frm, d = current
            if message.term <= term:
                return
            self._fetching = None  # a newer leader's snapshot: drop the old download
            d.cancel()
        if self._clock.seconds() < self._fetch_retry_at:
            return
        index = message.snapshot.meta.index
        log.info("fetching snapshot {index} from node {frm}", index=index, frm=message.frm)
        d = self._transport.fetch_snapshot(message.frm, message.snapshot)
        entry = (message.term, message.frm, d)
        self._fetching = entry

        def fetched(_: object) -> None:
            if self._fetching is entry:
                self._fetching = None
            self._fetch_backoff = FETCH_BACKOFF_MIN_S
            self._fetch_retry_at = 0.0
            if not self._stopped:
                self.node.step(message)
                self._kick()

        def failed(f: Failure) -> None:
            if self._fetching is not entry:  # cancelled: given up for another, or stopping
                return
            self._fetching = None
            self._fetch_retry_at = self._clock.seconds() + self._fetch_backoff
            self._fetch_backoff = min(self._fetch_backoff * 2, FETCH_BACKOFF_MAX_S)
            log.warn("snapshot {index} fetch from {frm} failed: {why}", index=index,
                     frm=message.frm, why=f.getErrorMessage())

        d.addCallbacks(fetched, failed)

    # ------------------------------------------------------------------ state for callers

    @property
    def leader(self) -> int | None:
        """The leader this node knows; None once it failed (it no longer hears of one)."""
        return self.node.leader if self.failed is None else None

    def is_leader(self) -> bool:
        """Leading, and able to: a failed node's core may still say LEADER."""
        return self.failed is None and self.node.role is Role.LEADER

    def wait_applied(self, index: int) -> Deferred:
        """Fire once this node applied through ``index``. Cancelling the Deferred (a caller
        that stops waiting, e.g. through ``addTimeout``) takes it off the waiting list."""
        if self.node.applied_index >= index:
            return succeed(None)

        def forget(d: Deferred) -> None:
            self._applied_waiters = [w for w in self._applied_waiters if w[1] is not d]

        d: Deferred = Deferred(forget)
        self._applied_waiters.append((index, d))
        return d

    # ------------------------------------------------------------------ the Ready loop

    def _kick(self) -> None:
        if self._scheduled or self._busy or self._stopped and not self._idle:
            return
        if not self.node.has_ready() and not self._app_pending():
            return
        self._scheduled = True
        self._clock.callLater(0, self._process)

    def request_ready(self) -> None:
        """The application has proposals waiting (``app.before_ready`` hands them over right
        before the next Ready is cut, so everything proposed while a save runs shares it)."""
        self._kick()

    def _app_pending(self) -> bool:
        pending = getattr(self._app, "has_pending", None)
        return bool(pending is not None and pending())

    def _process(self) -> None:
        self._scheduled = False
        if self._busy or self.failed is not None:
            return
        try:
            self._process_ready()
        except Exception:
            # An apply that raised (an entry this node cannot read, a bug) must not leave the
            # loop busy for good while /health still says 200: the node stops taking part,
            # says why, and reports itself failed, as after a failed fsync.
            self._busy = False
            self._fatal(Failure())

    def _process_ready(self) -> None:
        before = getattr(self._app, "before_ready", None)
        if before is not None and not self._stopped:
            before()
        rd = self.node.ready()
        if rd is None:
            return
        self._busy = True
        self.ready_count += 1
        if rd.soft_state is not None:
            self._app.on_soft_state(rd.soft_state)
            self._check_transfers()
        late = rd.messages
        if late and self.node.role is Role.LEADER:
            # A leader's Appends and Heartbeats promise nothing about its own disk, so they go
            # out now and the followers' fsyncs overlap the leader's (Raft thesis 10.2.1). The
            # core counts the leader's own entries at once, so a follower's ack may move the
            # commit index over entries this save still writes; that index leaves the core
            # (applied entries, the commit field of messages) only with the next Ready, cut
            # after this save returned (one Ready at a time), so nothing is applied or
            # announced as committed before a quorum, the leader included, holds it on disk.
            # Without new entries they go out before this node applies the commit too, so a
            # follower hears of a commit before the leader answers the client whose write it
            # was (that client may ask the follower next).
            term = self.node.term
            early = [m for m in late if type(m) in _EARLY and m.term == term]
            if early:
                late = [m for m in late if not (type(m) in _EARLY and m.term == term)]
                self._transport.send(early)
        staged = self._stage(rd) if self._may_write_through(rd) else 0
        if staged:
            rd, d = self._write_through(rd, staged)
        elif rd.snapshot is not None or rd.entries or rd.hard_state is not None:
            d = self._run_io(self.storage.save, rd)
        else:
            d = succeed(None)
        early_applied = self._apply_stable(rd) if not d.called and not staged else 0
        d.addCallback(self._persisted, rd, staged, late, early_applied)
        d.addErrback(self._ready_failed)

    def _ready_failed(self, failure: Failure) -> None:
        """The Ready's save or apply failed: nothing of it is running any more, so a
        ``stop`` must not wait for it (SIGTERM hung after a refused checkpoint write)."""
        self._busy = False
        self._fatal(failure)

    def _may_write_through(self, rd: Ready) -> bool:
        """One-member cluster, new entries committed at once, no snapshot, and the saved term
        and vote unchanged by this Ready."""
        if (getattr(self._app, "write_through", None) is None or not rd.entries
                or rd.snapshot is not None or not rd.committed_entries
                or self.node.voters != {self.node.id}):
            return False
        hs = rd.hard_state
        return hs is None or (hs.term, hs.vote) == self._saved_vote

    def _stage(self, rd: Ready) -> int:
        """Apply the leading committed entries of this Ready the application allows
        (``app.can_stage``); it answers nothing for them before ``app.publish()``. Returns how
        many were applied."""
        can = self._app.can_stage
        first_new = rd.entries[0].index
        n = 0
        for entry in rd.committed_entries:
            if entry.index < first_new or not can(entry):
                break
            n += 1
        if n:
            self._app.stage(rd.committed_entries[:n])
        return n

    def _write_through(self, rd: Ready, staged: int) -> tuple[Ready, Deferred]:
        """Persist a Ready whose first ``staged`` committed entries are applied already: the
        application's own flush makes them durable, the Raft log gets them elided. Both run
        at once; the Deferred fires when both are done. Returns the Ready as saved (its
        entries elided) with that Deferred; ``_persisted`` swaps them into the core too."""
        last = rd.committed_entries[staged - 1].index
        entries = tuple(
            Entry(e.index, e.term, e.kind, ELIDED)
            if e.index <= last and e.kind is EntryKind.NORMAL else e
            for e in rd.entries)
        elided = sum(1 for e in entries if e.data is ELIDED)
        self.elided_entries += elided
        flushed = self._app.write_through()
        rd = replace(rd, entries=entries)
        if elided < len(entries):
            saved = self._run_io(self.storage.save, rd)
        else:
            # Positions only, and the checkpoint makes them durable: a page-cache write
            # here, no fsync (the Raft log is only ever behind or ahead of the checkpoint,
            # both of which recovery handles).
            try:
                self.storage.save(rd, sync_entries=False)
                saved = succeed(None)
            except Exception:
                saved = fail()
        done = gatherResults([flushed, saved], consumeErrors=True).addErrback(_first_error)
        return rd, done

    def _apply_stable(self, rd: Ready) -> int:
        """Several voters: apply the leading committed entries this node already holds on disk
        (before this Ready's entries) while ``storage.save`` runs on the I/O thread. They are
        committed and durable here, so their results may be answered at once; only entries
        this save still writes wait for it. Returns how many were applied."""
        committed = rd.committed_entries
        if not committed or rd.snapshot is not None or len(self.node.voters) < 2:
            return 0
        if rd.entries:
            limit = rd.entries[0].index
            n = 0
            for entry in committed:
                if entry.index >= limit:
                    break
                n += 1
        else:
            n = len(committed)
        apply = self._app.apply
        for entry in committed[:n]:
            apply(loaded(entry))
        return n

    def _persisted(self, _: object, rd: Ready, staged: int = 0,
                   late: Sequence[Message] | None = None, early_applied: int = 0) -> None:
        if rd.hard_state is not None:
            self._saved_vote = (rd.hard_state.term, rd.hard_state.vote)
        messages = rd.messages if late is None else late
        if messages:
            self._transport.send(messages)
        if rd.snapshot is not None:
            self._app.restore(rd.snapshot)
        if staged:
            self._app.publish()
        for entry in rd.committed_entries[max(staged, early_applied):]:
            self._app.apply(loaded(entry))
        self.node.advance(rd)
        if staged:
            self.node.swap_applied([e for e in rd.entries if e.data is ELIDED])
        self._drop_applied_data()
        self._busy = False
        self._release_applied()
        if not self._maybe_compact():
            self._after_turn()

    def _drop_applied_data(self) -> None:
        """Put the storage's ``Stored`` copies in place of applied entries, so their bytes
        are freed now rather than at the next compaction (a follower that still needs one
        gets it read back from the file). Between saves only: the storage's list is the I/O
        thread's while a save runs."""
        stored = getattr(self.storage, "stored_entries", None)
        applied = self.node.applied_index
        if stored is None or applied <= self._dropped_to:
            return
        self.node.swap_applied(stored(self._dropped_to + 1, applied))
        self._dropped_to = applied

    def _after_turn(self) -> None:
        if self._idle and not self._busy:
            idle, self._idle = self._idle, []
            for d in idle:
                d.callback(None)
            return
        self._kick()

    def _release_applied(self) -> None:
        applied = self.node.applied_index
        if not self._applied_waiters:
            return
        keep = []
        for index, d in self._applied_waiters:
            if index <= applied:
                if not d.called:  # a caller that gave up may have fired it: not our failure
                    d.callback(None)
            else:
                keep.append((index, d))
        self._applied_waiters = keep

    def fail(self, failure: Failure) -> None:
        """The application cannot go on applying (its store refused a write): this node stops
        taking part, as after a failed Raft log write."""
        self._fatal(failure)

    def _fatal(self, failure: Failure) -> None:
        # A failed fsync of the Raft log leaves it in an unknown state: stop taking part.
        log.failure("raft driver failed; this node stops taking part", failure)
        self.failed = failure
        self._stopped = True
        if self._ticker is not None and self._ticker.running:
            self._ticker.stop()
        idle, self._idle = self._idle, []
        for d in idle:
            d.callback(None)

    # ------------------------------------------------------------------ compaction

    def _maybe_compact(self) -> bool:
        node = self.node
        applied = node.applied_index
        backlog = applied - node.snapshot_index
        if self._stopped or backlog <= 0 or (
            backlog < self._compact_entries
            and getattr(self.storage, "wal_bytes", 0) < self._compact_bytes
        ):
            return False
        if getattr(self._app, "compacts_to_checkpoint", False):
            # The application names a state that is durable already (e.g. its applied-index
            # checkpoint): compact to it without pausing the loop for a snapshot.
            found = self._app.compaction_point(applied)
            if found is None or found[0] <= node.snapshot_index:
                return False
            index, data = found
            self.compactions += 1
            self._compact_storage(node.compact(index, data))
            return True
        if self._taken is not None:
            return self._compact_taken()
        self._busy = self._compacting = True
        log.info("snapshotting at {index} to compact the raft log", index=applied)
        d = self._app.take_snapshot(applied)

        def taken(data: bytes) -> Deferred | None:
            self._taken = (applied, data)
            return self._compact_taken(resume=False)

        def done(result: object) -> None:
            self._busy = self._compacting = False
            if isinstance(result, Failure):
                log.failure("log compaction failed (will retry)", result)
                self._compact_entries *= 2  # do not retry on every turn
            self._after_turn()

        d.addCallback(taken).addBoth(done)
        return True

    def follower_backlogged(self) -> bool:
        """Whether the leader should hold new proposals a moment: a snapshot waits for a live
        follower that lags (``_compact_taken``), and the Raft log is three quarters of the way
        to the size at which it is compacted anyway, which would send that follower the whole
        store. Three nodes sharing cores let one follower fall that far behind while the
        other two commit; the snapshot transfers that followed (several a minute, each a copy
        of the store) cut a cluster's throughput to a fifth. As Kafka's acks=all waits for
        every in-sync replica, the leader then waits for the slowest live one, but never more
        than ``HOLD_MAX_S`` at a time (a follower that stays behind gets a snapshot)."""
        if self._taken is None or not self.is_leader():
            self._held_since = None
            return False
        wal = getattr(self.storage, "wal_bytes", 0)
        if wal < 1.5 * self._compact_bytes:
            self._held_since = None
            return False
        now = self._clock.seconds()
        if self._held_since is None:
            self._held_since = now
            log.info("holding proposals: a follower lags {n} entries behind",
                     n=self.node.last_index - (self.node.slowest_follower() or 0))
        return now - self._held_since < HOLD_MAX_S

    def _compact_taken(self, resume: bool = True) -> Any:
        """Compact to the snapshot taken last, once no follower the log can still catch up
        needs entries it covers (a leader waits for its slowest live follower rather than
        send it the whole store), or once the Raft log has grown to twice its compaction
        threshold. With ``resume`` (a turn of the loop), returns whether the loop paused for
        it; without (inside the snapshot chain), a Deferred or None."""
        assert self._taken is not None
        index, data = self._taken
        if index <= self.node.snapshot_index:  # a snapshot from the leader covers it already
            self._taken = None
            return False if resume else None
        slowest = self.node.slowest_follower()
        oversized = getattr(self.storage, "wal_bytes", 0) >= 2 * self._compact_bytes
        if slowest is not None and slowest < index and not oversized:
            return False if resume else None
        self._taken = None
        log.info("compacting the raft log to {index}", index=index)
        self.compactions += 1
        snapshot = self.node.compact(index, data)
        if not resume:
            return self._run_io(self.storage.compact, snapshot)
        self._compact_storage(snapshot)
        return True

    def _compact_storage(self, snapshot: Snapshot) -> None:
        """Pause the loop while the storage drops what ``snapshot`` covers, then resume; a
        failure leaves the Raft log's files in an unknown state, so it is fatal."""
        self._busy = self._compacting = True

        def done(result: object) -> None:
            self._busy = self._compacting = False
            if isinstance(result, Failure):
                self._fatal(result)
                return
            self._after_turn()

        self._run_io(self.storage.compact, snapshot).addBoth(done)
