"""The transaction coordinator: transactional ids, their producer ids and epochs, and the
transaction each has open (KIP-98), kept in the ``txn`` coordinator family.

On-disk format (one keyed record per transactional id)::

    key   = b"tid:" + transactional_id                               (UTF-8)
    value = JSON {"pid", "epoch", "timeout", "state", "parts": [[topic, p], ...],
                  "groups": {group: [[topic, p, offset, leader_epoch, metadata], ...]},
                  "start", "update"}

Kafka writes PrepareCommit/PrepareAbort to ``__transaction_state``, then markers to every
partition, then CompleteCommit/CompleteAbort, because its partitions live on many brokers.
Here every partition and the offsets are one replicated state machine, so ending a transaction
is **one** Raft entry (``Batch``): a COMMIT or ABORT marker appended to each partition the
transaction added, the pending ``TxnOffsetCommit`` offsets (on commit), and the id's new state.
Either all of it applies or none of it, on every node; there are no Prepare states to recover.

Pending offsets live in the id's record until the commit, so a new leader that takes over a
half-done transaction still commits exactly what the producer sent. A transaction older than
its timeout is aborted by the serving coordinator with the epoch bumped (its markers carry the
new epoch, so the old producer's late writes are refused by every partition). InitProducerId on
an id with an open transaction aborts it the same way (fencing a zombie). An id with no open
transaction that has not been used for ``transactional.id.expiration.ms`` (7 days) is forgotten,
as Kafka forgets it.

State changes only after the write is durable; one ``DeferredLock`` serializes every operation
(transaction control calls are few; their data goes through Produce). Reactor thread only.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

from kio.schema.errors import ErrorCode
from twisted.internet.defer import Deferred, DeferredLock, succeed
from twisted.logger import Logger

from kmqkafka import records
from kmqkafka.coordinators.offsets import FAMILY as OFFSETS_FAMILY, CommittedOffset, OffsetStore
from kmqkafka.store import commands as c
from kmqkafka.store.machine import BatchFailure
from kmqkafka.store.names import channel_for

__all__ = ["TxnCoordinator", "TxnMeta", "TxnError", "FAMILY"]

log = Logger()

FAMILY = "txn"
KEY_PREFIX = b"tid:"
MAX_EPOCH = 32767  # Short.MAX_VALUE: an id at this epoch gets a fresh producer id
ID_EXPIRATION_MS = 7 * 24 * 3600 * 1000  # Kafka's transactional.id.expiration.ms

EMPTY, ONGOING = "Empty", "Ongoing"
COMPLETE_COMMIT, COMPLETE_ABORT = "CompleteCommit", "CompleteAbort"
STATES = (EMPTY, ONGOING, "PrepareCommit", "PrepareAbort", COMPLETE_COMMIT, COMPLETE_ABORT,
          "Dead", "PrepareEpochFence")

PendingOffset = tuple[str, int, int, int, "str | None"]  # topic, p, offset, leader epoch, meta


class TxnError(Exception):
    """A request the coordinator refuses: ``code`` is the Kafka error to answer."""

    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(message or code.name)
        self.code = code


@dataclass(frozen=True, slots=True)
class TxnMeta:
    transactional_id: str
    producer_id: int
    epoch: int
    timeout_ms: int
    state: str = EMPTY
    partitions: tuple[tuple[str, int], ...] = ()
    groups: dict[str, tuple[PendingOffset, ...]] = field(default_factory=dict)
    start_ms: int = -1
    update_ms: int = -1

    def encode(self) -> bytes:
        return json.dumps({
            "pid": self.producer_id, "epoch": self.epoch, "timeout": self.timeout_ms,
            "state": self.state, "parts": [list(p) for p in self.partitions],
            "groups": {g: [list(o) for o in offs] for g, offs in self.groups.items()},
            "start": self.start_ms, "update": self.update_ms,
        }, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, transactional_id: str, raw: bytes) -> "TxnMeta":
        d = json.loads(raw)
        return cls(transactional_id, d["pid"], d["epoch"], d["timeout"], d["state"],
                   tuple((t, p) for t, p in d["parts"]),
                   {g: tuple(tuple(o) for o in offs) for g, offs in d["groups"].items()},
                   d["start"], d["update"])

    def pending_offset(self, group_id: str, topic: str, partition: int) -> bool:
        return any(o[0] == topic and o[1] == partition for o in self.groups.get(group_id, ()))


def _key(transactional_id: str) -> bytes:
    return KEY_PREFIX + transactional_id.encode()


class TxnCoordinator:
    """Every transactional id of the cluster. Runs on the node that serves coordinators.

    ``allocate_pid() -> Deferred[int]`` hands out fresh producer ids (``producers.ProducerIds``);
    ``on_offsets_committed(group_id, records)`` lets the group coordinator mirror offsets a
    commit wrote; ``partition_count(topic) -> int | None`` says whether a partition exists.
    """

    def __init__(self, store: Any, allocate_pid: Callable[[], Deferred],
                 partition_count: Callable[[str], int | None],
                 on_offsets_committed: Callable[[str, list], None],
                 max_timeout_ms: int = 900_000) -> None:
        self.store = store
        self.allocate_pid = allocate_pid
        self.partition_count = partition_count
        self.on_offsets_committed = on_offsets_committed
        self.max_timeout_ms = max_timeout_ms
        self.txns: dict[str, TxnMeta] = {}
        self.loaded = False
        self._lock = DeferredLock()

    # --- life cycle ---------------------------------------------------------------------

    def load(self) -> None:
        if self.loaded:
            return
        self.txns.clear()
        for key, value in self.store.keyed_items(FAMILY, KEY_PREFIX):
            tid = key[len(KEY_PREFIX):].decode()
            self.txns[tid] = TxnMeta.decode(tid, value)
        self.loaded = True

    def unload(self) -> None:
        self.txns.clear()
        self.loaded = False

    def _run(self, op: Callable[..., Any], *args: Any) -> Deferred:
        return self._lock.run(lambda: Deferred.fromCoroutine(op(*args)))

    async def _save(self, meta: TxnMeta, extra: Iterable[c.Command] = ()) -> TxnMeta:
        put = c.KeyedPut(FAMILY, ((_key(meta.transactional_id), meta.encode()),),
                         self.store.now_ms())
        commands = (*extra, put)
        command = commands[0] if len(commands) == 1 else c.Batch(commands)
        result = await self.store.propose(command)
        if isinstance(result, BatchFailure):
            raise result.error
        self.txns[meta.transactional_id] = meta
        return meta

    def _current(self, transactional_id: str, producer_id: int, epoch: int) -> TxnMeta:
        meta = self.txns.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            raise TxnError(ErrorCode.invalid_producer_id_mapping,
                           f"transactional id {transactional_id!r} has no producer "
                           f"{producer_id}")
        if epoch != meta.epoch:
            raise TxnError(ErrorCode.producer_fenced,
                           f"epoch {epoch} is not the current epoch {meta.epoch}")
        return meta

    # --- InitProducerId -----------------------------------------------------------------

    def init_producer(self, transactional_id: str, timeout_ms: int, producer_id: int,
                      epoch: int) -> Deferred:
        """Fire with the id's (producer id, epoch) after fencing whatever came before."""
        return self._run(self._init, transactional_id, timeout_ms, producer_id, epoch)

    async def _init(self, tid: str, timeout_ms: int, producer_id: int,
                    epoch: int) -> tuple[int, int]:
        if not tid:
            raise TxnError(ErrorCode.invalid_request, "the transactional id is empty")
        if not 0 < timeout_ms <= self.max_timeout_ms:
            raise TxnError(ErrorCode.invalid_transaction_timeout,
                           f"transaction timeout {timeout_ms} ms is outside "
                           f"1..{self.max_timeout_ms}")
        now = self.store.now_ms()
        meta = self.txns.get(tid)
        if meta is None:
            pid = await self.allocate_pid()
            saved = await self._save(TxnMeta(tid, pid, 0, timeout_ms, EMPTY, (), {}, -1, now))
            return saved.producer_id, saved.epoch
        if producer_id != -1 and (producer_id, epoch) != (meta.producer_id, meta.epoch):
            # KIP-360: a producer may only bump the epoch it holds.
            raise TxnError(ErrorCode.producer_fenced,
                           f"producer {producer_id} epoch {epoch} is not the current one")
        if meta.state == ONGOING:
            meta = await self._end(meta, commit=False, bump=True)
        pid, new_epoch = meta.producer_id, meta.epoch + 1
        if new_epoch >= MAX_EPOCH:
            pid, new_epoch = await self.allocate_pid(), 0
        saved = await self._save(replace(meta, producer_id=pid, epoch=new_epoch,
                                         timeout_ms=timeout_ms, state=EMPTY, partitions=(),
                                         groups={}, start_ms=-1, update_ms=now))
        return saved.producer_id, saved.epoch

    # --- AddPartitionsToTxn / AddOffsetsToTxn -------------------------------------------

    def add_partitions(self, tid: str, producer_id: int, epoch: int,
                       partitions: list[tuple[str, int]]) -> Deferred:
        """Fire with {(topic, p): ErrorCode}; raises TxnError for the whole request."""
        return self._run(self._add_partitions, tid, producer_id, epoch, partitions)

    async def _add_partitions(self, tid: str, producer_id: int, epoch: int,
                              partitions: list[tuple[str, int]]) -> dict:
        meta = self._current(tid, producer_id, epoch)
        unknown = {tp for tp in partitions if not self._exists(*tp)}
        if unknown:
            return {tp: ErrorCode.unknown_topic_or_partition if tp in unknown
                    else ErrorCode.operation_not_attempted for tp in partitions}
        have = set(meta.partitions)
        added = tuple(tp for tp in dict.fromkeys(partitions) if tp not in have)
        if added or meta.state != ONGOING:
            await self._save(self._begun(meta, partitions=meta.partitions + added))
        return {tp: ErrorCode.none for tp in partitions}

    def _exists(self, topic: str, partition: int) -> bool:
        count = self.partition_count(topic)
        return count is not None and 0 <= partition < count

    def _begun(self, meta: TxnMeta, **changes: Any) -> TxnMeta:
        """``meta`` with ``changes``, as an open transaction (a new one starts now)."""
        now = self.store.now_ms()
        if meta.state != ONGOING:
            changes.setdefault("partitions", ())
            changes.setdefault("groups", {})
            return replace(meta, state=ONGOING, start_ms=now, update_ms=now, **changes)
        return replace(meta, update_ms=now, **changes)

    def add_offsets(self, tid: str, producer_id: int, epoch: int, group_id: str) -> Deferred:
        return self._run(self._add_offsets, tid, producer_id, epoch, group_id)

    async def _add_offsets(self, tid: str, producer_id: int, epoch: int, group_id: str) -> None:
        meta = self._current(tid, producer_id, epoch)
        if meta.state == ONGOING and group_id in meta.groups:
            return
        groups = dict(meta.groups) if meta.state == ONGOING else {}
        groups.setdefault(group_id, ())
        await self._save(self._begun(meta, groups=groups))

    # --- TxnOffsetCommit ----------------------------------------------------------------

    def commit_offsets(self, tid: str, producer_id: int, epoch: int, group_id: str,
                       offsets: list[PendingOffset]) -> Deferred:
        """Hold ``offsets`` until the transaction ends (they count only if it commits)."""
        return self._run(self._commit_offsets, tid, producer_id, epoch, group_id, offsets)

    async def _commit_offsets(self, tid: str, producer_id: int, epoch: int, group_id: str,
                              offsets: list[PendingOffset]) -> None:
        meta = self._current(tid, producer_id, epoch)
        if meta.state != ONGOING or group_id not in meta.groups:
            raise TxnError(ErrorCode.invalid_txn_state,
                           f"group {group_id!r} was not added to the transaction")
        merged = {(o[0], o[1]): o for o in meta.groups[group_id]}
        merged.update({(o[0], o[1]): o for o in offsets})
        groups = dict(meta.groups)
        groups[group_id] = tuple(merged.values())
        await self._save(replace(meta, groups=groups, update_ms=self.store.now_ms()))

    # --- EndTxn -------------------------------------------------------------------------

    def end(self, tid: str, producer_id: int, epoch: int, commit: bool) -> Deferred:
        return self._run(self._end_request, tid, producer_id, epoch, commit)

    async def _end_request(self, tid: str, producer_id: int, epoch: int, commit: bool) -> None:
        meta = self._current(tid, producer_id, epoch)
        if meta.state == ONGOING:
            await self._end(meta, commit=commit, bump=False)
            return
        if meta.state == (COMPLETE_COMMIT if commit else COMPLETE_ABORT):
            return  # a retry of the call that ended it
        raise TxnError(ErrorCode.invalid_txn_state,
                       f"cannot {'commit' if commit else 'abort'} a transaction in state "
                       f"{meta.state}")

    async def _end(self, meta: TxnMeta, *, commit: bool, bump: bool) -> TxnMeta:
        """One Raft entry: a marker per partition, the offsets on commit, the new state.
        ``bump``: the markers carry epoch + 1 (a coordinator-side abort fencing the producer)."""
        epoch = meta.epoch + 1 if bump and meta.epoch + 1 < MAX_EPOCH else meta.epoch
        now = self.store.now_ms()
        marker = records.build_control_batch(commit=commit, producer_id=meta.producer_id,
                                             producer_epoch=epoch, now_ms=now)
        appends = [c.Append(channel_for(t, p), now, marker) for t, p in meta.partitions
                   if self.store.exists(channel_for(t, p))]
        offsets: list[tuple[str, list]] = []
        if commit:
            for group_id, pending in meta.groups.items():
                if pending:
                    offsets.append((group_id, OffsetStore.commit_records(group_id, [
                        (t, p, CommittedOffset(o, le, m, now)) for t, p, o, le, m in pending])))
        puts = [c.KeyedPut(OFFSETS_FAMILY, tuple(recs), now) for _g, recs in offsets]
        done = replace(meta, epoch=epoch, state=COMPLETE_COMMIT if commit else COMPLETE_ABORT,
                       partitions=(), groups={}, update_ms=now)
        saved = await self._save(done, [*appends, *puts])
        for group_id, recs in offsets:
            self.on_offsets_committed(group_id, recs)
        log.debug("transaction {tid} {outcome} ({n} partition(s))", tid=meta.transactional_id,
                  outcome="committed" if commit else "aborted", n=len(appends))
        return saved

    # --- time-outs ----------------------------------------------------------------------

    def abort_expired(self) -> Deferred:
        """Abort (fencing the producer) every transaction open longer than its timeout, and
        forget ids idle past ``ID_EXPIRATION_MS``; fires with how many were aborted."""
        now = self.store.now_ms()
        due = [m.transactional_id for m in self.txns.values()
               if m.state == ONGOING and now - m.start_ms > m.timeout_ms]
        idle = [m.transactional_id for m in self.txns.values()
                if m.state != ONGOING and now - m.update_ms > ID_EXPIRATION_MS]
        if not due and not idle:
            return succeed(0)
        return self._run(self._abort_expired, due, idle)

    async def _abort_expired(self, due: list[str], idle: list[str]) -> int:
        now = self.store.now_ms()
        gone = [tid for tid in idle if tid in self.txns and self.txns[tid].state != ONGOING
                and now - self.txns[tid].update_ms > ID_EXPIRATION_MS]
        if gone:
            await self.store.propose(c.KeyedPut(
                FAMILY, tuple((_key(tid), None) for tid in gone), now))
            for tid in gone:
                self.txns.pop(tid, None)
            log.info("forgot {n} transactional id(s) idle for 7 days", n=len(gone))
        n = 0
        for tid in due:
            meta = self.txns.get(tid)
            if meta is None or meta.state != ONGOING or now - meta.start_ms <= meta.timeout_ms:
                continue
            log.info("transaction {tid} timed out after {ms} ms: aborting it", tid=tid,
                     ms=now - meta.start_ms)
            await self._end(meta, commit=False, bump=True)
            n += 1
        return n

    # --- queries ------------------------------------------------------------------------

    def unstable(self, group_id: str, topic: str, partition: int) -> bool:
        """An open transaction holds an offset of this group and partition (KIP-447)."""
        return any(m.state == ONGOING and m.pending_offset(group_id, topic, partition)
                   for m in self.txns.values())

    def describe(self, tid: str) -> TxnMeta | None:
        return self.txns.get(tid)
