"""RaftProposer: the store's ``propose`` contract with Raft ordering every command.

``propose(command, durable=True) -> Deferred[result]`` behaves like ``LocalProposer``'s: the
Deferred fires with ``StateMachine.apply``'s result (or its StoreError), and with
``durable=True`` only after the group-commit flush made the applied data readable (high
watermark). What changes is who orders: the command is encoded and proposed to Raft; every node
applies committed entries in log order through ``StateMachine.apply(index, command)``, so
Sequences are assigned at apply time and agree everywhere.

Forwarding: a follower sends the encoded command to the leader (``transport.forward``); the
leader appends it and answers with the entry's ``(index, term)`` at once. The follower then waits
until it applies that index itself and answers with its *own* apply result: apply is
deterministic, so the result is the one the leader computed, and nothing but the position ever
crosses the wire. If the entry applied at that index has another term, the command was replaced
by a new leader's log and fails with ``ProposalLost``.

Without a known leader, proposals wait (parked) and go out when one appears; after
``propose_timeout_s`` a proposal that was never accepted fails with ``NoLeaderError`` and one
that was accepted but not applied here fails with ``CommitTimeout``.

Snapshots: the data Raft carries is a reference, ``b"kmq-snapshot:<index>"``; the files are the
hard-linked tree ``StateMachine.snapshot`` writes under ``{data_dir}/raft/snapshots/<index>``,
fetched by a lagging follower through the transport before it installs the snapshot.

One-member cluster (no transport): an entry's data is a ``Gather`` of the command's pieces
(an Append's batch is never copied; the command object rides along, so applying needs no
decode), and Append entries are written through: applied first, then made durable by the
store's own group-commit flush (segments, then an applied-index checkpoint) while the Raft log
records them ``ELIDED`` (``stage``/``write_through``/``publish``; the crash argument is in
``stage``'s docstring). Each record reaches the disk once, as with ``LocalProposer``; the
answers and the readers' high watermark wait for both writes.

Graceful stop of a cluster's leader (SIGTERM stops the service, which stops the store):
leadership goes to the most up-to-date follower first (``_hand_over``).

Reactor-thread only; the driver's ``run_io`` serializes Raft log writes on their own I/O thread.
"""
from __future__ import annotations

import json
import random
import shutil
import struct
from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from kmqkafka.raft.core import NotLeader, ProposalDropped, RaftNode, Role, SoftState
from kmqkafka.raft.driver import RaftDriver
from kmqkafka.raft.errors import (
    CommitTimeout, MalformedCommand, NoLeaderError, NotLeaderError, ProposalLost,
)
from kmqkafka.raft.log import HardState
from kmqkafka.raft.messages import ELIDED, Entry, EntryKind, Gather, Snapshot, SnapshotMeta
from kmqkafka.raft.storage import KEEP_FREE, DiskStorage
from kmqkafka.store import commands as c
from kmqkafka.store.errors import StorageFailure, StoreError, StoreStopped
from kmqkafka.store.fsutil import write_atomic
from kmqkafka.store.machine import BatchFailure, StateMachine
from kmqkafka.store.proposer import GroupCommit, WriteErrorLog

__all__ = ["Member", "RaftProposer", "snapshot_ref"]

log = Logger()

IORunner = Callable[..., Deferred]
_RECENT = 8192  # applied results kept for forward replies that arrive after the apply
_SNAPSHOT_COPY_MAX = 16 << 20  # larger active segments are rolled, not copied, by a snapshot


@dataclass(frozen=True, slots=True)
class Member:
    """A cluster member: Raft address and the Kafka endpoint it advertises."""

    node_id: int
    raft_host: str
    raft_port: int
    kafka_host: str
    kafka_port: int
    kafka_tls_port: int | None = None  # None: the same TLS port as this node's


def snapshot_ref(index: int) -> bytes:
    return b"kmq-snapshot:%d" % index


def _ref_index(data: bytes) -> int:
    prefix, _, index = data.partition(b":")
    if prefix not in (b"kmq-snapshot", b"kmq-checkpoint"):
        raise ValueError(f"not a snapshot reference: {data[:40]!r}")
    return int(index)


def _fresh(storage: Any) -> bool:
    """A Raft log that has never held an entry, a snapshot or a vote (a new member)."""
    return (storage.last_index == 0 and storage.snapshot is None
            and storage.hard_state == HardState())


def _prepare_all_free(storage: DiskStorage) -> None:
    """Every step of ``storage.prepare_free`` at once (blocking: the Raft I/O thread)."""
    while storage.prepare_free():
        pass


def checkpoint_ref(index: int) -> bytes:
    """A one-member cluster's snapshot: its applied-index checkpoint (no files)."""
    return b"kmq-checkpoint:%d" % index


_GROUP = 0xF0           # entry data: u8 _GROUP, then (u32 length, encoded command) ...
_GROUP_HEAD = bytes([_GROUP])
_LEN = struct.Struct(">I")


def _decode(data: memoryview) -> c.Command:
    """``commands.decode`` without copying an Append's batch (a view into the entry)."""
    if data[0] == c.Append.tag:
        (head_len,) = _LEN.unpack_from(data, 1)
        head = json.loads(bytes(data[5:5 + head_len]))
        return c.Append(head["name"], head["now_ms"], data[5 + head_len:])
    return c.decode(data)


_NAME_CACHE: dict[str, bytes] = {}


def _append_head(command: c.Append) -> bytes:
    """Tag, length and JSON head of an encoded Append (the batch follows): the same bytes as
    ``commands.encode``'s, built without a ``json.dumps`` per command."""
    name = _NAME_CACHE.get(command.name)
    if name is None:
        name = json.dumps(command.name).encode()
        if len(_NAME_CACHE) < 65536:
            _NAME_CACHE[command.name] = name
    head = b'{"name":%s,"now_ms":%d}' % (name, command.now_ms)
    return b"%c%s%s" % (c.Append.tag, _LEN.pack(len(head)), head)


def _encode_parts(command: c.Command) -> list[Any]:
    """The encoded command as pieces: an Append's batch is not copied (see ``Gather``)."""
    if type(command) is c.Append:
        return [_append_head(command), command.batch]
    return [c.encode(command)]


