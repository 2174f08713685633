"""The deterministic state machine that applies store commands to the disk.

``StateMachine.apply(index, command)`` is the only way the store changes. It
is called on the reactor thread, in log order, once per committed command
(by the local proposer today, by Raft later). It writes to the page cache
but never fsyncs data files itself: the proposer collects ``prepare_flush``
tokens after a group of applies and fsyncs them together on the I/O thread.
Catalog changes (create/delete channel, config) are rare and made durable
inside apply with atomic file writes.

On-disk layout under ``data_dir``::

    channels/{dir_name(channel)}/kind        "events" or "queue"
    channels/{dir_name(channel)}/config.json LogConfig
    channels/{dir_name(channel)}/name        the channel name, when dir_name shortened it
    channels/{dir_name(channel)}/...         the ChannelLog / QueueChannel files
    coordinator/                             KeyedLog families (_kafka.{family}.{gen})
    applied-index                            replicated mode only: see store/checkpoint.py

Replicated mode (``replicated=True``, used behind Raft): every group-commit flush also
records the last applied Raft index and the touched channels' next Sequence in the
checkpoint journal (a last token in ``prepare_flush``), and ``recover`` cuts channels back to
that checkpoint so the Raft log after it can be replayed without applying anything twice.
"""

from __future__ import annotations

import os
import shutil
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from twisted.logger import Logger

from kmqkafka.records import NewRecord, iter_records
from kmqkafka.store import checkpoint
from kmqkafka.store import commands as c
from kmqkafka.store import snapshot
from kmqkafka.store.config import LogConfig
from kmqkafka.store.errors import ChannelExists, ChannelNotFound, KeyConflict, StoreError
from kmqkafka.store.fsutil import fsync_dir, write_atomic
from kmqkafka.store.keyed import RESERVED_FAMILIES, KeyedLog
from kmqkafka.store.keyed import cut_back as keyed_cut_back
from kmqkafka.store.log import CONFIG_FILE, ChannelLog
from kmqkafka.store.names import check_channel_name, dir_name, from_dir_name, is_shortened
from kmqkafka.store.pagecache import PageCacheBudget
from kmqkafka.store.producer_state import WINDOW as PRODUCER_WINDOW
from kmqkafka.store.queue import QueueChannel

log = Logger()

