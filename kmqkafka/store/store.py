"""ChannelStore: the one API every surface (Kafka, native, Pub/Sub) uses to reach the disk.

Mutations become commands handed to the proposer (local group commit today,
Raft later) and return Deferreds that fire once the change is durable. Reads
are synchronous page-cache reads of whole stored batches, bounded by the
durable end (the high watermark). Parked readers wait in ``Waiters``.

Channel names that start with ``_kafka.`` are reserved: every method refuses
them unless the caller passes ``internal=True`` (only coordinators do).

Reactor-thread only. Start order: ``start()`` recovers every channel before
anything else may call in; ``stop()`` refuses new work, drains the group
commit (final fsync) and closes files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from twisted.internet import threads
from twisted.internet.defer import Deferred, FirstError, gatherResults, maybeDeferred, succeed
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool

from kmqkafka.records import NewRecord, build_batch
from kmqkafka.store import commands as c
from kmqkafka.store.config import LogConfig
from kmqkafka.store.errors import StoreStopped
from kmqkafka.store.machine import AppendResult, StateMachine
from kmqkafka.store.names import check_channel_name, check_client_channel, partition_of
from kmqkafka.store.pagecache import PageCacheBudget
from kmqkafka.store.proposer import LocalProposer
from kmqkafka.store.waiters import Waiters

log = Logger()

CATCH_UP_FAMILY = "config"  # any coordinator family: the catch-up write carries no pairs


def _surviving(task: Callable[[], Any]) -> Deferred:
    """Run one round of a background task; a failed round (no Raft leader for a while, a
    full disk) is logged, and the task runs again next interval instead of stopping for good."""
    d = maybeDeferred(task)

    def failed(f: Any) -> None:
        exc = f.value.subFailure.value if isinstance(f.value, FirstError) else f.value
        if isinstance(exc, StoreStopped):  # shutting down: no next interval
            return
        log.warn("background store task {task} failed: {error}; it runs again next interval",
                 task=getattr(task, "__name__", task), error=f.getErrorMessage())

    return d.addErrback(failed)

__all__ = ["AppendResult", "ChannelBounds", "ChannelStore"]


@dataclass(frozen=True, slots=True)
class ChannelBounds:
    """Where a channel's data starts and ends (Sequences; offset = Sequence - 1).

    ``high_watermark`` is the next durable Sequence: readers see everything
    below it. ``next_sequence`` also counts appends still waiting for fsync.
    """

    log_start: int
    high_watermark: int
    next_sequence: int


def _inline(f: Callable[..., Any], *args: Any) -> Deferred:
    return maybeDeferred(f, *args)


class ChannelStore:
    """The durable channel store of one node."""

    def __init__(
        self,
        data_dir: Path,
        reactor: Any,
        *,
        default_config: LogConfig | None = None,
        registry: CollectorRegistry | None = None,
        threaded_io: bool = True,
        retention_interval_s: float = 60.0,
        compaction_interval_s: float = 15.0,  # Kafka's log.cleaner.backoff.ms
        queue_expiry_interval_s: float = 0.5,
        proposer_factory: Callable[[StateMachine, Any, Callable[..., Deferred]], Any] | None = None,
        page_cache_bytes: int = 0,
    ) -> None:
        """``proposer_factory(machine, reactor, run_io)`` builds a replicated proposer (Raft,
        see ``kmqkafka.raft.proposer``); the machine then keeps its applied-index checkpoint.
        Without it, the ``LocalProposer`` orders commands (unit tests, tools).
        ``page_cache_bytes`` > 0 bounds the page cache of Events channels' segment data
        (``pagecache.py``); 0 leaves it to the kernel."""
        self.data_dir = Path(data_dir)
        self._reactor = reactor
        self._threaded = threaded_io
        self._io_pool: ThreadPool | None = None
        self._cleaner_pool: ThreadPool | None = None
        self.machine = StateMachine(
            self.data_dir, default_config=default_config, on_advance=self._advanced,
            replicated=proposer_factory is not None,
            page_cache=PageCacheBudget(page_cache_bytes) if page_cache_bytes > 0 else None,
        )
        self.waiters = Waiters(reactor, self._durable_end)
        self._proposer: Any = (
            proposer_factory(self.machine, reactor, self._run_io) if proposer_factory is not None
            else LocalProposer(self.machine, reactor, self._run_io)
        )
        self._loops: list[LoopingCall] = []
        self._intervals = (retention_interval_s, compaction_interval_s, queue_expiry_interval_s)
        self._advance_listeners: list[Callable[[str], None]] = []
        self._compacting: set[str] = set()
        self.started = False
        if registry is not None:
            registry.register(_StoreCollector(self))

    # --- lifecycle --------------------------------------------------------------------

    def now_ms(self) -> int:
        return int(self._reactor.seconds() * 1000)

    def start(self) -> Deferred:
        """Recover every channel from disk, start the proposer (Raft replays its log), then
        background retention/compaction. Fires once the proposer has caught up locally."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.machine.recover(self.now_ms())
        if self._threaded:
            self._io_pool = ThreadPool(1, 1, "kmqkafka-io")
            self._cleaner_pool = ThreadPool(1, 1, "kmqkafka-cleaner")
            self._io_pool.start()
            self._cleaner_pool.start()
        ready = self._proposer.start()
        retention, compaction, expiry = self._intervals
        for interval, fn in (
            (retention, self.enforce_retention),
            (compaction, self.compact_all),
            (expiry, self._expire_queues),
        ):
            loop = LoopingCall(_surviving, fn)
            loop.clock = self._reactor
            loop.start(interval, now=False)
            self._loops.append(loop)
        self.started = True
        log.info("store recovered {n} channel(s) from {dir}", n=len(self.list_channels(internal=True)),
                 dir=str(self.data_dir))
        return ready

    # --- replication ------------------------------------------------------------------

    @property
    def proposer(self) -> Any:
        """The proposer in use: ``RaftProposer`` (``is_leader``, ``leader_id``,
        ``member_list``, ``commit_index``, ``applied_index``) or ``LocalProposer``."""
        return self._proposer

    @property
    def failed(self) -> bool:
        """True once a write failure left the store refusing writes until a restart (a failed
        group-commit fsync, or a Raft driver that stopped taking part)."""
        return bool(getattr(self._proposer, "failed", False))

    @property
    def refusing_writes(self) -> bool:
        """True while the disk refuses writes (a write refused in the last few seconds, e.g.
        a full disk): the store still serves reads and takes writes again once it can."""
        return bool(getattr(self._proposer, "refusing_writes", False))

    def is_leader(self) -> bool:
        """True if this node orders commands (always, without Raft)."""
        check = getattr(self._proposer, "is_leader", None)
        return True if check is None else check()

    def set_serving(self, serving: bool) -> None:
        """Tell the other cluster members whether this node serves Kafka clients: they list
        it in Metadata only while it does (``RaftTransport.serving``). No-op without peers."""
        transport = getattr(self._proposer, "transport", None)
        if transport is not None:
            transport.serving = serving

    def catch_up(self, timeouts: int = 5) -> Deferred:
        """Fire (True) once this node has applied everything the cluster's leader had
        committed when it was asked: an empty write goes through Raft (a follower forwards
        it) and is applied here after everything before it. Kafka's broker likewise waits
        for its initial metadata catch-up before serving, so a restarted node does not answer
        Metadata with topics or partition counts the cluster has moved past. Gives up (False)
        after ``timeouts`` election timeouts, e.g. when no quorum is up. A lone node is
        caught up at once."""
        proposer = self._proposer
        if len(getattr(proposer, "members", None) or ()) <= 1:
            return succeed(True)
        done: Deferred = Deferred()
        reactor = self._reactor

        def finish(caught_up: bool) -> None:
            if not done.called:
                done.callback(caught_up)

        def attempt() -> None:
            if done.called:
                return
            try:
                barrier = self.keyed_put(CATCH_UP_FAMILY, [])
            except Exception:  # noqa: BLE001 - a stopping store: give up
                finish(False)
                return
            barrier.addCallbacks(lambda _r: finish(True),
                                 lambda _f: reactor.callLater(proposer.election_s / 2, attempt))

        timer = reactor.callLater(timeouts * proposer.election_s, finish, False)
        done.addBoth(lambda r: (timer.active() and timer.cancel(), r)[1])
        attempt()
        return done

    def settled(self, timeout_s: float) -> Deferred:
        """Fire once this node has applied every entry it knows to be committed (at most
        ``timeout_s`` later). A follower learns a commit a moment before it applies it; a
        client told by the leader that its topic exists may ask a follower in that moment.
        A lone node, or one with nothing pending, fires at once."""
        proposer = self._proposer
        driver = getattr(proposer, "driver", None)
        if driver is None or proposer.applied_index >= proposer.commit_index:
            return succeed(None)
        # Given up at the timeout by cancelling it, which takes the waiter off the driver's
        # list (firing the driver's Deferred from here instead made the later apply raise
        # AlreadyCalledError and stopped the node).
        return driver.wait_applied(proposer.commit_index).addTimeout(
            timeout_s, self._reactor, onTimeoutCancel=lambda _result, _timeout: None)

    def leader_id(self) -> int | None:
        """The Raft leader's node id (None: unknown, or no Raft)."""
        get = getattr(self._proposer, "leader_id", None)
        return None if get is None else get()

    def stop(self) -> Deferred:
        """Refuse new work, fsync what is pending, close every file."""
        for loop in self._loops:
            if loop.running:
                loop.stop()
        self._loops = []
        d = self._proposer.stop()

        def close(_: object) -> None:
            self.waiters.wake_all()
            self.machine.close(save_scans=True)
            for pool in (self._io_pool, self._cleaner_pool):
                if pool is not None:
                    pool.stop()
            self._io_pool = self._cleaner_pool = None
            self.started = False

        return d.addCallback(close)

    def _run_io(self, f: Callable[..., Any], *args: Any) -> Deferred:
        if self._io_pool is None:
            return _inline(f, *args)
        return threads.deferToThreadPool(self._reactor, self._io_pool, f, *args)

    def _run_cleaner(self, f: Callable[..., Any], *args: Any) -> Deferred:
        if self._cleaner_pool is None:
            return _inline(f, *args)
        return threads.deferToThreadPool(self._reactor, self._cleaner_pool, f, *args)

    # --- notifications ----------------------------------------------------------------

    def _durable_end(self, name: str) -> int:
        ch = self.machine.channels.get(name)
        return ch.durable_sequence if ch is not None else 0

    def _advanced(self, name: str) -> None:
        self.waiters.notify(name)
        for listener in self._advance_listeners:
            listener(name)

    def on_advance(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(channel)`` whenever a channel's durable end or start moves."""
        self._advance_listeners.append(listener)

    # --- commands ---------------------------------------------------------------------

    def propose(self, command: c.Command, *, durable: bool = True) -> Deferred:
        """Submit any command (used by coordinators for composite changes)."""
        return self._proposer.propose(command, durable=durable)

    @staticmethod
    def _check(name: str, internal: bool) -> None:
        if internal:
            check_channel_name(name)
        else:
            check_client_channel(name)

    # --- catalog ----------------------------------------------------------------------

    def create_channel(
        self,
        name: str,
        *,
        kind: str = "events",
        config: dict | None = None,
        exist_ok: bool = False,
        internal: bool = False,
    ) -> Deferred:
        """Create a channel; fires True if created, False if it existed and exist_ok."""
        try:
            self._check(name, internal)
        except Exception as exc:
            return _failed(exc)
        return self.propose(c.CreateChannel(name, kind, dict(config or {}), exist_ok))

    def delete_channel(self, name: str, *, missing_ok: bool = False, internal: bool = False) -> Deferred:
        try:
            self._check(name, internal)
        except Exception as exc:
            return _failed(exc)
        return self.propose(c.DeleteChannel(name, missing_ok))

    def set_config(self, name: str, changes: dict, *, internal: bool = False) -> Deferred:
        """Change LogConfig fields of an Events Store channel; fires with the new config."""
        try:
            self._check(name, internal)
        except Exception as exc:
            return _failed(exc)
        return self.propose(c.SetChannelConfig(name, dict(changes)))

    def list_channels(self, prefix: str = "", *, internal: bool = False) -> list[str]:
        names = [*self.machine.channels, *self.machine.queues]
        return sorted(
            n for n in names if n.startswith(prefix) and (internal or not n.startswith("_kafka."))
        )

    def exists(self, name: str) -> bool:
        return self.machine.exists(name)

    def channel_count(self) -> int:
        """Channels of every kind (internal ones too): each keeps a segment file open."""
        return len(self.machine.channels) + len(self.machine.queues)

    def kind(self, name: str) -> str | None:
        if name in self.machine.channels:
            return "events"
        if name in self.machine.queues:
            return "queue"
        return None

    def config(self, name: str) -> LogConfig:
        return self.machine.channel(name).config

    # --- events store data ------------------------------------------------------------

    def append_batch(
        self, name: str, batch: bytes | bytearray | memoryview, *, durable: bool = True,
        internal: bool = False, checked: bool = False,
    ) -> Deferred:
        """Append one raw RecordBatch v2 as sent by a client; fires with AppendResult.

        The batch is stored byte for byte except its base offset. ``durable=False``
        fires after the write reaches the page cache (Kafka acks=1); readers
        still only see it after the group fsync. A batch with a producer id is checked
        when applied (``store/producer_state.py``): it fails with OutOfOrderSequence or
        InvalidProducerEpoch, or, as a retry of a stored batch, fires with an AppendResult
        marked ``duplicate`` that carries the original's Sequences. ``checked``: the caller
        validated the batch (``records.validate_batch``) and it is applied on this node
        without a second CRC pass.
        """
        try:
            self._check(name, internal)
        except Exception as exc:
            return _failed(exc)
        if not (type(batch) is bytes or (type(batch) is memoryview and batch.readonly)):
            batch = bytes(batch)  # a buffer its owner could still change
        return self.propose(c.Append(name, self.now_ms(), batch, checked=checked),
                            durable=durable)

    def append_records(
        self, name: str, records: Sequence[NewRecord], *, internal: bool = False,
    ) -> Deferred:
        """Append native messages as one batch (one record each); fires with AppendResult."""
        now = self.now_ms()
        return self.append_batch(name, build_batch(records, now_ms=now), internal=internal)

    def read(self, name: str, sequence: int, max_bytes: int, *, upto: int | None = None,
             min_one: bool = True, internal: bool = False) -> Any:
        """Whole stored batches from ``sequence`` (see ChannelLog.read); raises StoreError."""
        if not internal:
            check_client_channel(name)
        return self.machine.channel(name).read(sequence, max_bytes, upto=upto, min_one=min_one)

    def stable_end(self, name: str) -> int:
        """The next Sequence a read_committed reader may not pass: the high watermark, or the
        first record of the earliest open transaction below it (Kafka's LSO + 1)."""
        ch = self.machine.channel(name)
        return ch.stable_end(ch.durable_sequence)

    def aborted_between(self, name: str, lo: int, hi: int) -> list:
        """Aborted transactions (``txn_state.AbortedTxn``) with records in [lo, hi)."""
        txns = self.machine.channel(name).txns
        return [] if txns is None else txns.aborted_between(lo, hi)

    def bounds(self, name: str) -> ChannelBounds:
        ch = self.machine.channel(name)
        return ChannelBounds(ch.log_start, ch.durable_sequence, ch.next_sequence)

    def sequence_for_timestamp(self, name: str, timestamp_ms: int) -> int | None:
        """First Sequence whose record timestamp is >= ``timestamp_ms`` (None: none)."""
        return self.machine.channel(name).sequence_for_timestamp(timestamp_ms)

    def max_timestamp(self, name: str) -> tuple[int, int] | None:
        """(timestamp, Sequence) of the record with the largest timestamp, if any."""
        return self.machine.channel(name).max_timestamp()

    def wait_for(self, name: str, sequence: int, timeout_s: float) -> Deferred:
        """Fire True once ``name`` has durable data at ``sequence`` or beyond, False on timeout."""
        return self.waiters.wait(name, sequence, timeout_s)

    def wait_any(self, watches: Iterable[tuple[str, int]], timeout_s: float) -> Deferred:
        return self.waiters.wait_any(watches, timeout_s)

    def truncate_prefix(self, name: str, sequence: int, *, internal: bool = False) -> Deferred:
        """DeleteRecords: everything below ``sequence`` goes; fires with the new log start."""
        try:
            self._check(name, internal)
        except Exception as exc:
            return _failed(exc)
        return self.propose(c.TruncatePrefix(name, sequence))

    # --- background maintenance -------------------------------------------------------

    def enforce_retention(self) -> Deferred:
        return self.propose(c.EnforceRetention(self.now_ms()))

    def compact_all(self) -> Deferred:
        """Start one compaction pass of every compacted channel not already being cleaned
        that has a closed segment: each pass is a Raft command, and proposing one for every
        empty compacted partition every tick grew the log and stalled a node with 1,000 of
        them."""
        waiting = self._clean_planned()  # plans other nodes' Compact commands made here
        if not self.is_leader():
            # The leader's Compact commands reach every node; a follower proposing its own
            # tripled the commands (and the plans each node then made) for nothing.
            return gatherResults(waiting, consumeErrors=True).addCallback(len)
        names = [n for n, ch in self.machine.channels.items()
                 if ch.may_compact() and n not in self._compacting]
        ds = [self.compact(n) for n in names] + waiting
        if not ds:
            return succeed(0)
        return gatherResults(ds, consumeErrors=True).addCallback(len)

    def compact(self, name: str) -> Deferred:
        """Compact one channel: plan on the reactor, clean on the cleaner thread, install."""
        if name in self._compacting:
            return succeed(False)
        d = self.propose(c.Compact(name, self.now_ms()))

        def run(started: bool) -> Any:
            cleaning = self._clean_planned()
            return _chain(cleaning) if cleaning else False

        return d.addCallback(run)

    def _clean_planned(self) -> list[Deferred]:
        """Clean every plan applied Compact commands made (a channel plans one at a time)."""
        plans = self.machine.take_compactions()
        self._compacting.update(n for n, _p in plans)
        return [self._clean(n, p) for n, p in plans]

    def _clean(self, name: str, plan: Any) -> Deferred:
        d = self._run_cleaner(plan.run)

        def install(result: Any) -> bool:
            self.machine.install_compaction(name, result, plan.owner)
            self._advanced(name)
            return True

        def abandon(failure: Any) -> Any:
            self.machine.abandon_compaction(name, plan.owner)
            return failure

        def done(outcome: Any) -> Any:
            self._compacting.discard(name)
            return outcome

        return d.addCallbacks(install, abandon).addBoth(done)

    # --- queues -----------------------------------------------------------------------

    def queue_send(self, name: str, records: Sequence[NewRecord], *, internal: bool = False) -> Deferred:
        """Enqueue messages; fires with their Sequences once durable."""
        try:
            self._check(name, internal)
        except Exception as exc:
            return _failed(exc)
        batch = build_batch(records, now_ms=self.now_ms())
        return self.propose(c.QueueSend(name, self.now_ms(), batch))

    def queue_receive(self, name: str, max_messages: int, visibility_ms: int) -> Deferred:
        """Take up to ``max_messages`` visible messages in flight; fires with QueueMessages."""
        now = self.now_ms()
        d = self.propose(c.Batch((c.QueueExpire(name, now),
                                  c.QueueReceive(name, max_messages, visibility_ms, now))))
        return d.addCallback(lambda results: results[-1])

    def queue_ack(self, name: str, sequences: Iterable[int]) -> Deferred:
        return self.propose(c.QueueAck(name, tuple(sequences)))

    def queue_nack(self, name: str, sequences: Iterable[int]) -> Deferred:
        return self.propose(c.QueueNack(name, tuple(sequences), self.now_ms()))

    def queue_modify_deadline(self, name: str, sequences: Iterable[int], visibility_ms: int) -> Deferred:
        return self.propose(
            c.QueueModifyDeadline(name, tuple(sequences), visibility_ms, self.now_ms())
        )

    def queue(self, name: str) -> Any:
        """The QueueChannel for read-only inspection (counts)."""
        return self.machine.queue(name)

    def _expire_queues(self) -> Deferred | None:
        busy = [n for n, q in self.machine.queues.items() if q.inflight_count]
        if not busy:
            return None
        now = self.now_ms()
        return self.propose(c.Batch(tuple(c.QueueExpire(n, now) for n in busy)))

    # --- coordinator families ---------------------------------------------------------

    def keyed_get(self, family: str, key: bytes) -> bytes | None:
        return self.machine.keyed[family].get(key)

    def keyed_items(self, family: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        return self.machine.keyed[family].items(prefix)

    def keyed_state(self, family: str) -> tuple[object, int]:
        """What a reader compares (``is`` and ``==``) to know that ``family`` is unchanged
        since it last looked: the family's log (a restored snapshot brings a new one) and
        its change counter."""
        keyed = self.machine.keyed[family]
        return keyed, keyed.version

    def keyed_put(self, family: str, pairs: Iterable[tuple[bytes, bytes | None]], *,
                  expect: Iterable[tuple[bytes, bytes | None]] = ()) -> Deferred:
        """Durably write coordinator state (a None value deletes the key). With ``expect``
        ((key, value) pairs, None: absent) the write is a compare-and-set, decided when the
        command applies: it fails with KeyConflict if any of those keys then differs."""
        return self.propose(c.KeyedPut(family, tuple(pairs), self.now_ms(),
                                       expect=tuple(expect)))

    def drain(self) -> Deferred:
        """Fire once everything written so far is durable."""
        return self._proposer.drain()


def _failed(exc: BaseException) -> Deferred:
    d: Deferred = Deferred()
    d.errback(exc)
    return d


def _chain(ds: list[Deferred]) -> Deferred:
    return gatherResults(ds, consumeErrors=True)


class _StoreCollector:
    """Prometheus view of the store: total size and log end per Kafka partition."""

    def __init__(self, store: ChannelStore) -> None:
        self._store = store

    def collect(self) -> Iterator[GaugeMetricFamily]:
        size = GaugeMetricFamily("kmqkafka_store_size_bytes", "Bytes stored per channel",
                                 labels=["channel"])
        end = GaugeMetricFamily("kmqkafka_partition_log_end_offset",
                                "Log end offset (high watermark) per Kafka partition",
                                labels=["topic", "partition"])
        start = GaugeMetricFamily("kmqkafka_partition_log_start_offset",
                                  "Log start offset per Kafka partition",
                                  labels=["topic", "partition"])
        for name, ch in list(self._store.machine.channels.items()):
            size.add_metric([name], ch.size_bytes)
            tp = partition_of(name)
            if tp is not None:
                end.add_metric([tp[0], str(tp[1])], ch.durable_sequence - 1)
                start.add_metric([tp[0], str(tp[1])], ch.log_start - 1)
        yield size
        yield end
        yield start
        budget = self._store.machine.page_cache
        if budget is not None:
            yield CounterMetricFamily(
                "kmqkafka_page_cache_dropped_bytes",
                "Durable segment bytes the page-cache budget (KMQKAFKA_PAGE_CACHE_BYTES) dropped "
                "from the OS page cache as newer writes pushed them out (not what readers of "
                "old data drop behind them)",
                value=budget.dropped)
            yield GaugeMetricFamily(
                "kmqkafka_page_cache_held_bytes",
                "Newest durable segment bytes kept in the OS page cache", value=budget.held)
