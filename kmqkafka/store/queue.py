"""Queue channels: a durable FIFO with visibility timeouts, ack/nack and redelivery counts.

On-disk layout under a queue's ``directory``::

    messages/         ChannelLog of the messages (RecordBatch v2), Sequence = offset + 1
    state.{gen}/      ChannelLog journal of state changes (a ``SnapshotLog`` generation)
    state.CURRENT     pointer naming the current journal generation

Journal records (key = op, value = packed big-endian entries, many per record):

    b"F"  floor:q cursor:q            first record of a snapshot: the ack floor
                                      (every Sequence below it is acked) and the
                                      cursor (every Sequence below it was
                                      delivered at least once or acked)
    b"A"  n x seq:q                   acked
    b"D"  n x seq:q count:i deadline:q  delivered ``count`` times, in flight
                                      until ``deadline`` (-1 = visible again)
    b"V"  n x seq:q deadline:q        new deadline (-1 = nacked, visible)

A snapshot is ``F`` followed by ``A`` records for the acked Sequences above the
floor and ``D`` records for every delivered, unacked message. Expiry is not
journalled: deadlines are absolute, so replay plus ``expire(now)`` agrees.

Memory holds only the pending window ``[floor, next_sequence)``: acked
Sequences above the floor, delivery counts and deadlines of delivered unacked
messages; never-delivered messages cost nothing, bodies are read back from the
messages log on receive.

Every method is reactor-thread only and deterministic given its ``now_ms``
arguments, so a replicated state machine can replay the same calls. Writes go
to the page cache; nothing is durable until the caller's group commit runs
``prepare_flush()`` / ``token.run()`` / ``complete_flush()``, and a caller must
not answer a receive or ack before that flush completes.
"""

from __future__ import annotations

import heapq
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from kmqkafka import records as rec
from kmqkafka.records import NewRecord, Record
from kmqkafka.store.config import LogConfig
from kmqkafka.store.errors import CorruptStore
from kmqkafka.store.keyed import INTERNAL_LOG_CONFIG, SnapshotFlushToken, SnapshotLog
from kmqkafka.store.log import ChannelLog, FlushToken

VISIBLE = -1  # deadline of a delivered message that is not in flight

OP_FLOOR = b"F"
OP_ACK = b"A"
OP_DELIVER = b"D"
OP_DEADLINE = b"V"

_FLOOR = struct.Struct(">qq")
_SEQ = struct.Struct(">q")
_DELIVER = struct.Struct(">qiq")
_DEADLINE = struct.Struct(">qq")

_SNAPSHOT_ENTRIES = 2048  # entries per snapshot record
_SNAPSHOT_RECORDS = 16  # records per snapshot batch
_READ_BYTES = 1024 * 1024

#: The messages log is truncated to the durable ack floor once the floor has
#: moved this many Sequences past the previous truncation.
TRUNCATE_STEP = 1024


@dataclass(frozen=True, slots=True)
class QueueMessage:
    """One delivery of a message: in flight until ``deadline_ms``.

    ``record.offset + 1 == sequence``. ``delivery_count`` is 1 on the first
    delivery. For a dead-lettered message it is the number of deliveries made.
    """

    sequence: int
    record: Record
    delivery_count: int
    deadline_ms: int


class QueueFlushToken:
    """One group-commit flush of a queue: messages first, then the state journal."""

    def __init__(self, messages: FlushToken | None, state: SnapshotFlushToken | None,
                 floor: int) -> None:
        self.messages = messages
        self.state = state
        self.floor = floor

    def run(self) -> None:
        """fsync both logs (any thread)."""
        if self.messages is not None:
            self.messages.run()
        if self.state is not None:
            self.state.run()


def _pack(fmt: struct.Struct, entries: list[tuple[int, ...]]) -> bytes:
    out = bytearray(fmt.size * len(entries))
    for i, entry in enumerate(entries):
        fmt.pack_into(out, i * fmt.size, *entry)
    return bytes(out)


def _chunks(op: bytes, fmt: struct.Struct, entries: list[tuple[int, ...]]) -> Iterator[NewRecord]:
    for i in range(0, len(entries), _SNAPSHOT_ENTRIES):
        yield NewRecord(key=op, value=_pack(fmt, entries[i:i + _SNAPSHOT_ENTRIES]))