def _encode(command: c.Command) -> bytes:
    """``commands.encode`` with one copy of an Append's batch (not three)."""
    return b"".join(_encode_parts(command))


def check_readable(data: memoryview) -> None:
    """Raise ``ValueError`` unless ``apply`` can decode ``data`` as entry data: one command, or a
    group whose parts fill it exactly. A forwarded command is checked before it is proposed,
    because an entry no member can decode stops every member's apply once it commits."""
    try:
        if len(data) and data[0] == _GROUP:
            pos, end = 1, len(data)
            while pos < end:
                (n,) = _LEN.unpack_from(data, pos)
                if pos + 4 + n > end:
                    raise ValueError("a group part runs past the entry")
                _decode(data[pos + 4:pos + 4 + n])
                pos += 4 + n
        else:
            _decode(data)
    except ValueError:
        raise
    except Exception as exc:  # KeyError, struct.error, UnicodeDecodeError, TypeError...
        raise ValueError(f"{type(exc).__name__}: {exc}") from None


def _split_group(data: memoryview) -> list[memoryview]:
    out = []
    pos, end = 1, len(data)
    while pos < end:
        (n,) = _LEN.unpack_from(data, pos)
        out.append(data[pos + 4:pos + 4 + n])
        pos += 4 + n
    return out


class _Pending:
    __slots__ = ("d", "data", "durable", "deadline", "index", "term", "slot", "command", "size")

    def __init__(self, d: Deferred, data: Any, durable: bool, deadline: float,
                 command: c.Command | None = None) -> None:
        """``data``: the encoded command, or (``command`` given, proposed on this node) its
        pieces (``_encode_parts``), joined only to be forwarded to another node."""
        self.d = d
        self.data = data
        self.command = command
        self.size = len(data) if command is None else sum(len(x) for x in data)
        self.durable = durable
        self.deadline = deadline
        self.index = 0
        self.term = 0
        self.slot = -1  # position in a group entry, -1: the entry is this command alone


def _wire(p: _Pending) -> bytes:
    """The encoded command as one bytes object (forwarding to the leader)."""
    if p.command is not None:
        p.data = b"".join(p.data)
        p.command = None
    return p.data


def _entry_data(p: _Pending) -> Any:
    """A proposal as the data of its own Raft entry: a local command stays in its pieces
    (``Gather``), which the log write, each follower's send and this node's apply (from the
    command, no decode) all use without joining them; a forwarded one is its bytes."""
    return Gather(p.data, p.command) if p.command is not None else p.data


