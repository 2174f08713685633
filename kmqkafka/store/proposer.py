"""The local proposer: orders commands, applies them, and acknowledges after group commit.

This is the single-node stand-in for Raft behind the same ``propose`` call.
Each command is applied at once (so Sequences are assigned in proposal
order); its Deferred fires only after the data it wrote is fsynced. Every
command proposed while an fsync is running, or in the same reactor turn,
shares the next fsync: one disk flush acknowledges many appends.

Reactor-thread only, except ``StateMachine.run_flush`` which runs on the
injected I/O runner (a one-thread pool in production, inline in unit tests).
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from kmqkafka.store.commands import Command
from kmqkafka.store.errors import StorageFailure, StoreError, StoreStopped
from kmqkafka.store.machine import BatchFailure, StateMachine

log = Logger()

IORunner = Callable[..., Deferred]


class GroupCommit:
    """Group commit of applied state: one fsync acknowledges every command applied before it.

    ``add(d, result)`` parks a Deferred that fires with ``result`` once everything applied so
    far is fsynced; ``schedule()`` asks for a flush (in the next reactor turn, or right after
    the running one). Flushes never overlap. Used by ``LocalProposer`` and the Raft proposer.
    """

    def __init__(self, machine: StateMachine, clock: IReactorTime, run_io: IORunner, *,
                 eager: bool = True) -> None:
        """``eager=False`` (Raft: flushes only bound crash replay) flushes only when asked
        (``schedule``/``drain``/``add``), never again on its own after a flush."""
        self._machine = machine
        self._clock = clock
        self._run_io = run_io
        self._eager = eager
        self._waiting: list[tuple[Deferred, Any]] = []
        self._flushing = False
        self._scheduled = False
        self._idle: list[Deferred] = []
        self.failed = False
        self.flush_count = 0
        # Told of a failed flush (a Raft member then stops taking part, see RaftProposer).
        self.on_failed: Callable[[Failure], None] | None = None

    def add(self, d: Deferred, result: Any) -> None:
        self._waiting.append((d, result))
        self.schedule()

    @property
    def busy(self) -> bool:
        """A flush is running or scheduled."""
        return self._flushing or self._scheduled

    def schedule(self) -> None:
        if self._flushing or self._scheduled:
            return
        self._scheduled = True
        self._clock.callLater(0, self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        tokens = self._machine.prepare_flush()
        waiting, self._waiting = self._waiting, []
        if not tokens:
            self._release(waiting)
            self._notify_idle()
            return
        self._flushing = True
        d = self._run_io(StateMachine.run_flush, tokens)
        d.addCallbacks(self._flushed, self._flush_failed, callbackArgs=(tokens, waiting),
                       errbackArgs=(waiting,))

    def _flushed(self, _: object, tokens: list, waiting: list) -> None:
        self.flush_count += 1
        self._flushing = False
        self._machine.complete_flush(tokens)
        self._release(waiting)
        if self._waiting or (self._machine.has_unflushed() and (self._eager or self._idle)):
            self.schedule()
        elif not self._scheduled:
            self._notify_idle()

    def _flush_failed(self, failure: Failure, waiting: list) -> None:
        # An fsync error leaves the page cache state unknown; Kafka's answer is to stop.
        log.failure("fsync failed; refusing further writes", failure)
        self._flushing = False
        self.failed = True
        for d, _result in waiting + self._waiting:
            d.errback(StoreError(f"fsync failed: {failure.getErrorMessage()}"))
        self._waiting = []
        self._notify_idle()
        if self.on_failed is not None:
            self.on_failed(failure)

    @staticmethod
    def _release(waiting: list[tuple[Deferred, Any]]) -> None:
        for d, result in waiting:
            d.callback(result)

    def _notify_idle(self) -> None:
        idle, self._idle = self._idle, []
        for d in idle:
            d.callback(None)

    def drain(self) -> Deferred:
        """Fire once everything applied so far is durable."""
        d: Deferred = Deferred()
        self._idle.append(d)
        if not self._flushing and not self._scheduled:
            self._scheduled = True
            self._clock.callLater(0, self._flush)
        return d


class WriteErrorLog:
    """Logs refused disk writes at most once per 10 s, with the count since the last line:
    a full disk refuses every produce. ``recent`` (a write refused within the last 10 s) is
    what ``/health`` reports while it lasts."""

    RECENT_S = 10.0

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        self._count = 0
        self._logged = float("-inf")
        self._last = float("-inf")

    def recent(self) -> bool:
        return self._clock.seconds() - self._last < self.RECENT_S

    def report(self, exc: OSError) -> None:
        self._count += 1
        now = self._last = self._clock.seconds()
        if now - self._logged >= 10:
            log.error("store write failed ({n} since the last report): {error}",
                      n=self._count, error=exc)
            self._count, self._logged = 0, now


class LocalProposer:
    """Apply-then-group-commit proposer for a one-member cluster (no Raft log)."""

    def __init__(self, machine: StateMachine, clock: IReactorTime, run_io: IORunner) -> None:
        """``run_io(f, *args)`` runs ``f`` off the reactor and returns a Deferred of its result."""
        self._machine = machine
        self._commit = GroupCommit(machine, clock, run_io)
        self._stopped = False
        self._write_errors = WriteErrorLog(clock)

    @property
    def refusing_writes(self) -> bool:
        """The disk refused a write in the last few seconds (ENOSPC, EIO)."""
        return self._write_errors.recent()

    @property
    def failed(self) -> bool:
        """A group-commit fsync failed: writes are refused until a restart."""
        return self._commit.failed

    @property
    def flush_count(self) -> int:
        return self._commit.flush_count

    def start(self) -> Deferred:
        return succeed(None)

    def propose(self, command: Command, *, durable: bool = True) -> Deferred:
        """Apply ``command`` and fire with its result once durable (or at once if not)."""
        if self._commit.failed:
            return fail(StorageFailure("an fsync of the store failed: writes are refused until "
                                       "the daemon restarts and recovers"))
        if self._stopped:
            return fail(StoreStopped("the store is stopping"))
        try:
            result = self._machine.apply(self._machine.last_applied + 1, command)
        except StoreError:
            return fail(Failure())
        except OSError as exc:
            # A refused write (ENOSPC, EIO) leaves nothing applied: segment appends cut their
            # tail back, and nothing else replays this command on a lone node. (Under Raft an
            # apply that fails on one node only would split the logs: there it is fatal.)
            self._write_errors.report(exc)
            return fail(StorageFailure(f"storage write failed: {exc.strerror or exc}"))
        if isinstance(result, BatchFailure):
            # Whatever the batch applied before failing still goes through the flush.
            self._commit.schedule()
            return fail(result.error)
        if not durable:
            self._commit.schedule()
            return succeed(result)
        d: Deferred = Deferred()
        self._commit.add(d, result)
        return d

    def drain(self) -> Deferred:
        """Fire once everything applied so far is durable (used at shutdown)."""
        return self._commit.drain()

    def stop(self) -> Deferred:
        """Refuse new proposals and wait for in-flight ones to become durable."""
        d = self.drain()
        self._stopped = True
        return d