class QueueChannel:
    """A durable FIFO queue of one channel directory; see the module docstring."""

    def __init__(self, directory: Path, messages: ChannelLog, state: SnapshotLog,
                 max_deliveries: int | None,
                 dead_letter: Callable[[QueueMessage], None] | None,
                 state_roll_min_entries: int) -> None:
        self.directory = directory
        self._messages = messages
        self._state = state
        self._max_deliveries = max_deliveries
        self._dead_letter = dead_letter
        self._roll_min = state_roll_min_entries
        self._floor = messages.log_start  # every Sequence below is acked
        self._cursor = self._floor  # every Sequence >= cursor was never delivered
        self._acked: set[int] = set()  # acked Sequences in [floor, cursor)
        self._counts: dict[int, int] = {}  # delivered, unacked -> delivery count
        self._inflight: dict[int, int] = {}  # in flight -> deadline
        self._deadlines: list[tuple[int, int]] = []  # heap (deadline, seq); stale entries allowed
        self._ready: list[int] = []  # heap of delivered, unacked, visible Sequences
        self._journal_entries = 0  # entries in the current journal generation
        self._truncated_to = messages.log_start
        self._now_ms = 0  # latest time seen, to stamp journal batches of ack()

    # --- lifecycle ----------------------------------------------------------------------

    @classmethod
    def open(cls, directory: Path, now_ms: int, *, max_deliveries: int | None = None,
             dead_letter: Callable[[QueueMessage], None] | None = None,
             config: LogConfig | None = None,
             state_roll_min_entries: int = 10000) -> "QueueChannel":
        """Create or recover the queue in ``directory``.

        ``config`` applies to the messages log with retention forced off (only
        acks remove messages). ``max_deliveries`` None means unlimited. The
        journal is rolled when its entries exceed
        ``max(state_roll_min_entries, 2 x live state)``.
        """
        directory.mkdir(parents=True, exist_ok=True)
        msg_config = (config or INTERNAL_LOG_CONFIG).with_changes(
            retention_ms=None, retention_bytes=None, retention_messages=None,
            cleanup_policy="delete",
        )
        messages = ChannelLog.open(directory / "messages", msg_config, now_ms)
        state = SnapshotLog.open(directory, "state.", directory / "state.CURRENT",
                                 INTERNAL_LOG_CONFIG, now_ms)
        queue = cls(directory, messages, state, max_deliveries, dead_letter,
                    state_roll_min_entries)
        queue._now_ms = now_ms
        queue._replay(now_ms)
        return queue

    def _replay(self, now_ms: int) -> None:
        deadlines: dict[int, int] = {}
        entries = 0
        for record in self._state.records():
            op, value = record.key, record.value or b""
            if op == OP_FLOOR:
                self._floor, self._cursor = _FLOOR.unpack(value)
                entries += 1
            elif op == OP_ACK:
                for (seq,) in _SEQ.iter_unpack(value):
                    self._acked.add(seq)
                    self._counts.pop(seq, None)
                    deadlines.pop(seq, None)
                    self._cursor = max(self._cursor, seq + 1)
                    entries += 1
            elif op == OP_DELIVER:
                for seq, count, deadline in _DELIVER.iter_unpack(value):
                    self._counts[seq] = count
                    deadlines[seq] = deadline
                    self._cursor = max(self._cursor, seq + 1)
                    entries += 1
            elif op == OP_DEADLINE:
                for seq, deadline in _DEADLINE.iter_unpack(value):
                    if seq in deadlines:
                        deadlines[seq] = deadline
                    entries += 1
            else:
                raise CorruptStore(f"{self.directory}: unknown queue journal op {op!r}")
        self._journal_entries = entries
        # A torn tail can leave the journal ahead of the messages log or the
        # log start ahead of the floor: clamp to the messages that exist.
        start, end = self._messages.log_start, self._messages.next_sequence
        self._floor = min(max(self._floor, start), end)
        self._cursor = min(max(self._cursor, self._floor), end)
        self._acked = {s for s in self._acked if self._floor <= s < self._cursor}
        self._counts = {s: c for s, c in self._counts.items()
                        if self._floor <= s < self._cursor and s not in self._acked}
        for seq in self._counts:
            deadline = deadlines.get(seq, VISIBLE)
            if deadline == VISIBLE:
                self._ready.append(seq)
            else:
                self._inflight[seq] = deadline
                self._deadlines.append((deadline, seq))
        heapq.heapify(self._ready)
        heapq.heapify(self._deadlines)
        self._advance_floor()
        self.expire(now_ms)

    def close(self) -> None:
        """Flush both logs synchronously and close them (shutdown: blocks on fsync)."""
        self.flush_now()
        self._messages.close()
        self._state.close()

    def delete(self) -> None:
        """Remove the queue's logs and pointer (the directory itself is the caller's)."""
        self._messages.delete()
        self._state.delete()

    # --- counts -------------------------------------------------------------------------

    @property
    def pending_count(self) -> int:
        """Messages not yet acked, in flight or not (the backlog)."""
        return self._messages.next_sequence - self._floor - len(self._acked)

    @property
    def inflight_count(self) -> int:
        """Messages delivered and not yet acked, nacked or expired by ``expire``."""
        return len(self._inflight)

    @property
    def ack_floor(self) -> int:
        """Every Sequence below this is acked."""
        return self._floor

    @property
    def next_sequence(self) -> int:
        return self._messages.next_sequence

    @property
    def log_start(self) -> int:
        """First Sequence still stored (acked prefixes are truncated after a flush)."""
        return self._messages.log_start

    @property
    def journal_entries(self) -> int:
        """State entries replay of the current journal generation would read."""
        return self._journal_entries

    def is_acked(self, sequence: int) -> bool:
        return sequence < self._floor or sequence in self._acked

    def delivery_count(self, sequence: int) -> int:
        """Deliveries so far of an unacked message (0 if never delivered)."""
        return self._counts.get(sequence, 0)

    # --- operations ---------------------------------------------------------------------

    def send(self, records: list[NewRecord], now_ms: int) -> list[int]:
        """Append ``records`` as one batch; returns their Sequences."""
        if not records:
            return []
        first, last = self._messages.append(rec.build_batch(records, now_ms=now_ms), now_ms)
        return list(range(first, last + 1))

    def receive(self, max_messages: int, visibility_ms: int, now_ms: int) -> list[QueueMessage]:
        """Deliver up to ``max_messages`` of the oldest visible messages (lowest Sequence first).

        Each becomes in flight until ``now_ms + visibility_ms`` with its delivery
        count incremented. A message that would exceed ``max_deliveries`` is acked
        here and handed to the ``dead_letter`` hook instead (it does not count
        toward ``max_messages``). Expired deliveries are made visible first.
        """
        self.expire(now_ms)
        deadline = now_ms + max(visibility_ms, 0)
        chosen: list[tuple[int, int]] = []
        dead: list[tuple[int, int]] = []
        end = self._messages.next_sequence
        while len(chosen) < max_messages:
            if self._ready and (self._ready[0] < self._cursor or self._cursor >= end):
                seq = heapq.heappop(self._ready)
            elif self._cursor < end:
                seq = self._cursor
                self._cursor += 1
            else:
                break
            count = self._counts.get(seq, 0) + 1
            if self._max_deliveries is not None and count > self._max_deliveries:
                dead.append((seq, count - 1))
            else:
                chosen.append((seq, count))
        if not chosen and not dead:
            return []
        bodies = self._read_records([s for s, _ in chosen] + [s for s, _ in dead])
        journal: list[NewRecord] = []
        if chosen:
            journal.append(NewRecord(key=OP_DELIVER, value=_pack(
                _DELIVER, [(s, c, deadline) for s, c in chosen])))
        if dead:
            journal.append(NewRecord(key=OP_ACK, value=_pack(_SEQ, [(s,) for s, _ in dead])))
        self._journal(journal, len(chosen) + len(dead), now_ms)
        out = []
        for seq, count in chosen:
            self._counts[seq] = count
            self._inflight[seq] = deadline
            heapq.heappush(self._deadlines, (deadline, seq))
            out.append(QueueMessage(seq, bodies[seq], count, deadline))
        for seq, _count in dead:
            self._mark_acked(seq)
        self._advance_floor()
        self._maybe_roll(now_ms)
        if self._dead_letter is not None:
            for seq, count in dead:
                self._dead_letter(QueueMessage(seq, bodies[seq], count, now_ms))
        return out

    def ack(self, sequences: Iterable[int], now_ms: int | None = None) -> list[int]:
        """Ack in-flight messages; returns those acked. Others are ignored.

        ``now_ms`` only stamps the journal batch (default: the latest time
        seen) and never changes the outcome; deadlines are not checked (call
        ``expire`` for that).
        """
        done = [s for s in dict.fromkeys(sequences) if s in self._inflight]
        if not done:
            return []
        stamp = now_ms if now_ms is not None else self._now_ms
        self._journal([NewRecord(key=OP_ACK, value=_pack(_SEQ, [(s,) for s in done]))],
                      len(done), stamp)
        for seq in done:
            self._mark_acked(seq)
        self._advance_floor()
        self._maybe_roll(stamp)
        return done

    def nack(self, sequences: Iterable[int], now_ms: int) -> list[int]:
        """Make in-flight messages visible again at once; returns those nacked."""
        done = [s for s in dict.fromkeys(sequences) if s in self._inflight]
        if not done:
            return []
        self._journal([NewRecord(key=OP_DEADLINE, value=_pack(
            _DEADLINE, [(s, VISIBLE) for s in done]))], len(done), now_ms)
        for seq in done:
            del self._inflight[seq]
            heapq.heappush(self._ready, seq)
        self._maybe_roll(now_ms)
        return done

    def modify_deadline(self, sequences: Iterable[int], visibility_ms: int,
                        now_ms: int) -> list[int]:
        """Set in-flight messages' deadline to ``now_ms + visibility_ms`` (<= 0 is a nack).

        Deliveries already past their deadline at ``now_ms`` have expired and
        are not extended. Returns the Sequences changed.
        """
        if visibility_ms <= 0:
            return self.nack(sequences, now_ms)
        self.expire(now_ms)
        deadline = now_ms + visibility_ms
        done = [s for s in dict.fromkeys(sequences) if s in self._inflight]
        if not done:
            return []
        self._journal([NewRecord(key=OP_DEADLINE, value=_pack(
            _DEADLINE, [(s, deadline) for s in done]))], len(done), now_ms)
        for seq in done:
            self._inflight[seq] = deadline
            heapq.heappush(self._deadlines, (deadline, seq))
        self._compact_deadlines()
        self._maybe_roll(now_ms)
        return done

    def expire(self, now_ms: int) -> int | None:
        """Make deliveries whose deadline is ``<= now_ms`` visible; return the next deadline.

        Not journalled (deadlines are absolute). The caller schedules a
        ``callLater`` for the returned time, if any.
        """
        heap = self._deadlines
        while heap and heap[0][0] <= now_ms:
            deadline, seq = heapq.heappop(heap)
            if self._inflight.get(seq) == deadline:
                del self._inflight[seq]
                heapq.heappush(self._ready, seq)
        while heap and self._inflight.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    # --- group commit -------------------------------------------------------------------

    def prepare_flush(self) -> QueueFlushToken | None:
        """Token covering both logs (messages fsynced before the journal)."""
        messages = self._messages.prepare_flush()
        state = self._state.prepare_flush()
        if messages is None and state is None:
            return None
        return QueueFlushToken(messages, state, self._floor)

    def complete_flush(self, token: QueueFlushToken) -> None:
        """After ``token.run()``: advance durable ends; drop messages below the durable floor."""
        if token.messages is not None:
            self._messages.complete_flush(token.messages)
        if token.state is not None:
            self._state.complete_flush(token.state)
        # Each truncate_prefix rewrites a small checkpoint (at the next flush): in steps.
        if token.state is not None and token.floor >= self._truncated_to + TRUNCATE_STEP:
            self._truncated_to = token.floor
            self._messages.truncate_prefix(token.floor)

    def flush_now(self) -> None:
        """Synchronous flush (blocks on fsync): for shutdown and tests only."""
        token = self.prepare_flush()
        if token is not None:
            token.run()
            self.complete_flush(token)

    # --- internals ----------------------------------------------------------------------

    def _journal(self, records: list[NewRecord], entries: int, now_ms: int) -> None:
        self._now_ms = max(self._now_ms, now_ms)
        self._state.append(records, now_ms)
        self._journal_entries += entries

    def _mark_acked(self, seq: int) -> None:
        self._counts.pop(seq, None)
        self._inflight.pop(seq, None)
        self._acked.add(seq)

    def _advance_floor(self) -> None:
        acked = self._acked
        floor = self._floor
        while floor in acked:
            acked.discard(floor)
            floor += 1
        self._floor = floor

    def _compact_deadlines(self) -> None:
        if len(self._deadlines) > 2 * len(self._inflight) + 64:
            self._deadlines = [(d, s) for s, d in self._inflight.items()]
            heapq.heapify(self._deadlines)

    def _live_entries(self) -> int:
        return 1 + len(self._acked) + len(self._counts)

    def _maybe_roll(self, now_ms: int) -> None:
        limit = max(self._roll_min, 2 * self._live_entries())
        if self._journal_entries <= limit or self._state.rolling:
            return
        records: list[NewRecord] = [
            NewRecord(key=OP_FLOOR, value=_FLOOR.pack(self._floor, self._cursor))]
        records.extend(_chunks(OP_ACK, _SEQ, [(s,) for s in sorted(self._acked)]))
        records.extend(_chunks(OP_DELIVER, _DELIVER, [
            (s, c, self._inflight.get(s, VISIBLE)) for s, c in sorted(self._counts.items())]))
        batches = [records[i:i + _SNAPSHOT_RECORDS]
                   for i in range(0, len(records), _SNAPSHOT_RECORDS)]
        self._state.roll(batches, now_ms)
        self._journal_entries = self._live_entries()

    def _read_records(self, sequences: list[int]) -> dict[int, Record]:
        """Decode the records at ``sequences`` from the messages log (not yet durable included)."""
        wanted = set(sequences)
        found: dict[int, Record] = {}
        end = self._messages.next_sequence
        for seq in sorted(wanted):
            if seq in found:
                continue
            result = self._messages.read(seq, _READ_BYTES, upto=end)
            for batch in result.batches:
                for record in rec.iter_records(batch):
                    s = record.offset + 1
                    if s in wanted:
                        found[s] = record
            if seq not in found:
                raise CorruptStore(f"{self.directory}: message {seq} missing from its log")
        return found
