"""Idempotent-producer state of one partition: Kafka's sequence checks, decided at apply time.

A batch whose header carries a producer id (>= 0) is checked against what the partition knows
of that producer before it is stored, the way Apache Kafka's ``ProducerStateManager`` /
``ProducerAppendInfo`` do it (KIP-98, with KIP-360's acceptance of unknown producers):

- **duplicate**: same epoch, and the batch's first and last producer sequence equal those of one
  of the producer's last five stored batches: nothing is stored, and the append answers with
  that batch's Sequences (Kafka returns the original offsets, error NONE);
- **older epoch** than the producer's latest: ``InvalidProducerEpoch`` (INVALID_PRODUCER_EPOCH);
- **newer epoch**: the batch must start at sequence 0, else ``OutOfOrderSequence``
  (OUT_OF_ORDER_SEQUENCE_NUMBER); the cached batches are forgotten;
- **same epoch**: the batch must start right after the producer's last sequence (2**31 - 1 wraps
  to 0), else ``OutOfOrderSequence``;
- **unknown producer** (never seen, or seen only outside the window below): any sequence is
  accepted, which is what KIP-360 made Kafka do once a producer's state is gone.

The window. Raft nodes check batches themselves at apply time, so what a node knows of its
producers must be a function of the log alone, identical on a node that has run for a week and
on one that just rebuilt its state from disk. So a producer is *known* only through its batches
whose last Sequence is at or above the partition's **producer floor**,
``max(log_start, next_sequence - window)`` (``window`` records, ``WINDOW`` in production): the
checks see only those batches, a producer with none is unknown, and a restarted node rebuilds
exactly that by folding the headers of the batches above the floor (``ChannelLog``). The floor
only moves up (appends, DeleteRecords, retention), so a batch that left the window never comes
back. Kafka keeps an idle producer for ``producer.id.expiration.ms`` (a day) and snapshots its
state at every segment roll; here an idle producer is forgotten once ``WINDOW`` records of other
producers followed its last batch, and a retry that late is stored again. ``WINDOW`` (262,144
records) trades that retry horizon (seconds even on a partition taking 100k records/s; a
retry normally comes within one request timeout) against the start-up cost of the rebuild (at
most that many batch headers read per partition). Compaction keeps the headers of idempotent
producers' batches above the floor (one left without records stays as an empty batch,
``CompactionPlan``).

"Sequence" (capital S, ``first_sequence``/``last_sequence``) is the store's position of a record
(Kafka offset + 1); "seq" (``base_seq``/``last_seq``) is the producer's own sequence number.
Pure logic: no I/O, no clock. Reactor thread only (owned by one ``ChannelLog``).
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from kmqkafka.store.errors import InvalidProducerEpoch, OutOfOrderSequence

NUM_BATCHES_TO_RETAIN = 5  # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN
MAX_SEQ = 2**31 - 1
WINDOW = 1 << 18  # records: how far back a producer's last batch may lie and still be known
_PRUNE_MIN = 1024


def last_seq_of(base_seq: int, last_offset_delta: int) -> int:
    """The producer sequence of a batch's last record (Kafka's ``incrementSequence``: wraps)."""
    if base_seq > MAX_SEQ - last_offset_delta:
        return last_offset_delta - (MAX_SEQ - base_seq) - 1
    return base_seq + last_offset_delta


def in_sequence(last_seq: int, next_seq: int) -> bool:
    """Does a batch starting at ``next_seq`` follow one ending at ``last_seq``?"""
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == MAX_SEQ)


class BatchMetadata(NamedTuple):
    """One stored batch of a producer, as much as a retry needs (Kafka's ``BatchMetadata``)."""

    base_seq: int
    last_seq: int
    first_sequence: int  # store Sequence of its first record (offset + 1)
    last_sequence: int
    max_timestamp: int  # the stored batch's maxTimestamp (the append time on LogAppendTime)


class ProducerEntry:
    """A producer's latest epoch and its last (up to five) batches, oldest first."""

    __slots__ = ("epoch", "batches")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.batches: deque[BatchMetadata] = deque(maxlen=NUM_BATCHES_TO_RETAIN)


class ProducerState:
    """Every producer of one partition, by producer id.

    ``check`` before storing a batch, ``record`` once it is stored; ``floor`` is the
    partition's producer floor at that moment (see the module docstring). Entries whose last
    batch fell below the floor are invisible to ``check`` and are dropped lazily (amortised in
    ``record``), so memory follows the producers active within the window.
    """

    def __init__(self) -> None:
        self._entries: dict[int, ProducerEntry] = {}
        self._prune_at = _PRUNE_MIN

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, producer_id: int, floor: int) -> ProducerEntry | None:
        """The producer's entry if it is known at ``floor`` (tests, tools)."""
        entry = self._entries.get(producer_id)
        if entry is None or entry.batches[-1].last_sequence < floor:
            return None
        return entry

    def active(self, floor: int) -> list[tuple[int, ProducerEntry]]:
        """Every producer known at ``floor``, by producer id (DescribeProducers)."""
        return sorted((pid, e) for pid, e in self._entries.items()
                      if e.batches and e.batches[-1].last_sequence >= floor)

    def check(self, producer_id: int, epoch: int, base_seq: int, last_offset_delta: int,
              floor: int) -> BatchMetadata | None:
        """Decide on a batch before it is stored: None to store it, the cached metadata of the
        batch it duplicates, or raise ``InvalidProducerEpoch`` / ``OutOfOrderSequence``."""
        entry = self._entries.get(producer_id)
        if entry is None:
            return None
        batches = entry.batches
        last = batches[-1]
        if last.last_sequence < floor:
            return None  # unknown producer (KIP-360): its state left the window
        current = entry.epoch
        if epoch == current:
            end = last.last_seq
            if in_sequence(end, base_seq):
                # The usual case. Kafka looks for a duplicate first, but an in-sequence batch
                # could only equal a cached one if the five held a multiple of 2**31 records.
                return None
            last_seq = last_seq_of(base_seq, last_offset_delta)
            for meta in batches:
                if (meta.base_seq == base_seq and meta.last_seq == last_seq
                        and meta.last_sequence >= floor):
                    return meta
            raise OutOfOrderSequence(
                f"Out of order sequence number for producer {producer_id}: {base_seq} "
                f"(incoming seq. number), {end} (current end sequence number)")
        if epoch < current:
            raise InvalidProducerEpoch(
                f"Epoch of producer {producer_id} is {epoch}, which is smaller than the last "
                f"seen epoch {current}")
        if base_seq != 0:
            raise OutOfOrderSequence(
                f"Invalid sequence number for new epoch of producer {producer_id}: {epoch} "
                f"(request epoch), {base_seq} (seq. number), {current} (current producer epoch)")
        return None

    def record(self, producer_id: int, epoch: int, meta: BatchMetadata, floor: int) -> None:
        """A batch of the producer was stored (after ``check``, or folded from the log)."""
        entry = self._entries.get(producer_id)
        if entry is None:
            if len(self._entries) >= self._prune_at:
                self.prune(floor)
            entry = self._entries[producer_id] = ProducerEntry(epoch)
        elif entry.epoch != epoch or entry.batches[-1].last_sequence < floor:
            # A new epoch starts afresh (Kafka clears the cached batches); so does a producer
            # that was unknown, exactly as a rebuild from the window would see it.
            entry.epoch = epoch
            entry.batches.clear()
        entry.batches.append(meta)

    def find(self, producer_id: int, first_sequence: int) -> BatchMetadata | None:
        """The cached batch of the producer stored at ``first_sequence``, if any."""
        entry = self._entries.get(producer_id)
        if entry is not None:
            for meta in entry.batches:
                if meta.first_sequence == first_sequence:
                    return meta
        return None

    def prune(self, floor: int) -> int:
        """Drop producers whose last batch lies below ``floor``; returns how many."""
        gone = [pid for pid, e in self._entries.items() if e.batches[-1].last_sequence < floor]
        for pid in gone:
            del self._entries[pid]
        self._prune_at = max(_PRUNE_MIN, 2 * len(self._entries))
        return len(gone)
