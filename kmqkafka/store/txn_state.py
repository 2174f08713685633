"""Transactions as one partition sees them: the open ones (they hold the last stable offset
back) and the aborted ones (a read_committed consumer is told to skip their records).

Kafka keeps this in ``ProducerStateManager`` (ongoing transactions, hence the LSO) and in each
segment's ``.txnindex`` (aborted ranges). Here it is a function of the log alone, as the
producer window is (``producer_state.py``): a transactional data batch opens its producer's
transaction at the batch's first Sequence unless one is open already; an end-transaction
marker (a control batch) closes it, and an ABORT marker records the range from that first
Sequence to the marker's Sequence. Every node that applied the same log holds the same state,
and a restarted node rebuilds it by folding the log's batch headers in order (``ChannelLog``).

A marker also fences: once a marker of epoch E is stored, a data batch of that producer with
an older epoch is refused (INVALID_PRODUCER_EPOCH), which is how a zombie's late writes are
kept out after its transaction was aborted with a bumped epoch.

Sequences throughout (Kafka offset + 1). Pure logic: no I/O, no clock.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable

from kmqkafka.store.errors import InvalidProducerEpoch

__all__ = ["AbortedTxn", "AbortedIndex", "PartitionTxns", "ABORT", "COMMIT",
           "index_aborted", "is_aborted"]

ABORT, COMMIT = 0, 1


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first: int  # Sequence of the transaction's first record in this partition
    last: int  # Sequence of its ABORT marker


AbortedIndex = dict[int, list[tuple[int, int]]]
"""Producer id -> (first, marker) Sequences of its aborted transactions (``index_aborted``)."""


def index_aborted(txns: Iterable[AbortedTxn]) -> AbortedIndex:
    """Aborted transactions by producer, for ``is_aborted``."""
    out: AbortedIndex = {}
    for a in txns:
        out.setdefault(a.producer_id, []).append((a.first, a.last))
    return out


def is_aborted(index: AbortedIndex | None, producer_id: int, first: int) -> bool:
    """A transactional data batch of ``producer_id`` starting at Sequence ``first`` belongs to
    an aborted transaction (read_committed readers and the cleaner drop its records)."""
    return bool(index) and any(lo <= first <= hi for lo, hi in index.get(producer_id, ()))


class PartitionTxns:
    """Open and aborted transactions of one partition. Reactor thread only."""

    __slots__ = ("open", "aborted", "_ends", "fences")

    def __init__(self) -> None:
        self.open: dict[int, int] = {}  # producer id -> first Sequence of its open transaction
        self.aborted: list[AbortedTxn] = []  # in marker order
        self._ends: list[int] = []  # aborted[i].last, for bisect
        self.fences: dict[int, int] = {}  # producer id -> epoch of its latest marker

    def check(self, producer_id: int, epoch: int) -> None:
        """Refuse a data batch from an epoch an earlier marker ended (a fenced producer)."""
        fence = self.fences.get(producer_id)
        if fence is not None and epoch < fence:
            raise InvalidProducerEpoch(
                f"producer {producer_id} epoch {epoch} is older than the epoch {fence} "
                "of its last transaction marker")

    def on_data(self, producer_id: int, first: int) -> None:
        """A transactional data batch starting at ``first`` was stored."""
        self.open.setdefault(producer_id, first)

    def on_marker(self, producer_id: int, epoch: int, kind: int, sequence: int) -> None:
        """A COMMIT or ABORT marker of ``producer_id`` was stored at ``sequence``."""
        first = self.open.pop(producer_id, None)
        if epoch > self.fences.get(producer_id, -1):
            self.fences[producer_id] = epoch
        if kind == ABORT and first is not None:
            self.aborted.append(AbortedTxn(producer_id, first, sequence))
            self._ends.append(sequence)

    def first_unstable(self) -> int | None:
        """First Sequence of the earliest open transaction (None: none is open)."""
        return min(self.open.values()) if self.open else None

    def stable_end(self, high_watermark: int) -> int:
        """The next Sequence a read_committed reader may not pass (Kafka's LSO + 1)."""
        first = self.first_unstable()
        return high_watermark if first is None else min(first, high_watermark)

    def open_since(self, producer_id: int) -> int | None:
        return self.open.get(producer_id)

    def aborted_between(self, lo: int, hi: int) -> list[AbortedTxn]:
        """Aborted transactions a read of Sequences [lo, hi) may show records of: their
        marker is at or past ``lo`` and their first record is below ``hi``."""
        start = bisect.bisect_left(self._ends, lo)
        return [a for a in self.aborted[start:] if a.first < hi]

    def forget_below(self, log_start: int) -> None:
        """Drop aborted ranges that retention or DeleteRecords left wholly below the log."""
        cut = bisect.bisect_left(self._ends, log_start)
        if cut:
            del self.aborted[:cut]
            del self._ends[:cut]