NAME_FILE = "name"
# A token new with each create of a name: a checkpoint names the incarnation it saw, so a
# channel deleted and created again after it is re-created by replay, not cut back to the
# old one's end (that cut landed inside the new log's batches, and start-up failed).
INCARNATION_FILE = "incarnation"
KIND_EVENTS = "events"
KIND_QUEUE = "queue"
_PRODUCER_ID = struct.Struct(">q")  # at byte 43 of a batch header


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Sequences given to an appended batch (offset = Sequence - 1).

    ``duplicate``: the batch was an idempotent producer's retry of a batch stored already
    (producer_state.py); nothing was written, the Sequences are the original's, and
    ``max_timestamp`` is the stored original's maxTimestamp (Kafka answers a duplicate with it
    as the log append time).
    """

    first_sequence: int
    last_sequence: int
    duplicate: bool = False
    max_timestamp: int = -1


@dataclass(frozen=True, slots=True)
class BatchFailure:
    """Result of a ``Batch`` command whose command at ``index`` failed."""

    index: int
    error: StoreError
    results: tuple


class StateMachine:
    """Owns every open channel and coordinator log; reactor thread only."""

    def __init__(
        self,
        data_dir: Path,
        *,
        default_config: LogConfig | None = None,
        on_advance: Callable[[str], None] | None = None,
        dead_letter: Callable[[str, Any], None] | None = None,
        replicated: bool = False,
        page_cache: PageCacheBudget | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.page_cache = page_cache
        self.replicated = replicated
        self.journal: checkpoint.CheckpointJournal | None = None
        self._touched: set[str] = set()
        self._incarnations: dict[str, str] = {}  # Events channel: INCARNATION_FILE's token
        self._hold_visible = False
        self._held: dict[str, tuple[ChannelLog, int]] = {}
        self.default_config = default_config or LogConfig()
        self.channels: dict[str, ChannelLog] = {}
        self.queues: dict[str, QueueChannel] = {}
        self.keyed: dict[str, KeyedLog] = {}
        self.last_applied = 0
        self._dirty: set[str] = set()
        self._dirty_keyed: set[str] = set()
        self._on_advance = on_advance or (lambda name: None)
        self._dead_letter = dead_letter
        self._pending_compactions: list[tuple[str, Any]] = []
        # Replicated mode: Events channel directories created (or channels deleted) since the
        # last flush, made durable by it before its checkpoint (``_FreshDirs``).
        self._fresh = _FreshDirs(self.channels_dir)
        self._deletes = 0  # makes each deleted channel's renamed directory unique

    # --- start-up -------------------------------------------------------------------

    @property
    def channels_dir(self) -> Path:
        return self.data_dir / "channels"

    @property
    def coordinator_dir(self) -> Path:
        return self.data_dir / "coordinator"

    def recover(self, now_ms: int) -> None:
        """Open (and crash-recover) every channel and coordinator family on disk."""
        self.channels_dir.mkdir(parents=True, exist_ok=True)
        self.coordinator_dir.mkdir(parents=True, exist_ok=True)
        ckpt = checkpoint.read(self.data_dir) if self.replicated else None
        self._incarnations.clear()
        for entry in sorted(os.listdir(self.channels_dir)):
            path = self.channels_dir / entry
            if ".deleted" in entry or entry.endswith(".part"):
                shutil.rmtree(path, ignore_errors=True)
                continue
            kind_file = path / "kind"
            kind = kind_file.read_text().strip() if kind_file.exists() else ""
            if kind not in (KIND_EVENTS, KIND_QUEUE):
                # A create that crashed before its files were durable (no kind, or one whose
                # contents were lost): replaying the Raft log creates it again.
                shutil.rmtree(path, ignore_errors=True)
                continue
            name = self._channel_of(path)
            if dir_name(name) != entry:
                path = self._rename_dir(path, name)
            incarnation = _read_incarnation(path)
            if ckpt is not None and kind == KIND_EVENTS:
                upto, at_checkpoint = checkpoint.channel_end(ckpt.channels.get(name))
                if upto is None or at_checkpoint not in (None, incarnation):
                    # Created after the checkpoint (maybe deleted and created again since):
                    # replaying the Raft log re-creates it.
                    log.info("replay will re-create {channel}", channel=name)
                    shutil.rmtree(path)
                    continue
                cut = checkpoint.truncate_tail(path, upto)
                if cut:
                    log.info("cut {n} byte(s) applied after the checkpoint from {channel}",
                             n=cut, channel=name)
            self._open_channel(name, kind, now_ms)
            if incarnation:
                self._incarnations[name] = incarnation
        for family in RESERVED_FAMILIES:
            at = ckpt.keyed.get(family) if ckpt is not None else None
            if at is not None:
                cut = keyed_cut_back(self.coordinator_dir, family, *at)
                if cut:
                    log.info("cut {n} byte(s) applied after the checkpoint from {family}",
                             n=cut, family=family)
            self.keyed[family] = KeyedLog.open(self.coordinator_dir, family, now_ms)
        if self.replicated:
            self.journal = checkpoint.CheckpointJournal(
                self.data_dir, ckpt.end if ckpt is not None else 0)
            if ckpt is None:
                # First replicated start: adopt whatever is on disk as the state at index 0.
                self.journal.reset(self.last_applied, self._channel_ends(), self._keyed_ends())
            else:
                self.last_applied = ckpt.applied
                self.journal.durable_applied = ckpt.applied

    def _channel_ends(self) -> dict[str, checkpoint.ChannelEnd]:
        return {name: self._end_of(name) for name in self.channels}

    def _end_of(self, name: str) -> checkpoint.ChannelEnd:
        """What a checkpoint records of an Events channel: its end and incarnation."""
        ch = self.channels.get(name)
        if ch is None:
            return None
        incarnation = self._incarnations.get(name)
        return [ch.next_sequence, incarnation] if incarnation else ch.next_sequence

    def _keyed_ends(self) -> dict[str, tuple[int, int]]:
        return {family: keyed.position for family, keyed in self.keyed.items()}

    def reset_checkpoint(self) -> None:
        """Replicated mode: record the whole current state as durable at ``last_applied``
        (after ``restore``). Blocking."""
        if self.journal is not None:
            self._touched.clear()
            self.journal.reset(self.last_applied, self._channel_ends(), self._keyed_ends())

    def _channel_of(self, path: Path) -> str:
        """The channel a directory holds (a shortened name records it in a file)."""
        if is_shortened(path.name):
            return (path / NAME_FILE).read_text()
        return from_dir_name(path.name)

    def _rename_dir(self, path: Path, name: str) -> Path:
        """Move a channel directory to today's ``dir_name`` (one written when names up to
        NAME_MAX were kept whole, which left no room to delete it)."""
        final = self.channels_dir / dir_name(name)
        if is_shortened(final.name):
            write_atomic(path / NAME_FILE, name.encode())
        os.rename(path, final)
        fsync_dir(self.channels_dir)
        log.info("channel {channel}: directory renamed to {dir}", channel=name, dir=final.name)
        return final

    def _open_channel(self, name: str, kind: str, now_ms: int, sync: bool = True) -> None:
        path = self.channels_dir / dir_name(name)
        config_path = path / CONFIG_FILE
        config = (
            LogConfig.from_json(config_path.read_bytes())
            if config_path.exists()
            else self.default_config
        )
        if kind == KIND_QUEUE:
            self.queues[name] = QueueChannel.open(
                path, now_ms, dead_letter=self._dead_letter_hook(name)
            )
        else:
            self.channels[name] = ChannelLog.open(path, config, now_ms,
                                                  producer_window=PRODUCER_WINDOW, sync=sync,
                                                  page_cache=self.page_cache)

    def _dead_letter_hook(self, name: str) -> Callable[[Any], None] | None:
        if self._dead_letter is None:
            return None
        hook = self._dead_letter
        return lambda message: hook(name, message)

    def close(self, save_scans: bool = False) -> None:
        """Close every log; ``save_scans`` (the daemon's clean stop) saves each channel's
        active-segment index so the next start-up need not walk it."""
        for ch in self.channels.values():
            ch.close(save_scan=save_scans)
        for q in self.queues.values():
            q.close()
        for k in self.keyed.values():
            k.close()
        if self.journal is not None:
            self.journal.close()
        self.channels.clear()
        self.queues.clear()
        self.keyed.clear()

    # --- snapshots -------------------------------------------------------------------

    def roll_for_snapshot(self, min_bytes: int) -> int:
        """Close every active segment of at least ``min_bytes`` (the next flush writes their
        indexes), so a snapshot hard-links them instead of copying them: a snapshot copies
        each log's active segment, and an active segment may grow to ``segment.bytes``
        (1 GiB by default). Segment boundaries are local to this node. Returns how many."""
        rolled = 0
        for name, ch in self.channels.items():
            if ch.active_bytes >= min_bytes:
                ch.roll()
                self._dirty.add(name)
                rolled += 1
        return rolled

    def snapshot(self, dest: Path) -> None:
        """Snapshot every channel and coordinator log into ``dest`` (all must be flushed)."""
        if self.has_unflushed():
            raise StoreError("snapshot needs every applied command flushed first")
        snapshot.take(self.data_dir, Path(dest), self.last_applied)

    def restore(self, source: Path, now_ms: int) -> None:
        """Replace the whole state with a snapshot taken by ``snapshot``."""
        self.close()
        snapshot.install(Path(source), self.data_dir)
        self._dirty.clear()
        self._dirty_keyed.clear()
        if self.replicated:
            # The old checkpoint describes the replaced state: never cut the new one by it.
            (self.data_dir / checkpoint.JOURNAL).unlink(missing_ok=True)
        self.recover(now_ms)
        self.last_applied = snapshot.last_applied(Path(source))
        self.reset_checkpoint()
        for name in [*self.channels, *self.queues]:
            self._on_advance(name)

    # --- lookups ----------------------------------------------------------------------

    def channel(self, name: str) -> ChannelLog:
        try:
            return self.channels[name]
        except KeyError:
            raise ChannelNotFound(f"channel {name!r} does not exist") from None

    def queue(self, name: str) -> QueueChannel:
        try:
            return self.queues[name]
        except KeyError:
            raise ChannelNotFound(f"queue {name!r} does not exist") from None

    def exists(self, name: str) -> bool:
        return name in self.channels or name in self.queues

    # --- apply ------------------------------------------------------------------------

    def apply(self, index: int, command: c.Command) -> Any:
        """Apply one committed command; returns its result or raises a StoreError.

        ``index`` is the command's position in the replicated log; it only
        ever grows. A StoreError leaves the store unchanged for that command.
        """
        if index <= self.last_applied:
            raise ValueError(f"command index {index} already applied")
        self.last_applied = index
        return self._apply(command)

    def _apply(self, command: c.Command) -> Any:
        handler = getattr(self, f"_apply_{type(command).__name__}")
        return handler(command)

    def _apply_Batch(self, cmd: c.Batch) -> Any:
        """Apply in order. Every ``KeyedPut`` compare-and-set of the batch is checked before
        anything is applied, so a lost race changes nothing (a topic's catalog write comes
        after its channels). A refused disk write (OSError) removes the channels the batch
        created before it is raised: a full disk leaves no half-created topic."""
        try:
            self._check_expects(cmd.commands)
        except StoreError as exc:
            return BatchFailure(0, exc, ())
        results = []
        for i, inner in enumerate(cmd.commands):
            try:
                results.append(self._apply(inner))
            except StoreError as exc:
                return BatchFailure(i, exc, tuple(results))
            except OSError:
                for done, result in zip(cmd.commands, results):
                    if type(done) is c.CreateChannel and result is True:
                        try:
                            self._apply_DeleteChannel(c.DeleteChannel(done.name, missing_ok=True))
                        except OSError:
                            pass
                raise
        return tuple(results)

    def _check_expects(self, commands: tuple) -> None:
        """Raise KeyConflict if a ``KeyedPut`` of ``commands`` would, as ``_apply_KeyedPut``
        decides, with the writes of the ones before it in the batch taken into account."""
        pending: dict[tuple[str, bytes], bytes | None] = {}
        for cmd in commands:
            if type(cmd) is not c.KeyedPut or not cmd.expect:
                continue
            keyed = self.keyed[cmd.family]
            writes = dict(cmd.pairs)
            for key, expected in cmd.expect:
                slot = (cmd.family, bytes(key))
                current = pending[slot] if slot in pending else keyed.get(key)
                if current != expected and (key not in writes or current != writes[key]):
                    raise KeyConflict(f"{cmd.family} key {bytes(key)!r} changed concurrently")
            for key, value in cmd.pairs:
                pending[(cmd.family, bytes(key))] = value

    def _apply_CreateChannel(self, cmd: c.CreateChannel) -> bool:
        check_channel_name(cmd.name)
        if self.exists(cmd.name):
            if cmd.exist_ok:
                return False
            raise ChannelExists(f"channel {cmd.name!r} already exists")
        config = self.default_config.with_changes(**cmd.config)
        final = self.channels_dir / dir_name(cmd.name)
        if final.exists():
            shutil.rmtree(final)
        final.mkdir(parents=True)
        if is_shortened(final.name):
            write_atomic(final / NAME_FILE, cmd.name.encode())  # recovery reads it first
        # Replicated mode, Events channels: no fsync here (seven of them made a 256-partition
        # CreateTopics hold the reactor for seconds). The next flush makes the files durable
        # before its checkpoint names the channel; after a crash before that, recovery removes
        # the directory and replaying the Raft log creates it again.
        deferred = self.replicated and cmd.kind == KIND_EVENTS
        write = _write_plain if deferred else write_atomic
        write(final / CONFIG_FILE, config.to_json())
        if cmd.kind == KIND_EVENTS:
            incarnation = os.urandom(8).hex()
            write(final / INCARNATION_FILE, incarnation.encode())
            self._incarnations[cmd.name] = incarnation
        # The kind file is written last: its presence is what makes the channel exist.
        write(final / "kind", cmd.kind.encode())
        if deferred:
            self._fresh.add(final)
        else:
            fsync_dir(self.channels_dir)
        self._open_channel(cmd.name, cmd.kind, 0, sync=not deferred)
        self._touched.add(cmd.name)
        return True

    def _apply_DeleteChannel(self, cmd: c.DeleteChannel) -> bool:
        if not self.exists(cmd.name):
            if cmd.missing_ok:
                return False
            raise ChannelNotFound(f"channel {cmd.name!r} does not exist")
        target = self.channels.pop(cmd.name, None) or self.queues.pop(cmd.name)
        self._incarnations.pop(cmd.name, None)
        target.close()
        path = self.channels_dir / dir_name(cmd.name)
        self._deletes += 1  # one entry may delete, create and delete a name again
        doomed = path.with_name(f"{path.name}.deleted-{self.last_applied}-{self._deletes}")
        os.replace(path, doomed)
        if self.replicated:
            # Recovery removes the renamed directory either way; the next flush syncs the
            # rename and removes it on the I/O thread. Removed here, a DeleteTopics of 3,000
            # topics held the reactor 1.7 s.
            self._fresh.doom(doomed)
        else:
            fsync_dir(self.channels_dir)
            shutil.rmtree(doomed, ignore_errors=True)
        self._dirty.discard(cmd.name)
        self._touched.add(cmd.name)
        self._on_advance(cmd.name)
        return True

    def _apply_SetChannelConfig(self, cmd: c.SetChannelConfig) -> LogConfig:
        ch = self.channel(cmd.name)
        config = ch.config.with_changes(**cmd.changes)
        ch.set_config(config, save=True)
        self._dirty.add(cmd.name)  # its config.json goes with the next flush
        return config

    def _apply_Append(self, cmd: c.Append) -> AppendResult:
        """Store a batch; the idempotent-producer checks run here, at apply, so every node
        decides alike and pipelined appends are checked in log order (ChannelLog.append
        raises OutOfOrderSequence / InvalidProducerEpoch, or answers a duplicate)."""
        ch = self.channel(cmd.name)
        before = ch.next_sequence
        first, last = ch.append(cmd.batch, cmd.now_ms, checked=cmd.checked)
        if first < before:
            return self._duplicate(ch, cmd, first, last)
        self._dirty.add(cmd.name)
        self._touched.add(cmd.name)
        if self.replicated:
            if self._hold_visible:
                self._held[cmd.name] = (ch, ch.next_sequence)
            else:
                self._visible(ch, cmd.name)
        return AppendResult(first, last)

    @staticmethod
    def _duplicate(ch: ChannelLog, cmd: c.Append, first: int, last: int) -> AppendResult:
        """A retried idempotent batch found already stored: nothing changed."""
        assert ch.producers is not None
        (producer_id,) = _PRODUCER_ID.unpack_from(cmd.batch, 43)
        meta = ch.producers.find(producer_id, first)
        return AppendResult(first, last, duplicate=True,
                            max_timestamp=meta.max_timestamp if meta is not None else -1)

    def hold_visibility(self, on: bool) -> None:
        """Replicated mode: while on, applied Appends stay invisible to readers (the high
        watermark does not move) until ``release_visibility``: the Raft proposer applies a
        one-member cluster's entries while their Raft append is still being fsynced."""
        self._hold_visible = on

    def release_visibility(self) -> None:
        """Show readers what was applied under ``hold_visibility``."""
        held, self._held = self._held, {}
        for name, (ch, upto) in held.items():
            if self.channels.get(name) is ch and ch._durable < upto:
                ch._durable = upto
                self._on_advance(name)

    def _visible(self, ch: ChannelLog, name: str) -> None:
        """Replicated mode: an applied command is durable already (its Raft entry is fsynced,
        and committed by a quorum), so readers see it now, not at the segment fsync.

        The segment fsync and checkpoint that follow only bound crash replay. ChannelLog keeps
        its high watermark in ``_durable`` (advanced by ``complete_flush`` in local mode); it
        only ever grows, and ``complete_flush`` keeps the larger value.
        """
        if ch._durable < ch.next_sequence:
            ch._durable = ch.next_sequence
            self._on_advance(name)

    def apply_group(self, index: int, commands: list[c.Command]) -> list[Any]:
        """Replicated mode: apply several independent commands carried by one Raft entry.

        Each gets its own outcome (its result, a ``BatchFailure``, or the ``StoreError``
        instance it raised); a failing command does not stop the others.
        """
        if index <= self.last_applied:
            raise ValueError(f"command index {index} already applied")
        self.last_applied = index
        out: list[Any] = []
        for command in commands:
            try:
                out.append(self._apply(command))
            except Exception as exc:  # StoreError, InvalidBatch, or a bug: the caller reports
                out.append(exc)
        return out

    def _apply_TruncatePrefix(self, cmd: c.TruncatePrefix) -> int:
        start = self.channel(cmd.name).truncate_prefix(cmd.sequence)
        self._dirty.add(cmd.name)  # its new log-start file goes with the next flush
        self._on_advance(cmd.name)
        return start

    def _apply_EnforceRetention(self, cmd: c.EnforceRetention) -> int:
        dropped = 0
        for name, ch in self.channels.items():
            n = ch.enforce_retention(cmd.now_ms)
            if n:
                self._dirty.add(name)  # its new log-start file goes with the next flush
                dropped += n
                log.info("retention dropped {n} segment(s) of {channel}", n=n, channel=name)
        return dropped

    def _apply_Compact(self, cmd: c.Compact) -> bool:
        plan = self.channel(cmd.name).compaction_plan(cmd.now_ms)
        if plan is None:
            return False
        self._pending_compactions.append((cmd.name, plan))
        return True

    def take_compactions(self) -> list[tuple[str, Any]]:
        """Compaction plans started by applied ``Compact`` commands, for the I/O thread."""
        plans, self._pending_compactions = self._pending_compactions, []
        return plans

    def install_compaction(self, name: str, result: Any, owner: object) -> None:
        """Install ``result`` into the channel whose log ``owner`` planned it; if the channel
        was deleted (and maybe created again) meanwhile, the cleaned files are dropped."""
        ch = self.channels.get(name)
        if ch is not None and ch is owner:
            ch.install_compaction(result)
        else:
            for cleaned in result.segments:
                cleaned.discard()

    def abandon_compaction(self, name: str, owner: object) -> None:
        """The cleaner failed on ``owner``'s plan: let the channel plan again."""
        ch = self.channels.get(name)
        if ch is not None and ch is owner:
            ch.abandon_compaction()

    def _apply_QueueSend(self, cmd: c.QueueSend) -> list[int]:
        queue = self.queue(cmd.name)
        recs = [
            NewRecord(value=r.value, key=r.key, headers=r.headers, timestamp=r.timestamp)
            for r in iter_records(cmd.batch)
        ]
        seqs = queue.send(recs, cmd.now_ms)
        self._dirty.add(cmd.name)
        return seqs

    def _apply_QueueReceive(self, cmd: c.QueueReceive) -> list:
        out = self.queue(cmd.name).receive(cmd.max_messages, cmd.visibility_ms, cmd.now_ms)
        self._dirty.add(cmd.name)
        return out

    def _apply_QueueAck(self, cmd: c.QueueAck) -> list[int]:
        out = self.queue(cmd.name).ack(cmd.sequences)
        self._dirty.add(cmd.name)
        return out

    def _apply_QueueNack(self, cmd: c.QueueNack) -> None:
        self.queue(cmd.name).nack(cmd.sequences, cmd.now_ms)
        self._dirty.add(cmd.name)

    def _apply_QueueModifyDeadline(self, cmd: c.QueueModifyDeadline) -> None:
        self.queue(cmd.name).modify_deadline(cmd.sequences, cmd.visibility_ms, cmd.now_ms)
        self._dirty.add(cmd.name)

    def _apply_QueueExpire(self, cmd: c.QueueExpire) -> int | None:
        out = self.queue(cmd.name).expire(cmd.now_ms)
        self._dirty.add(cmd.name)
        return out

    def _apply_KeyedPut(self, cmd: c.KeyedPut) -> int:
        keyed = self.keyed[cmd.family]
        # A key already holding the value this command writes passes too: that is this very
        # command replayed after a crash (coordinator logs are not cut back to the applied
        # checkpoint), and replay must recreate what followed it in its Batch.
        writes = dict(cmd.pairs)
        for key, expected in cmd.expect:
            current = keyed.get(key)
            if current != expected and (key not in writes or current != writes[key]):
                raise KeyConflict(f"{cmd.family} key {bytes(key)!r} changed concurrently")
        keyed.put_many([(k, v) for k, v in cmd.pairs], cmd.now_ms)
        self._dirty_keyed.add(cmd.family)
        return len(cmd.pairs)

    # --- group commit -----------------------------------------------------------------

    def has_unflushed(self) -> bool:
        return bool(self._dirty or self._dirty_keyed or self._fresh.pending) or (
            self.journal is not None and self.journal.due(self.last_applied))

    def prepare_flush(self) -> list[tuple[str, Any, Any]]:
        """Flush tokens for everything written since the last flush.

        Each is ``(channel name or None for a coordinator family, owner, token)``;
        the owner object is kept so a token never completes on a channel that was
        deleted and re-created meanwhile.
        """
        tokens = []
        for name in self._dirty:
            target = self.channels.get(name) or self.queues.get(name)
            if target is None:
                continue
            token = target.prepare_flush()
            if token is not None:
                tokens.append((name, target, token))
        rolled = False  # a generation pointer switches: the checkpoint must name it
        for family in self._dirty_keyed:
            keyed = self.keyed[family]
            token = keyed.prepare_flush()
            if token is not None:
                tokens.append((None, keyed, token))
                rolled = rolled or token.pointer is not None
        self._dirty.clear()
        self._dirty_keyed.clear()
        if self._fresh.pending:  # before the checkpoint, which may name these channels
            fresh, self._fresh = self._fresh, _FreshDirs(self.channels_dir)
            tokens.append((None, fresh, fresh))
        if self.journal is not None and (self.journal.due(self.last_applied) or rolled):
            # Last: run_flush writes it only after every segment above is fdatasynced.
            touched = {n: self._end_of(n) for n in self._touched if n not in self.queues}
            self._touched.clear()
            token = self.journal.prepare(self.last_applied, touched, self._channel_ends,
                                         self._keyed_ends())
            tokens.append((None, self.journal, token))
        return tokens

    @staticmethod
    def run_flush(tokens: Iterable[tuple[str, Any, Any]]) -> None:
        """fsync every token; safe on the I/O thread.

        The channels' tokens run side by side (``SYNC_WORKERS`` at a time): each fdatasync of
        a growing file commits the filesystem's journal and flushes the disk's cache, and
        concurrent ones share that work, so a group commit over 16 partitions took 4-5 ms
        one after the other and 1.7 ms side by side here. The other tokens (coordinator
        families, new directories, then the applied-index checkpoint, which must come after
        every segment it covers) run after them, in order."""
        tokens = list(tokens)
        channels = [t for name, _owner, t in tokens if name is not None]
        if len(channels) > 1:
            _run_side_by_side(channels)
        elif channels:
            channels[0].run()
        for name, _owner, token in tokens:
            if name is None:
                token.run()

    def complete_flush(self, tokens: Iterable[tuple[str, Any, Any]]) -> None:
        """Back on the reactor: advance durable ends and wake readers of those channels."""
        for name, owner, token in tokens:
            if name is None:
                owner.complete_flush(token)
                continue
            if (self.channels.get(name) or self.queues.get(name)) is not owner:
                continue
            owner.complete_flush(token)
            self._on_advance(name)


SYNC_WORKERS = 8
_sync_pool: ThreadPoolExecutor | None = None


def _run_side_by_side(tokens: list[Any]) -> None:
    """``token.run()`` for each, ``SYNC_WORKERS`` at a time on the sync pool; returns once
    all ran, raising the first error (after the others finished: no fsync is still running
    when a flush is reported). Each worker takes a share of the tokens rather than one task
    per token: a flush over 64 partitions then hands the pool 8 tasks, not 64, and the
    hand-offs' locking no longer competes with the reactor for the GIL."""
    global _sync_pool
    if _sync_pool is None:
        _sync_pool = ThreadPoolExecutor(SYNC_WORKERS, thread_name_prefix="kmqkafka-fsync")
    shares = min(SYNC_WORKERS, len(tokens))
    futures = [_sync_pool.submit(_run_share, tokens[i::shares]) for i in range(shares)]
    errors = [f.result() for f in futures]
    for error in errors:
        if error is not None:
            raise error


def _run_share(tokens: list[Any]) -> BaseException | None:
    """Run every token of one worker's share; the first error, after all of them ran."""
    first: BaseException | None = None
    for token in tokens:
        try:
            token.run()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller, after the rest
            if first is None:
                first = exc
    return first


def _read_incarnation(path: Path) -> str | None:
    """A channel directory's incarnation token; None for one made before tokens existed."""
    try:
        return (path / INCARNATION_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def _write_plain(path: Path, data: bytes) -> None:
    """Write a new file without fsync (``_FreshDirs`` syncs it)."""
    with open(path, "wb") as f:
        f.write(data)


class _FreshDirs:
    """A flush token: fsync the files and directory of each channel created since the last
    flush, then the channels directory (creates and deletes there). Runs on the I/O thread,
    before the checkpoint token of the same flush."""

    def __init__(self, channels_dir: Path) -> None:
        self._channels_dir = channels_dir
        self._dirs: list[Path] = []
        self._doomed: list[Path] = []
        self.pending = False

    def add(self, directory: Path) -> None:
        self._dirs.append(directory)
        self.pending = True

    def touch(self) -> None:
        self.pending = True

    def doom(self, directory: Path) -> None:
        """Remove ``directory`` (a deleted channel's, renamed) once the rename is synced."""
        self._doomed.append(directory)
        self.pending = True

    def run(self) -> None:
        # The reactor may delete any of these channels while this runs (a topic created and
        # deleted at once): a directory or file gone meanwhile needs no sync.
        for directory in self._dirs:
            try:
                names = os.listdir(directory)
                for entry in names:
                    try:
                        fd = os.open(directory / entry, os.O_RDONLY)
                    except FileNotFoundError:
                        continue
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                fsync_dir(directory)
            except FileNotFoundError:
                continue
        fsync_dir(self._channels_dir)
        for directory in self._doomed:
            shutil.rmtree(directory, ignore_errors=True)

    def complete_flush(self, token: Any) -> None:
        """Nothing waits on it beyond the flush itself."""