class RaftProposer:
    """Proposes store commands through Raft and applies committed ones to the machine."""

    def __init__(
        self,
        machine: StateMachine,
        clock: IReactorTime,
        run_io: IORunner,
        *,
        node_id: int,
        members: dict[int, Member] | None,
        transport: Any,
        raft_dir: Path,
        rng: random.Random,
        run_raft_io: IORunner | None = None,
        tick_s: float = 0.1,
        election_ticks: int = 10,
        propose_timeout_s: float = 10.0,
        compact_entries: int = 10_000,
        compact_bytes: int | None = None,
        storage: Any = None,
        checkpoint_bytes: int = 64 << 20,
        checkpoint_interval_s: float = 1.0,
        group_max_bytes: int = 64 << 10,
        transfer_timeout_s: float = 2.0,
        wal_roll_bytes: int = 32 << 20,
        preallocate: bool = False,
    ) -> None:
        """``members`` (all voters, self included; None or {} = a cluster of one). ``run_io``
        runs store flushes and snapshots off the reactor; ``run_raft_io`` the Raft log writes
        (default: ``run_io``). ``storage`` overrides the on-disk Raft log (tests).

        A checkpoint (segment fsync + applied-index record) runs once ``checkpoint_bytes``
        of entries were applied since the last, or ``checkpoint_interval_s`` after an apply;
        it only bounds crash replay. Commands smaller than ``group_max_bytes`` proposed
        together share one Raft entry. A leader of a multi-node cluster that stops hands
        leadership to its most up-to-date follower first, waiting at most
        ``transfer_timeout_s`` (and as long again for its own pending proposals to apply).
        With ``preallocate`` a member of a larger cluster writes its Raft log's spare files
        (``DiskStorage.prepare_free``): a new member before it takes part, a restarted one
        in the background."""
        self.machine = machine
        self.node_id = node_id
        self.members = dict(members or {})
        self._clock = clock
        self._run_io = run_io
        self._run_raft_io = run_raft_io or run_io
        self._transport = transport
        self.raft_dir = Path(raft_dir)
        self._rng = rng
        self._tick_s = tick_s
        self._election_ticks = election_ticks
        self._election_s = tick_s * election_ticks
        self._preallocate = preallocate
        self._led_term: int | None = None  # the term this node leads, if it does
        self._timeout = propose_timeout_s
        if compact_bytes is None:
            # A one-member cluster compacts to its checkpoint (cheap): keep the Raft log a
            # few rolled files long so freed files are reused soon (``DiskStorage``).
            compact_bytes = 96 << 20 if len(self.members) <= 1 else 256 << 20
        self._compact = (compact_entries, compact_bytes)
        self._wal_roll = wal_roll_bytes
        self._storage_override = storage
        self._commit = GroupCommit(machine, clock, run_io, eager=False)
        self._commit.on_failed = self._store_failed
        self._checkpoint_bytes = checkpoint_bytes
        self._checkpoint_interval = checkpoint_interval_s
        self._since_checkpoint = 0
        self._checkpoint_timer: IDelayedCall | None = None
        self._group_max = group_max_bytes
        self._transfer_timeout = transfer_timeout_s
        self._outbox: list[_Pending] = []               # leader: proposals for the next Ready
        self._live: deque[_Pending] = deque()           # every proposal, by deadline
        self._held_snapshots: dict[int, int] = {}       # snapshot index -> streams sending it
        self._kept_snapshot = 0                         # the newest ``prune_snapshots`` kept
        self._sweep_s = max(min(propose_timeout_s / 4, 0.5), 0.001)
        self._sweeper: IDelayedCall | None = None
        self._retry: IDelayedCall | None = None  # one retry of the parked proposals at a time
        self.group_entries = 0
        self._waiting: dict[int, list[_Pending]] = {}   # index -> proposals placed there
        self._parked: list[_Pending] = []               # no leader (or forward failed)
        self._recent: OrderedDict[int, tuple[int, Any]] = OrderedDict()
        self._forwarding = 0
        self._stopped = False
        self.driver: RaftDriver | None = None
        self.storage: Any = None
        self._staged: list[tuple[_Pending, Any]] = []  # applied early, answered at publish
        self._staging = False
        self._unpublished = False
        self.staged_entries = 0
        self._write_errors = WriteErrorLog(clock)
        self.lost_elided = 0  # elided entries found past the checkpoint at start (unanswered)

    # ------------------------------------------------------------------ lifecycle

    @property
    def failed(self) -> bool:
        """A segment flush or the Raft driver failed: this node takes no more writes."""
        return bool(self._commit.failed or (self.driver is not None
                                            and self.driver.failed is not None))

    @property
    def refusing_writes(self) -> bool:
        """The disk refused a write in the last few seconds (ENOSPC, EIO)."""
        return self._write_errors.recent()

    @property
    def transport(self) -> Any:
        """The Raft transport (None for a one-member cluster): Kafka's Metadata asks it which
        peers are live."""
        return self._transport

    @property
    def flush_count(self) -> int:
        return self._commit.flush_count

    @property
    def _solo(self) -> bool:
        """The only voter: entries never leave this process (zero-copy data, write-through)."""
        return len(self.members) <= 1

    @property
    def snapshot_dir(self) -> Path:
        return self.raft_dir / "snapshots"

    def start(self) -> Deferred:
        """Open the Raft log, catch the machine up to it, start the driver and the transport.

        The machine must be recovered already. Fires once every entry this node knew to be
        committed (for a cluster of one: every entry in its log) is applied again.
        """
        self.snapshot_dir.mkdir(parents=True, exist_ok=True)
        self._remove_partial_snapshots()
        # Keep (and, on a fresh cluster member, prepare) as many free files as the log rolls
        # between two compactions: on a VM whose free memory goes back to the host, a file
        # grown afresh costs a host fault per page, and a fresh cluster's first produce run
        # wrote its Raft log at a third of the later runs' speed.
        keep_free = max(KEEP_FREE, -(-self._compact[1] // self._wal_roll) + 1)
        # A one-member cluster's log holds positions, not data (write-through): its small
        # writes stay in the page cache, where the reactor thread makes them without waiting.
        storage = self._storage_override or DiskStorage.open(
            self.raft_dir, roll_bytes=self._wal_roll, keep_free=keep_free,
            direct=not self._solo)
        self.storage = storage
        self._refuse_unreplicated_data(storage)
        self._check_voters(storage)
        self._adopt_checkpoint(storage)
        snap = storage.snapshot
        if snap is not None and self.machine.last_applied < snap.meta.index:
            # Crashed between persisting an installed snapshot and restoring the machine.
            self._restore_files(snap)
        if (self._preallocate and len(self.members) > 1
                and hasattr(storage, "prepare_free") and _fresh(storage)):
            # A new member writes its spare Raft log files before it takes part (about a
            # second, once): written in the background they shared the disk and the Raft
            # I/O thread with the cluster's first writes (ack p99 30-100 ms instead of 10).
            # A restarted member tops them up in the background instead (``RaftDriver``).
            d = self._run_raft_io(_prepare_all_free, storage)
            d.addErrback(lambda f: log.warn("preparing free raft log files failed: {why}",
                                            why=f.getErrorMessage()))
            return d.addCallback(lambda _: self._start_driver(storage))
        return self._start_driver(storage)

    def _start_driver(self, storage: Any) -> Deferred:
        if self._stopped:
            return succeed(None)  # stopped while preparing
        voters = frozenset(self.members) or frozenset({self.node_id})
        node = RaftNode(self.node_id, voters, storage, election_ticks=self._election_ticks,
                        heartbeat_ticks=1, rng=self._rng)
        # Entries up to the machine's checkpoint are already in its files: skip them.
        self._skip_to = self.machine.last_applied
        self.driver = RaftDriver(node, storage, self, self._transport, self._clock,
                                 self._run_raft_io, tick_s=self._tick_s,
                                 compact_entries=self._compact[0], compact_bytes=self._compact[1],
                                 prepare_free=self._preallocate)
        if self._transport is not None:
            self._transport.start(self)
        target = storage.hard_state.commit
        if voters == {self.node_id}:
            target = max(target, node.last_index)
        self.driver.start()
        log.info("raft node {id} of {voters} starting: replay to {target}, checkpoint {ckpt}",
                 id=self.node_id, voters=sorted(voters), target=target, ckpt=self._skip_to)
        return self.driver.wait_applied(target)

    def _remove_partial_snapshots(self) -> None:
        """A snapshot download cut short (a crash, a stop, a leader that went away) leaves a
        ``<index>.part`` tree, or from older versions an ``incoming-<index>.tar``; none is in
        progress at start-up, and a later download of another index would never remove it."""
        for entry in self.snapshot_dir.iterdir():
            if entry.name.endswith(".part") and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            elif entry.name.startswith("incoming-") and entry.name.endswith(".tar"):
                entry.unlink(missing_ok=True)

    def _adopt_checkpoint(self, storage: Any) -> None:
        """A one-member cluster that crashed after a write-through checkpoint but before the
        Raft log held the entries it covers: the checkpoint is the truth (those appends are on
        disk), so the Raft log restarts at it, as if compacted there. Those entries carried
        the saved term (``RaftDriver`` writes through only while the term stands)."""
        applied = self.machine.last_applied
        if len(self.members) > 1 or applied <= storage.last_index:
            return
        hs = storage.hard_state
        log.warn("the checkpoint ({applied}) is ahead of the raft log ({last}): "
                 "restarting the raft log there", applied=applied, last=storage.last_index)
        snap = Snapshot(SnapshotMeta(applied, hs.term, frozenset({self.node_id})),
                        checkpoint_ref(applied))
        storage.restart_at(snap, HardState(hs.term, hs.vote, applied))

    def _refuse_unreplicated_data(self, storage: Any) -> None:
        """A node whose store holds data no Raft log has ever carried (a lone node's data dir)
        must not start as one of several voters: the other members would never receive that
        data, and whichever of them led would serve a different log under the same offsets."""
        fresh = (storage.snapshot is None and storage.last_index == 0
                 and storage.hard_state.term == 0)
        if len(self.members) <= 1 or not fresh or self.machine.last_applied:
            return
        m = self.machine
        held = [n for n in (*m.channels, *m.queues)]
        held += [f"_kafka.{f}" for f, kl in m.keyed.items() if len(kl)]
        if held:
            raise StoreError(
                f"data dir {m.data_dir} holds data written without Raft ({len(held)} "
                f"channel(s)/famil(ies), e.g. {sorted(held)[0]!r}): it cannot join a new "
                f"{len(self.members)}-node cluster; start it without KMQKAFKA_PEERS, or give "
                f"this node an empty data dir")

    def _check_voters(self, storage: Any) -> None:
        """The voter ids are fixed at a node's first start (``raft/voters``). Editing --peers to
        add or drop members of a running cluster is not a membership change: the new members
        would start with empty logs and, with the old voters down, could elect among
        themselves and acknowledge writes the old log later overwrites. So a node whose
        configured ids differ from the recorded ones refuses to start."""
        configured = sorted(self.members) or [self.node_id]
        path = self.raft_dir / "voters"
        if path.exists():
            recorded = json.loads(path.read_text())
            if recorded != configured:
                raise StoreError(
                    f"KMQKAFKA_PEERS names voters {configured} but this node's Raft log belongs "
                    f"to a cluster of {recorded}; start it with the same member ids (addresses "
                    f"may change), or give it an empty data dir to form a new cluster")
            return
        write_atomic(path, json.dumps(configured).encode())

    def stop(self) -> Deferred:
        """Refuse new proposals, fail parked ones, hand leadership over (a leader of a
        multi-node cluster, bounded by ``transfer_timeout_s``), let the driver finish, flush,
        close."""
        self._stopped = True
        if self._outbox and self.driver is not None and self.driver.failed is None:
            # Accepted already: into the log with them (answered once applied, see below).
            self.before_ready()
            self.driver.request_ready()
        for p in self._parked + self._outbox:
            self._fail(p, StoreStopped("the store is stopping"))
        self._parked = []
        self._outbox = []
        if self._checkpoint_timer is not None and self._checkpoint_timer.active():
            self._checkpoint_timer.cancel()
        self._checkpoint_timer = None
        handover = self._hand_over()

        def stop_driver(_: object) -> Deferred:
            return self.driver.stop() if self.driver is not None else succeed(None)

        d = handover.addCallback(stop_driver)

        def rest(_: object) -> Deferred:
            ds = self._transport.stop() if self._transport is not None else succeed(None)
            if self._unpublished:
                # The write-through of staged entries failed: no later flush may checkpoint
                # them (recovery cuts them off); the last checkpoint stands.
                return ds
            return ds.addBoth(lambda _: self._commit.drain())

        def close(_: object) -> None:
            for ps in self._waiting.values():
                for p in ps:
                    self._fail(p, StoreStopped("the store stopped before the command applied"))
            self._waiting = {}
            for p in self._live:
                self._fail(p, StoreStopped("the store stopped before the command applied"))
            self._live.clear()
            if self._sweeper is not None and self._sweeper.active():
                self._sweeper.cancel()
            self._sweeper = None
            if self.storage is not None and hasattr(self.storage, "close"):
                self.storage.close()

        return d.addCallback(rest).addCallback(close)

    def drain(self) -> Deferred:
        return self._commit.drain()

    def _hand_over(self) -> Deferred:
        """Graceful shutdown of a cluster's leader (SIGTERM stops the store, which stops
        this): transfer leadership to the most up-to-date follower, so the cluster does not
        wait an election timeout for a new leader; then give proposals already in the log a
        moment to apply here (so their callers get answers, not StoreStopped). Bounded by
        ``transfer_timeout_s`` each; never fails."""
        driver = self.driver
        if (driver is None or self._transport is None or len(self.members) <= 1
                or not driver.is_leader() or driver.failed is not None):
            return succeed(None)
        deadline = self._clock.seconds() + self._transfer_timeout
        d = driver.transfer_leadership(self._transfer_timeout)

        def transferred(new_leader: int | None) -> Deferred:
            if new_leader is not None:
                log.info("raft node {id}: leadership handed to node {to}", id=self.node_id,
                         to=new_leader)
            else:
                log.warn("raft node {id}: no leadership hand-over before stopping",
                         id=self.node_id)
            return self._until(lambda: not self._waiting, deadline + self._transfer_timeout)

        return d.addCallback(transferred)

    def _until(self, done: Callable[[], bool], deadline: float) -> Deferred:
        """Fire once ``done()`` or at ``deadline``, checking every tick."""
        d: Deferred = Deferred()

        def check() -> None:
            if done() or self._clock.seconds() >= deadline or self.driver.failed is not None:
                d.callback(None)
            else:
                self._clock.callLater(self._tick_s / 2, check)

        check()
        return d

    # ------------------------------------------------------------------ what callers see

    def is_leader(self) -> bool:
        return self.driver is not None and self.driver.is_leader()

    def leader_id(self) -> int | None:
        return self.driver.leader if self.driver is not None else None

    @property
    def election_s(self) -> float:
        """One election timeout, in seconds."""
        return self._election_s

    def member_list(self) -> list[Member]:
        return [self.members[i] for i in sorted(self.members)]

    @property
    def commit_index(self) -> int:
        return self.driver.node.commit_index if self.driver is not None else 0

    @property
    def applied_index(self) -> int:
        return self.driver.node.applied_index if self.driver is not None else 0

    # ------------------------------------------------------------------ proposing

    def propose(self, command: c.Command, *, durable: bool = True) -> Deferred:
        """Order ``command`` through Raft; fire with its apply result (see module docstring)."""
        if self._stopped or self.driver is None:
            return fail(StoreStopped("the store is stopping"))
        if self._commit.failed or self.driver.failed is not None:
            return fail(StorageFailure("a write or fsync of this node's store failed: writes "
                                       "are refused until the daemon restarts and recovers"))
        d: Deferred = Deferred()
        deadline = self._clock.seconds() + self._timeout
        # Keep the pieces (an Append's batch uncopied): a leader's own entry is written, sent
        # to followers and applied from them (``_entry_data``); they are joined only for a
        # group entry or to be forwarded to the leader (``_wire``).
        p = _Pending(d, _encode_parts(command), durable, deadline, command)
        self._live.append(p)
        if self._sweeper is None:
            self._sweeper = self._clock.callLater(self._sweep_s, self._sweep)
        if self.driver.is_leader() and not self._parked:
            # Handed to the core right before the next Ready (``before_ready``): everything
            # proposed meanwhile, e.g. while the previous Ready's fsync runs, shares it.
            self._outbox.append(p)
            self.driver.request_ready()
        else:
            self._submit(p)
        return d

    def has_pending(self) -> bool:
        """Driver hook: proposals wait in the outbox."""
        return bool(self._outbox)

    def before_ready(self) -> None:
        """Driver hook, right before a Ready is cut: propose the outbox, in order; runs of
        small commands become one group entry (one index, one apply, per-command results)."""
        assert self.driver is not None
        if self._outbox and self.driver.follower_backlogged():
            return  # kept in order; the next ack (or tick) cuts another Ready and asks again
        outbox, self._outbox = self._outbox, []
        if not self.driver.is_leader():
            for p in outbox:
                self._submit(p)
            return
        run: list[_Pending] = []
        for p in outbox:
            if p.d.called:
                continue
            if p.size >= self._group_max:
                self._propose_run(run)
                run = []
                self._propose_one(p)
            else:
                run.append(p)
        self._propose_run(run)

    def _propose_one(self, p: _Pending) -> None:
        assert self.driver is not None
        node = self.driver.node
        try:
            index = node.propose(_entry_data(p))
        except ProposalDropped:
            self._parked.append(p)
            return
        self._place(p, index, node.term)

    def _propose_run(self, run: list[_Pending]) -> None:
        if len(run) <= 1:
            for p in run:
                self._propose_one(p)
            return
        assert self.driver is not None
        node = self.driver.node
        parts: list[Any] = [_GROUP_HEAD]
        for p in run:
            parts.append(_LEN.pack(p.size))
            if p.command is not None:
                parts.extend(p.data)
            else:
                parts.append(p.data)
        if self._solo and all(p.command is not None for p in run):
            data: Any = Gather([b"".join(parts)], [p.command for p in run])
        else:
            data = b"".join(parts)
        try:
            index = node.propose(data)
        except ProposalDropped:
            self._parked.extend(run)
            return
        self.group_entries += 1
        term = node.term
        for slot, p in enumerate(run):
            p.slot = slot
            self._place(p, index, term)

    def _sweep(self) -> None:
        """Expire proposals past their deadline (one timer for all of them)."""
        self._sweeper = None
        now = self._clock.seconds()
        live = self._live
        while live and (live[0].d.called or live[0].deadline <= now):
            p = live.popleft()
            if not p.d.called:
                self._expire(p)
        if self._parked and (self.driver is None or self.driver.leader is None):
            self._release_parked(now)
        if live and not self._stopped:
            self._sweeper = self._clock.callLater(self._sweep_s, self._sweep)

    def _submit(self, p: _Pending) -> None:
        assert self.driver is not None
        if p.d.called:
            return
        if self.driver.is_leader():
            try:
                index = self.driver.propose(_entry_data(p))
            except ProposalDropped:
                self._parked.append(p)  # e.g. a leadership transfer; retried on change
                return
            self._place(p, index, self.driver.node.term)
            return
        leader = self.driver.leader
        if leader is None or self._transport is None:
            self._parked.append(p)
            return
        self._forwarding += 1
        self._transport.forward(leader, _wire(p)).addCallbacks(
            self._forwarded, self._forward_failed, callbackArgs=(p,), errbackArgs=(p,))

    def _forwarded(self, position: tuple[int, int], p: _Pending) -> None:
        self._forwarding -= 1
        index, term = position
        if p.d.called:
            return
        done = self._recent.get(index)
        if done is not None or index <= self.applied_index:
            if done is None:
                self._fail(p, CommitTimeout(f"entry {index} applied before its result was kept"))
            elif done[0] != term:
                self._fail(p, ProposalLost(f"entry {index} was replaced by a new leader"))
            else:
                self._resolve(p, done[1])
            return
        self._place(p, index, term)

    def _forward_failed(self, failure: Failure, p: _Pending) -> None:
        self._forwarding -= 1
        if p.d.called:
            return
        # Not accepted by whoever we thought led: wait for the next leader or a short retry.
        # One retry for all of them: a dead leader refuses every forward at once, and a
        # retry per refusal (each resubmitting every parked proposal) multiplied the timers
        # by the number parked every round, starving the election timer.
        self._parked.append(p)
        if self._retry is None or not self._retry.active():
            self._retry = self._clock.callLater(self._tick_s * 2, self._retry_parked)

    def _place(self, p: _Pending, index: int, term: int) -> None:
        p.index, p.term = index, term
        self._waiting.setdefault(index, []).append(p)

    def _retry_parked(self) -> None:
        if self._stopped or self.driver is None or self.driver.leader is None:
            return
        parked, self._parked = self._parked, []
        for p in parked:
            self._submit(p)

    def _release_parked(self, now: float) -> None:
        """Answer NOT_LEADER to proposals that found no leader for two election timeouts:
        a node cut off from the majority knows none, and its clients should look for the
        partition elsewhere rather than wait out the propose timeout."""
        since = now + self._timeout - 2 * self._election_s  # deadline of the oldest to keep
        stale = [p for p in self._parked if p.deadline <= since]
        if not stale:
            return
        self._parked = [p for p in self._parked if p.deadline > since]
        for p in stale:
            if not p.d.called:
                self._fail(p, NoLeaderError("no raft leader known to this node for "
                                            f"{2 * self._election_s:.1f}s"))

    def _expire(self, p: _Pending) -> None:
        if p.d.called:
            return
        if p.index:
            ps = self._waiting.get(p.index, [])
            if p in ps:
                ps.remove(p)
            self._fail(p, CommitTimeout(f"entry {p.index} not applied within {self._timeout}s"))
            return
        if p in self._parked:
            self._parked.remove(p)
        if p in self._outbox:
            self._outbox.remove(p)
        leader = self.driver.leader if self.driver else None
        self._fail(p, NoLeaderError(f"no raft leader within {self._timeout}s "
                                    f"(leader hint: {leader})"))

    def _fail(self, p: _Pending, error: StoreError) -> None:
        p.data = p.command = None  # answered: ``_live`` keeps it until the sweep, not its data
        if not p.d.called:
            p.d.errback(error)

    def _resolve(self, p: _Pending, outcome: Any) -> None:
        """Fire at apply time, ``durable`` or not: the entry is fsynced in the Raft log (and
        on a cluster committed by a quorum) before it is applied, and a crash replays it
        from there (see ``store/checkpoint.py``); the segment fsync is background work."""
        p.data = p.command = None  # answered: ``_live`` keeps it until the sweep, not its data
        if p.d.called:
            return
        if isinstance(outcome, Failure):
            p.d.errback(outcome)
        elif isinstance(outcome, BatchFailure):
            p.d.errback(outcome.error)
        else:
            p.d.callback(outcome)

    # ------------------------------------------------------------------ transport side

    def receive(self, message: Any) -> None:
        """A Raft message from a peer."""
        if self.driver is not None:
            self.driver.step(message)

    def handle_forward(self, data: bytes) -> tuple[int, int]:
        """A follower's command: append it here; returns ``(index, term)``. Raises
        ``NotLeaderError`` (with a hint) when this node is not the leader, ``MalformedCommand``
        when ``data`` is not a command this node could apply."""
        if self._stopped or self.driver is None:
            raise NotLeaderError("node is stopping", None)
        try:
            check_readable(memoryview(data))
        except ValueError as e:
            raise MalformedCommand(f"malformed command: {e}") from None
        try:
            index = self.driver.propose(bytes(data))
        except NotLeader as e:
            raise NotLeaderError(str(e), e.leader) from None
        except ProposalDropped as e:
            raise NotLeaderError(str(e), self.driver.leader) from None
        return index, self.driver.node.term

    def snapshot_path(self, index: int) -> Path | None:
        """The local tree of snapshot ``index`` if present (served to lagging followers)."""
        path = self.snapshot_dir / f"{index:020d}"
        return path if (path / "snapshot.json").exists() else None

    def hold_snapshot(self, index: int) -> Path | None:
        """``snapshot_path``, and the tree is kept from pruning until ``release_snapshot``:
        the transport streams it to a lagging follower straight from its files, which may take
        longer than the log takes to compact again."""
        path = self.snapshot_path(index)
        if path is not None:
            self._held_snapshots[index] = self._held_snapshots.get(index, 0) + 1
        return path

    def release_snapshot(self, index: int) -> None:
        """One ``hold_snapshot`` of ``index`` is over; the last one removes the tree unless it
        is still the newest taken or the one the Raft core sends."""
        left = self._held_snapshots.get(index, 0) - 1
        if left > 0:
            self._held_snapshots[index] = left
            return
        self._held_snapshots.pop(index, None)
        core = self.driver.node.snapshot_index if self.driver is not None else 0
        if index not in (self._kept_snapshot, core):
            shutil.rmtree(self.snapshot_dir / f"{index:020d}", ignore_errors=True)

    # ------------------------------------------------------------------ Application (driver)

    def on_soft_state(self, soft: SoftState) -> None:
        log.info("raft node {id}: {role}, leader {leader}", id=self.node_id,
                 role=soft.role.value, leader=soft.leader)
        if soft.leader is not None and self._parked:
            self._clock.callLater(0, self._retry_parked)
        led, self._led_term = self._led_term, None
        if soft.role is Role.LEADER and self.driver is not None:
            self._led_term = self.driver.node.term
        elif led is not None:
            self._clock.callLater(self._election_s, self._release_deposed, led)

    def _release_deposed(self, term: int) -> None:
        """An election timeout after this node lost the leadership of ``term``: answer the
        proposals it placed then and that no apply has answered since NOT_LEADER (a new
        leader that holds them commits them meanwhile, and the apply answers). An isolated
        leader's writes used to wait out the whole propose timeout as REQUEST_TIMED_OUT,
        which clients retry at the same broker; Kafka's delayed produce answers
        NOT_LEADER_OR_FOLLOWER when the leadership moves, and clients then look it up."""
        if self._stopped or self._led_term == term:
            return
        leader = self.driver.leader if self.driver is not None else None
        for index, ps in list(self._waiting.items()):
            mine = [p for p in ps if p.term == term]
            if not mine:
                continue
            kept = [p for p in ps if p.term != term]
            if kept:
                self._waiting[index] = kept
            else:
                del self._waiting[index]
            for p in mine:
                self._fail(p, NotLeaderError(f"this node lost the leadership of term {term} "
                                             f"before entry {index} committed", leader))

    def apply(self, entry: Entry) -> None:
        """Apply one committed entry (driver, in log order)."""
        index = entry.index
        if index <= self._skip_to:
            return  # already in the machine's files (checkpoint) or restored snapshot
        outcome: Any
        group: list[Any] | None = None
        data = entry.data
        payload = data.payload if type(data) is Gather else None
        if payload is None and entry.kind is EntryKind.NORMAL and data == ELIDED:
            # Written through, but the crash came before its checkpoint: never answered, and
            # recovery cut its bytes off. Nothing to apply (see ``stage``).
            self.lost_elided += 1
            self.machine.last_applied = max(self.machine.last_applied, index)
            outcome = None
        elif entry.kind is EntryKind.NORMAL and payload is not None:
            # Our own entry (one-member cluster): the commands are at hand, no decode.
            if type(payload) is list:
                outcome, group = None, self._apply_group(index, payload)
            else:
                outcome = self._apply_one(index, payload)
        elif entry.kind is EntryKind.NORMAL and len(data) and data[0] == _GROUP:
            view = memoryview(data)
            outcome = None
            group = self._apply_group(index, [_decode(x) for x in _split_group(view)])
        elif entry.kind is EntryKind.NORMAL:
            outcome = self._apply_one(index, _decode(memoryview(data)))
        else:
            # No-ops and membership changes move the applied index too (checkpoints use it).
            self.machine.last_applied = max(self.machine.last_applied, index)
            outcome = None
        self._after_apply(len(data))
        waiting = self._waiting.pop(index, None)
        if self._forwarding:
            self._recent[index] = (entry.term, outcome)
            while len(self._recent) > _RECENT:
                self._recent.popitem(last=False)
        if waiting:
            for p in waiting:
                if p.term != entry.term:
                    lost = ProposalLost(f"entry {index} was replaced by a new leader")
                    self._answer(p, None, lost)
                elif p.slot < 0:
                    self._answer(p, outcome)
                elif group is not None and p.slot < len(group):
                    self._answer(p, group[p.slot])
                else:
                    self._answer(p, None, ProposalLost(f"entry {index} does not hold the command"))

    def _apply_one(self, index: int, command: c.Command) -> Any:
        try:
            return self.machine.apply(index, command)
        except StoreError:
            return Failure()
        except OSError as exc:
            return Failure(self._write_refused(index, exc))
        except Exception:  # a bug in one command must not stop replication
            log.failure("applying entry {index} failed", index=index)
            self.machine.last_applied = max(self.machine.last_applied, index)
            return Failure()

    def _apply_group(self, index: int, commands: list[c.Command]) -> list[Any]:
        try:
            group = self.machine.apply_group(index, commands)
        except Exception:  # a bug must not stop replication
            log.failure("applying group entry {index} failed", index=index)
            self.machine.last_applied = max(self.machine.last_applied, index)
            return []
        for i, res in enumerate(group):
            if isinstance(res, OSError):
                res = self._write_refused(index, res)
            if isinstance(res, BaseException):
                if not isinstance(res, StoreError):
                    log.error("applying command {i} of entry {index} failed: {e!r}",
                              i=i, index=index, e=res)
                group[i] = Failure(res)
        return group

    def _store_failed(self, failure: Failure) -> None:
        """A segment or checkpoint fsync failed: the store refuses every write from now on,
        so this node must neither lead nor vote (it became leader and kept the cluster
        without writes for minutes); as Kafka halts a broker whose log dir failed."""
        if self.driver is not None and self.driver.failed is None:
            self.driver.fail(failure)

    def _write_refused(self, index: int, exc: OSError) -> StorageFailure:
        """The disk refused a write while applying entry ``index`` (ENOSPC, EIO): the segment
        append cut its tail back, so nothing of the command is stored. The only voter answers
        that one command with KAFKA_STORAGE_ERROR and keeps serving (replay never re-applies
        it: its entry is below the next checkpoint, or ELIDED). A member of a larger cluster
        would now hold less than the others under the same index, so it stops taking part."""
        self.machine.last_applied = max(self.machine.last_applied, index)
        self._write_errors.report(exc)
        if not self._solo and self.driver is not None and self.driver.failed is None:
            self.driver.fail(Failure(exc))
        return StorageFailure(f"storage write failed: {exc.strerror or exc}")

    def _answer(self, p: _Pending, outcome: Any, error: StoreError | None = None) -> None:
        if self._staging:
            self._staged.append((p, error if error is not None else outcome))
        elif error is not None:
            self._fail(p, error)
        else:
            self._resolve(p, outcome)

    # ------------------------------------------------------------------ early apply (one member)

    def can_stage(self, entry: Entry) -> bool:
        """Driver hook: may ``entry`` be applied while its own Raft append is being fsynced?

        Only on a one-member cluster (the driver checks that too), and only entries whose
        effect a crash replay undoes: Appends (cut back by the checkpoint, see
        ``store/checkpoint.py``) and no-ops. Catalog, queue and coordinator commands wait for
        the fsync as before."""
        if not self._solo or entry.index <= self._skip_to:
            return entry.index <= self._skip_to
        if entry.kind is EntryKind.NO_OP:
            return True
        if entry.kind is not EntryKind.NORMAL:
            return False
        payload = entry.data.payload if type(entry.data) is Gather else None
        if payload is None:
            return False
        if type(payload) is list:
            return all(type(x) is c.Append for x in payload)
        return type(payload) is c.Append

    def stage(self, entries: list[Entry]) -> None:
        """Driver hook: apply ``entries`` (all ``can_stage``) now; ``write_through`` then makes
        them durable while the Raft log records them ``ELIDED``, and ``publish`` answers.

        Nothing of theirs is observable before it is durable: results are held until
        ``publish``, and readers see the new records only once the segment fsync returned
        (``StateMachine.hold_visibility``; the flush's ``complete_flush`` moves the high
        watermark). Two writes run at once, so a crash can leave either without the other:

        - the checkpoint made it, the Raft log did not: the segments hold the records and the
          checkpoint names their index; ``_adopt_checkpoint`` restarts the Raft log there;
        - the Raft log made it (ELIDED entries), the checkpoint did not: recovery cuts the
          segments back to the previous checkpoint, and replay meets ELIDED entries past it,
          which apply as nothing (``apply``). They were never answered, so nothing acknowledged
          is lost, and nothing is stored twice.

        An ELIDED entry never leaves this node: write-through runs only while it is the sole
        voter, and a one-member cluster's log compacts to its checkpoint.
        """
        self._staging = True
        self._unpublished = True
        self.machine.hold_visibility(True)
        try:
            for entry in entries:
                self.apply(entry)
        finally:
            self._staging = False
            self.machine.hold_visibility(False)
        self.staged_entries += len(entries)

    def write_through(self) -> Deferred:
        """Driver hook: fires once everything applied so far, the staged entries included, is
        fsynced and covered by an applied-index checkpoint; fails (and so do the staged
        proposals) if that fsync fails."""
        d: Deferred = Deferred()
        if self._commit.failed:
            d.errback(StorageFailure("an earlier fsync of the store failed"))
        else:
            self._commit.add(d, None)
        return d.addErrback(self._write_through_failed)

    def _write_through_failed(self, failure: Failure) -> Failure:
        staged, self._staged = self._staged, []
        for p, _outcome in staged:
            self._fail(p, StorageFailure("the store's fsync failed: the write is not durable"))
        return failure

    def publish(self) -> None:
        """Driver hook: the staged entries are durable (segments and checkpoint) and in the
        Raft log: show them to readers and answer their proposals."""
        self.machine.release_visibility()
        staged, self._staged = self._staged, []
        self._unpublished = False
        for p, outcome in staged:
            if isinstance(outcome, StoreError):
                self._fail(p, outcome)
            else:
                self._resolve(p, outcome)

    # ------------------------------------------------------------------ checkpoints

    def _after_apply(self, nbytes: int) -> None:
        """Checkpoint (segment fsync + applied-index record) after enough bytes or a while:
        only crash replay depends on it, so it stays off the acknowledgement path."""
        self._since_checkpoint += nbytes
        if self._since_checkpoint >= self._checkpoint_bytes:
            self._checkpoint_now()
        elif self._checkpoint_timer is None and not self._stopped:
            self._checkpoint_timer = self._clock.callLater(self._checkpoint_interval,
                                                           self._checkpoint_now)

    def _checkpoint_now(self) -> None:
        if self._checkpoint_timer is not None and self._checkpoint_timer.active():
            self._checkpoint_timer.cancel()
        self._checkpoint_timer = None
        self._since_checkpoint = 0
        if not self._stopped:  # stop() drains the group commit itself
            self._commit.schedule()

    @property
    def compacts_to_checkpoint(self) -> bool:
        """Driver hook: a one-member cluster compacts its Raft log to its applied-index
        checkpoint (the segments are the state; no follower ever needs a snapshot tree)."""
        return len(self.members) <= 1

    def compaction_point(self, applied: int) -> tuple[int, bytes] | None:
        """Driver hook: the newest durable checkpoint (<= ``applied``), or None (and a
        checkpoint is started) when it covers nothing new."""
        assert self.driver is not None
        journal = self.machine.journal
        durable = min(journal.durable_applied if journal is not None else 0, applied)
        if durable <= self.driver.node.snapshot_index:
            if not self._commit.busy:
                self._checkpoint_now()
            return None
        return durable, checkpoint_ref(durable)

    def has_snapshot(self, snapshot: Snapshot) -> bool:
        if snapshot.data.startswith(b"kmq-checkpoint:"):
            return False  # a one-member cluster's checkpoint: no files to install
        return self.snapshot_path(_ref_index(snapshot.data)) is not None

    def restore(self, snapshot: Snapshot) -> None:
        """Install a snapshot the leader sent (files fetched already). Blocking, rare. Other
        snapshot trees go: this node serves the one it installed, and trees fetched earlier
        would only fill its disk."""
        self._restore_files(snapshot)
        self.prune_snapshots(keep=_ref_index(snapshot.data))
        for index in [i for i in self._waiting if i <= snapshot.meta.index]:
            for p in self._waiting.pop(index):
                self._fail(p, CommitTimeout(f"entry {index} covered by an installed snapshot"))

    def _restore_files(self, snapshot: Snapshot) -> None:
        path = self.snapshot_path(_ref_index(snapshot.data))
        if path is None:
            raise StoreError(f"snapshot {snapshot.meta.index} files are missing")
        log.info("installing snapshot {index}", index=snapshot.meta.index)
        self.machine.restore(path, int(self._clock.seconds() * 1000))
        self.machine.last_applied = max(self.machine.last_applied, snapshot.meta.index)
        self.machine.reset_checkpoint()
        self._skip_to = max(getattr(self, "_skip_to", 0), snapshot.meta.index)

    def take_snapshot(self, index: int) -> Deferred:
        """Flush, roll large active segments (and flush their indexes), then write the state
        at ``index`` to ``snapshots/<index>`` (I/O thread): closed segments are hard-linked,
        only small active ones are copied."""
        dest = self.snapshot_dir / f"{index:020d}"

        def roll(_: object) -> Deferred | None:
            if self.machine.roll_for_snapshot(_SNAPSHOT_COPY_MAX):
                return self._commit.drain()
            return None

        def snap(_: object) -> Deferred:
            if self.machine.last_applied != index:
                raise StoreError(f"applied {self.machine.last_applied} != snapshot {index}")
            if dest.exists():
                shutil.rmtree(dest)
            return self._run_io(self.machine.snapshot, dest)

        def prune(_: object) -> bytes:
            self.prune_snapshots(keep=index)
            return snapshot_ref(index)

        return self._commit.drain().addCallback(roll).addCallback(snap).addCallback(prune)

    def prune_snapshots(self, keep: int) -> None:
        """Remove snapshot trees except ``keep`` (just taken) and the one the Raft core holds
        now (what lagging followers are sent until the log is compacted to ``keep``). Only
        the numbered trees: the directory also holds trees being received (``.part``). A
        tree being sent to a follower (``hold_snapshot``) stays until a prune after its
        release."""
        self._kept_snapshot = keep
        core = self.driver.node.snapshot_index if self.driver is not None else 0
        for old in self.snapshot_dir.iterdir():
            if (old.is_dir() and old.name.isdigit()
                    and int(old.name) not in (keep, core, *self._held_snapshots)):
                shutil.rmtree(old, ignore_errors=True)


def one_member_factory(reactor: Any, raft_dir: Path, *, node_id: int = 1,
                       rng: random.Random | None = None, **kwargs: Any) -> Callable[..., Any]:
    """A ``ChannelStore`` proposer factory: Raft with this node as the only voter, Raft log
    writes on their own I/O thread (what ``tap.raft_proposer_factory`` builds without peers;
    used by benchmarks and tests)."""
    from twisted.internet import threads
    from twisted.python.threadpool import ThreadPool

    def factory(machine: StateMachine, clock: Any, run_io: IORunner) -> RaftProposer:
        pool = ThreadPool(1, 1, "kmqkafka-raft")
        pool.start()
        reactor.addSystemEventTrigger("after", "shutdown", pool.stop)

        def run_raft_io(f: Callable[..., Any], *args: Any) -> Deferred:
            return threads.deferToThreadPool(reactor, pool, f, *args)

        proposer = RaftProposer(machine, clock, run_io, node_id=node_id, members=None,
                                transport=None, raft_dir=Path(raft_dir),
                                rng=rng or random.Random(), run_raft_io=run_raft_io, **kwargs)
        proposer.io_pool = pool
        return proposer

    return factory
