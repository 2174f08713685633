"""One share-partition of a KIP-932 share group: which records are in flight, and with whom.

A share group reads a partition from its *start offset* (SPSO). Every offset from there up to
``next`` (the first offset never handed out) is in flight and in one of Kafka's record states:
AVAILABLE (may be acquired), ACQUIRED (locked by one member until its lock runs out),
ACKNOWLEDGED or ARCHIVED (done). The start offset moves past every leading offset that is done,
so the in-flight window stays short; at most ``max_in_flight`` offsets are in it at once
(Kafka's ``group.share.partition.max.record.locks``).

Delivery counts grow on every acquisition. A record released (by a RELEASE acknowledgement,
its member leaving, or its lock running out) goes back to AVAILABLE unless it has been
delivered ``delivery_limit`` times, when it is ARCHIVED, as Kafka's
``group.share.delivery.count.limit`` says.

What survives a restart (``encode``/``decode``) is Kafka's share-group state: the start offset
and the ranges of offsets not AVAILABLE-and-undelivered, with their delivery counts; an
ACQUIRED record is written as AVAILABLE (its lock dies with the node that held it). Pure: time
is passed in as milliseconds.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Iterator

__all__ = ["SharePartition", "InFlight", "AVAILABLE", "ACQUIRED", "ACKNOWLEDGED", "ARCHIVED",
           "ACK_GAP", "ACK_ACCEPT", "ACK_RELEASE", "ACK_REJECT", "ACK_RENEW", "AckError"]

AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED = 0, 1, 2, 4  # Kafka's RecordState ids
ACK_GAP, ACK_ACCEPT, ACK_RELEASE, ACK_REJECT, ACK_RENEW = 0, 1, 2, 3, 4

DEFAULT_MAX_IN_FLIGHT = 2000  # group.share.partition.max.record.locks
DEFAULT_DELIVERY_LIMIT = 5  # group.share.delivery.count.limit


class AckError(Exception):
    """An acknowledgement the partition refuses (Kafka's INVALID_RECORD_STATE or
    INVALID_REQUEST): ``invalid_request`` tells which."""

    def __init__(self, message: str, invalid_request: bool = False) -> None:
        super().__init__(message)
        self.invalid_request = invalid_request


@dataclass(slots=True)
class InFlight:
    state: int
    count: int = 0  # deliveries so far
    member: str = ""
    deadline_ms: int = 0


class SharePartition:
    """The in-flight window of one (group, topic, partition)."""

    __slots__ = ("start", "next", "records", "max_in_flight", "delivery_limit")

    def __init__(self, start: int, *, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 delivery_limit: int = DEFAULT_DELIVERY_LIMIT) -> None:
        self.start = start
        self.next = start
        self.records: dict[int, InFlight] = {}  # offsets in [start, next) only
        self.max_in_flight = max_in_flight
        self.delivery_limit = delivery_limit

    # --- reading the window ---------------------------------------------------------------

    def room(self) -> int:
        """How many new offsets may still be acquired past ``next``."""
        return max(0, self.max_in_flight - (self.next - self.start))

    def available_runs(self) -> list[tuple[int, int]]:
        """Runs ``(first, last)`` of AVAILABLE offsets below ``next``, ascending."""
        runs: list[tuple[int, int]] = []
        for offset in sorted(o for o, r in self.records.items() if r.state == AVAILABLE):
            if runs and runs[-1][1] == offset - 1:
                runs[-1] = (runs[-1][0], offset)
            else:
                runs.append((offset, offset))
        return runs

    def acquired_by(self, member: str) -> list[int]:
        return sorted(o for o, r in self.records.items()
                      if r.state == ACQUIRED and r.member == member)

    def has_acquired(self) -> bool:
        return any(r.state == ACQUIRED for r in self.records.values())

    # --- acquiring ------------------------------------------------------------------------

    def acquire(self, first: int, last: int, member: str, deadline_ms: int,
                ) -> list[tuple[int, int, int]]:
        """Lock every acquirable offset of ``[first, last]`` for ``member``: AVAILABLE ones
        below ``next``, and new ones from ``next`` (which then moves past ``last``). Returns
        the acquired runs as ``(first, last, delivery_count)``, ascending."""
        out: list[tuple[int, int, int]] = []

        def take(offset: int, rec: InFlight) -> None:
            rec.state, rec.member, rec.deadline_ms = ACQUIRED, member, deadline_ms
            rec.count += 1
            if out and out[-1][1] == offset - 1 and out[-1][2] == rec.count:
                out[-1] = (out[-1][0], offset, rec.count)
            else:
                out.append((offset, offset, rec.count))

        first = max(first, self.start)
        for offset in range(first, min(last + 1, self.next)):
            rec = self.records.get(offset)
            if rec is not None and rec.state == AVAILABLE:
                take(offset, rec)
        if last >= self.next:  # never handed out: the common case, kept cheap
            low = max(first, self.next)
            records = self.records
            for offset in range(low, last + 1):
                records[offset] = InFlight(ACQUIRED, 1, member, deadline_ms)
            if out and out[-1][1] == low - 1 and out[-1][2] == 1:
                out[-1] = (out[-1][0], last, 1)
            else:
                out.append((low, last, 1))
            self.next = last + 1
        return out

    def archive_new(self, first: int, last: int) -> None:
        """Offsets from ``next`` up to ``last`` that hold nothing to deliver (compacted away,
        or transaction markers): they enter the window already done."""
        if last < self.next:
            return
        for offset in range(max(first, self.next), last + 1):
            self.records[offset] = InFlight(ARCHIVED)
        for offset in range(self.next, first):
            self.records.setdefault(offset, InFlight(AVAILABLE))
        self.next = last + 1
        self._advance()

    def skip_to(self, offset: int) -> None:
        """The log no longer holds offsets below ``offset`` (retention, DeleteRecords): they
        leave the window, whatever their state."""
        if offset <= self.start:
            return
        for o in [o for o in self.records if o < offset]:
            del self.records[o]
        self.start = offset
        self.next = max(self.next, offset)

    def archive_gap(self, first: int, last: int) -> None:
        """Offsets below ``next`` that the log turned out not to hold (a compacted or control
        record): nothing to deliver, so they are done."""
        for offset in range(max(first, self.start), min(last + 1, self.next)):
            rec = self.records.get(offset)
            if rec is not None and rec.state == AVAILABLE:
                rec.state = ARCHIVED
        self._advance()

    # --- acknowledging and releasing ------------------------------------------------------

    def acknowledge(self, member: str, first: int, last: int, types: Iterable[int],
                    now_ms: int = 0, lock_ms: int = 0) -> None:
        """Apply one acknowledgement batch of ``member``. ``types`` has one type for the whole
        range or one per offset (Kafka's AcknowledgeTypes). All or nothing: every offset must
        be ACQUIRED by ``member``, or AckError."""
        kinds = list(types)
        span = last - first + 1
        if span <= 0 or first < 0:
            raise AckError(f"invalid acknowledgement range {first}-{last}", True)
        if len(kinds) not in (1, span):
            raise AckError(f"{len(kinds)} acknowledge types for {span} offsets", True)
        if any(k not in (ACK_GAP, ACK_ACCEPT, ACK_RELEASE, ACK_REJECT, ACK_RENEW)
               for k in kinds):
            raise AckError("unknown acknowledge type", True)
        get = self.records.get
        held = [get(offset) for offset in range(first, last + 1)]
        for offset, rec in zip(range(first, last + 1), held):
            if rec is None or rec.state != ACQUIRED or rec.member != member:
                raise AckError(f"offset {offset} is not acquired by this member")
        if kinds == [ACK_ACCEPT]:  # the common case
            for rec in held:
                rec.state = ACKNOWLEDGED  # type: ignore[union-attr]
            self._advance()
            return
        for i, rec in enumerate(held):
            assert rec is not None
            kind = kinds[0] if len(kinds) == 1 else kinds[i]
            if kind == ACK_ACCEPT:
                rec.state = ACKNOWLEDGED
            elif kind in (ACK_REJECT, ACK_GAP):
                rec.state = ARCHIVED
            elif kind == ACK_RELEASE:
                self._release(rec)
            else:  # RENEW: the member keeps it for another lock period
                rec.deadline_ms = now_ms + lock_ms
        self._advance()

    def release_member(self, member: str) -> bool:
        """Everything ``member`` holds goes back (it left, or closed its share session)."""
        changed = False
        for rec in self.records.values():
            if rec.state == ACQUIRED and rec.member == member:
                self._release(rec)
                changed = True
        if changed:
            self._advance()
        return changed

    def expire(self, now_ms: int) -> bool:
        """Release every lock that ran out by ``now_ms``; True if any did."""
        changed = False
        for rec in self.records.values():
            if rec.state == ACQUIRED and rec.deadline_ms <= now_ms:
                self._release(rec)
                changed = True
        if changed:
            self._advance()
        return changed

    def next_deadline(self) -> int | None:
        deadlines = [r.deadline_ms for r in self.records.values() if r.state == ACQUIRED]
        return min(deadlines) if deadlines else None

    def _release(self, rec: InFlight) -> None:
        rec.member, rec.deadline_ms = "", 0
        rec.state = ARCHIVED if rec.count >= self.delivery_limit else AVAILABLE

    def _advance(self) -> None:
        records = self.records
        while self.start < self.next:
            rec = records.get(self.start)
            if rec is not None and rec.state not in (ACKNOWLEDGED, ARCHIVED):
                break
            records.pop(self.start, None)
            self.start += 1

    # --- persistence ----------------------------------------------------------------------

    def _runs(self) -> Iterator[tuple[int, int, int, int]]:
        """(first, last, state, count) runs of the window, ACQUIRED written as AVAILABLE."""
        run: list[int] | None = None
        for offset in range(self.start, self.next):
            rec = self.records.get(offset)
            state = ARCHIVED if rec is None else (AVAILABLE if rec.state == ACQUIRED
                                                   else rec.state)
            count = 0 if rec is None else rec.count
            if run is not None and run[1] == offset - 1 and run[2] == state and run[3] == count:
                run[1] = offset
                continue
            if run is not None:
                yield tuple(run)  # type: ignore[misc]
            run = [offset, offset, state, count]
        if run is not None:
            yield tuple(run)  # type: ignore[misc]

    def encode(self) -> bytes:
        return json.dumps({"start": self.start, "next": self.next,
                           "runs": [list(r) for r in self._runs()]},
                          separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes, *, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
               delivery_limit: int = DEFAULT_DELIVERY_LIMIT) -> "SharePartition":
        d = json.loads(raw)
        sp = cls(int(d["start"]), max_in_flight=max_in_flight, delivery_limit=delivery_limit)
        sp.next = int(d["next"])
        for first, last, state, count in d["runs"]:
            for offset in range(first, last + 1):
                sp.records[offset] = InFlight(state, count)
        sp._advance()
        return sp
