"""QueueChannel: FIFO delivery, visibility timeouts, acks, dead-lettering, durability."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kmqkafka.records import NewRecord
from kmqkafka.store.queue import QueueChannel, QueueMessage

T0 = 1_700_000_000_000


def msgs(*values: bytes) -> list[NewRecord]:
    return [NewRecord(value=v) for v in values]


def flush(q: QueueChannel) -> None:
    token = q.prepare_flush()
    if token is not None:
        token.run()
        q.complete_flush(token)


def state_gens(directory: Path) -> list[int]:
    return sorted(int(e[6:]) for e in os.listdir(directory)
                  if e.startswith("state.") and e[6:].isdigit())


def seqs(out: list[QueueMessage]) -> list[int]:
    return [m.sequence for m in out]


def test_send_assigns_dense_sequences_and_receive_is_fifo(tmp_path: Path) -> None:
    q = QueueChannel.open(tmp_path, T0)
    assert q.send(msgs(b"a", b"b", b"c"), T0) == [1, 2, 3]
    assert q.send(msgs(b"d"), T0) == [4]
    assert q.send([], T0) == []
    first = q.receive(2, 1000, T0)
    assert [(m.sequence, m.record.value, m.delivery_count, m.deadline_ms) for m in first] == [
        (1, b"a", 1, T0 + 1000), (2, b"b", 1, T0 + 1000)]
    assert all(m.record.offset + 1 == m.sequence for m in first)
    assert [m.record.value for m in q.receive(10, 1000, T0)] == [b"c", b"d"]
    assert q.receive(10, 1000, T0) == []
    assert q.pending_count == 4 and q.inflight_count == 4


def test_record_fields_round_trip(tmp_path: Path) -> None:
    q = QueueChannel.open(tmp_path, T0)
    q.send([NewRecord(value=b"body", key=b"k", headers=(("h", b"v"), ("n", None)),
                      timestamp=T0 - 5)], T0)
    (m,) = q.receive(1, 1000, T0)
    assert (m.record.key, m.record.value, m.record.headers, m.record.timestamp) == (
        b"k", b"body", (("h", b"v"), ("n", None)), T0 - 5)


def test_visibility_timeout_redelivers_with_increasing_count(tmp_path: Path) -> None:
    q = QueueChannel.open(tmp_path, T0)
    q.send(msgs(b"a"), T0)
    assert [m.delivery_count for m in q.receive(1, 100, T0)] == [1]
    assert q.receive(1, 100, T0 + 99) == []  # still in flight
    again = q.receive(1, 100, T0 + 100)  # deadline reached: visible again
    assert [(m.sequence, m.delivery_count, m.deadline_ms) for m in again] == [(1, 2, T0 + 200)]
    assert [m.delivery_count for m in q.receive(1, 100, T0 + 250)] == [3]


def test_redeliveries_come_before_newer_messages(tmp_path: Path) -> None:
    q = QueueChannel.open(tmp_path, T0)
    q.send(msgs(b"1", b"2", b"3", b"4"), T0)
    q.receive(2, 100, T0)  # 1, 2 in flight
    q.send(msgs(b"5"), T0)
    q.nack([2], T0)
    assert seqs(q.receive(2, 100, T0 + 1)) == [2, 3]
    out = q.receive(10, 100, T0 + 150)  # 1, 2 and 3 expired
    assert [(m.sequence, m.delivery_count) for m in out] == [(1, 2), (2, 3), (3, 2), (4, 1), (5, 1)]


def test_ack_returns_only_messages_in_flight(tmp_path: Path) -> None:
    q = QueueChannel.open(tmp_path, T0)
    q.send(msgs(b"a", b"b", b"c"), T0)
    q.receive(2, 100, T0)
    assert q.ack([2, 3, 99, 2]) == [2]  # 3 never delivered, 99 unknown, duplicate once
    assert q.ack([2]) == []  # already acked
    assert q.pending_count == 2 and q.inflight_count == 1
    assert q.ack_floor == 1
    assert q.ack([1]) == [1]
    assert q.ack_floor == 3 and q.is_acked(2) and not q.is_acked(3)
    assert seqs(q.receive(10, 100, T0 + 1000)) == [3]  # acked ones never come back


def test_nack_makes_visible_at_once(tmp_path: Path) -> None:
    q = QueueChannel.open(tmp_path, T0)
    q.send(msgs(b"a", b"b"), T0)
    q.receive(2, 10_000, T0)
    assert q.nack([1, 7], T0) == [1]
    assert q.inflight_count == 1
    (m,) = q.receive(5, 10_000, T0)
    assert (m.sequence, m.delivery_count) == (1, 2)
    assert q.nack([1], T0) == [1] and q.ack([1]) == []  # nacked is no longer in flight


def test_modify_deadline_extends_shortens_and_zero_nacks(tmp_path: Path) -> None:
    q = QueueChannel.open(tmp_path, T0)
    q.send(msgs(b"a", b"b", b"c"), T0)
    q.receive(3, 100, T0)
    assert q.modify_deadline([1], 1000, T0 + 50) == [1]  # extended to T0 + 1050
    assert q.modify_deadline([2], 0, T0 + 50) == [2]  # nack
    assert seqs(q.receive(10, 100, T0 + 60)) == [2]
    assert q.expire(T0 + 100) == T0 + 160  # 3 expired; next deadline is 2's
    assert q.modify_deadline([3], 1000, T0 + 120) == []  # expired: not extended
    assert seqs(q.receive(10, 100, T0 + 200)) == [2, 3]
    assert q.expire(T0 + 1049) == T0 + 1050  # 2 and 3 expired again at T0 + 300
    assert seqs(q.receive(10, 100, T0 + 1050)) == [1, 2, 3]


def test_modify_deadline_does_not_revive_overdue_delivery(tmp_path: Path) -> None:
    q = QueueChannel.open(tmp_path, T0)
    q.send(msgs(b"a"), T0)
    q.receive(1, 100, T0)
    assert q.modify_deadline([1], 1000, T0 + 100) == []  # deadline reached, no expire() call
    assert q.inflight_count == 0
    assert [m.delivery_count for m in q.receive(1, 100, T0 + 100)] == [2]


def test_expire_reports_next_deadline(tmp_path: Path) -> None:
    q = QueueChannel.open(tmp_path, T0)
    assert q.expire(T0) is None
    q.send(msgs(b"a", b"b"), T0)
    q.receive(1, 300, T0)
    q.receive(1, 100, T0)
    assert q.expire(T0) == T0 + 100
    assert q.expire(T0 + 100) == T0 + 300
    assert q.inflight_count == 1
    assert q.expire(T0 + 300) is None
    assert q.inflight_count == 0 and q.pending_count == 2


def test_dead_letter_after_max_deliveries(tmp_path: Path) -> None:
    dead: list[QueueMessage] = []
    q = QueueChannel.open(tmp_path, T0, max_deliveries=2, dead_letter=dead.append)
    q.send(msgs(b"poison", b"ok"), T0)
    assert seqs(q.receive(1, 10, T0)) == [1]
    q.nack([1], T0)
    assert [m.delivery_count for m in q.receive(1, 10, T0)] == [2]
    q.nack([1], T0)
    out = q.receive(1, 10, T0)  # third delivery would exceed 2: dead-lettered instead
    assert seqs(out) == [2]
    assert [(m.sequence, m.record.value, m.delivery_count) for m in dead] == [(1, b"poison", 2)]
    assert q.is_acked(1) and q.pending_count == 1
    q.nack([2], T0)
    q.receive(1, 10, T0)
    assert q.receive(5, 10, T0 + 100) == [] and len(dead) == 2


def test_max_deliveries_without_hook_drops(tmp_path: Path) -> None:
    q = QueueChannel.open(tmp_path, T0, max_deliveries=1)
    q.send(msgs(b"a"), T0)
    q.receive(1, 10, T0)
    assert q.receive(1, 10, T0 + 10) == []
    assert q.pending_count == 0


def test_state_survives_close_and_open(tmp_path: Path) -> None:
    q = QueueChannel.open(tmp_path, T0)
    q.send(msgs(b"a", b"b", b"c", b"d"), T0)
    q.receive(3, 1000, T0)
    q.ack([2])
    q.nack([3], T0)
    q.receive(1, 1000, T0)  # 3 again: count 2
    q.close()
    q = QueueChannel.open(tmp_path, T0 + 10)
    assert q.inflight_count == 2 and q.pending_count == 3 and q.is_acked(2)
    assert seqs(q.receive(10, 1000, T0 + 10)) == [4]  # 1 and 3 still in flight
    out = q.receive(10, 1000, T0 + 1000)
    assert [(m.sequence, m.delivery_count) for m in out] == [(1, 2), (3, 3)]
    assert q.send(msgs(b"e"), T0) == [5]


def test_crash_keeps_exactly_what_a_flush_made_durable(tmp_path: Path) -> None:
    live = tmp_path / "q"
    q = QueueChannel.open(live, T0)
    q.send(msgs(b"a", b"b", b"c"), T0)
    q.receive(2, 1000, T0)
    q.ack([1])
    flush(q)
    crashed = tmp_path / "crashed"
    shutil.copytree(live, crashed)  # the files as a power cut right now would leave them
    q.ack([2])
    q.receive(1, 1000, T0)
    q2 = QueueChannel.open(crashed, T0 + 1)
    assert q2.is_acked(1) and not q2.is_acked(2)
    assert q2.inflight_count == 1 and q2.delivery_count(2) == 1
    out = q2.receive(10, 1000, T0 + 1000)
    assert [(m.sequence, m.delivery_count) for m in out] == [(2, 2), (3, 1)]


def test_reopen_without_close_after_flush(tmp_path: Path) -> None:
    q = QueueChannel.open(tmp_path, T0, max_deliveries=3)
    q.send(msgs(b"a", b"b"), T0)
    for i in range(2):
        q.receive(2, 10, T0 + 20 * i)
    q.ack([2])
    flush(q)
    q2 = QueueChannel.open(tmp_path, T0 + 100, max_deliveries=3)  # q is abandoned, not closed
    assert q2.delivery_count(1) == 2 and q2.is_acked(2)
    assert [m.delivery_count for m in q2.receive(1, 10, T0 + 100)] == [3]


def test_journal_roll_keeps_state_and_bounds_replay(tmp_path: Path) -> None:
    q = QueueChannel.open(tmp_path, T0, state_roll_min_entries=30)
    q.send(msgs(*[b"m%d" % i for i in range(200)]), T0)
    now = T0
    held: list[int] = []
    for _ in range(40):
        now += 10
        out = q.receive(5, 1000, now)
        q.ack(held + [m.sequence for m in out[:3]])
        held = [m.sequence for m in out[3:]]  # two stay in flight until the next round
        flush(q)
        assert q.journal_entries <= 30 + 10  # threshold plus at most one pending op
    gens = state_gens(tmp_path)
    assert len(gens) == 1 and gens[0] >= 5  # rolled many times, old journals deleted
    assert (tmp_path / "state.CURRENT").read_bytes() == str(gens[0]).encode()

    def view(q: QueueChannel) -> tuple:
        return (q.ack_floor, q.pending_count, q.inflight_count,
                [q.delivery_count(s) for s in range(1, 201)],
                [q.is_acked(s) for s in range(1, 201)])

    before = view(q)
    assert before[:3] == (199, 2, 2)
    q.close()
    q = QueueChannel.open(tmp_path, now)
    assert view(q) == before
    assert q.journal_entries <= 30 + 10
    assert [(m.sequence, m.delivery_count) for m in q.receive(5, 10, now + 1000)] == [
        (199, 2), (200, 2)]


def test_crash_during_state_roll(tmp_path: Path) -> None:
    q = QueueChannel.open(tmp_path, T0, state_roll_min_entries=10)
    q.send(msgs(*[b"%d" % i for i in range(30)]), T0)
    out = q.receive(30, 1000, T0)
    flush(q)
    q.ack([m.sequence for m in out[:4]])
    assert state_gens(tmp_path) == [0]
    q.ack([m.sequence for m in out[4:12]])  # journal passes 10 entries: roll to gen 1
    assert state_gens(tmp_path) == [0, 1]
    # Crash before the pointer switch: gen 0 stays current, gen 1 is a leftover.
    q2 = QueueChannel.open(tmp_path, T0, state_roll_min_entries=10)
    assert state_gens(tmp_path) == [0] and q2.ack_floor == 13
    # Now crash after the pointer switch but before the old journal was deleted.
    q2.ack([13, 14])  # gen 0 holds 44 entries for 17 live: roll again
    assert state_gens(tmp_path) == [0, 1]
    q2.ack([15, 16, 17, 18, 19, 20, 21, 22, 23])
    token = q2.prepare_flush()
    assert token is not None
    token.run()
    assert state_gens(tmp_path) == [0, 1]
    q3 = QueueChannel.open(tmp_path, T0)
    assert state_gens(tmp_path) == [1] and q3.ack_floor == 24
    assert q3.inflight_count == 7 and q3.pending_count == 7


def test_acked_prefix_is_truncated_from_messages_log(tmp_path: Path, monkeypatch) -> None:
    from kmqkafka.store import queue as queue_module
    from kmqkafka.store.config import LogConfig
    monkeypatch.setattr(queue_module, "TRUNCATE_STEP", 30)
    q = QueueChannel.open(tmp_path, T0, config=LogConfig(segment_bytes=4096))
    for i in range(50):
        q.send(msgs(b"x" * 200), T0)
    out = q.receive(50, 1000, T0)
    q.ack([m.sequence for m in out[:40]])
    flush(q)
    assert q.log_start > 1  # whole acked segments are gone
    assert q.log_start <= 41
    q.close()
    q = QueueChannel.open(tmp_path, T0)
    assert q.ack_floor == 41 and q.pending_count == 10
    assert seqs(q.receive(20, 10, T0 + 2000)) == list(range(41, 51))


# --- model-based property test ---------------------------------------------------------


class QueueModel:
    """The obvious, slow queue: every message's state in plain dicts."""

    def __init__(self, max_deliveries: int | None) -> None:
        self.max_deliveries = max_deliveries
        self.next = 1
        self.acked: set[int] = set()
        self.counts: dict[int, int] = {}
        self.inflight: dict[int, int] = {}
        self.dead: list[tuple[int, int]] = []

    def send(self, n: int) -> list[int]:
        out = list(range(self.next, self.next + n))
        self.next += n
        return out

    def expire(self, now: int) -> int | None:
        for s, d in list(self.inflight.items()):
            if d <= now:
                del self.inflight[s]
        return min(self.inflight.values(), default=None)

    def receive(self, n: int, vis: int, now: int) -> list[tuple[int, int, int]]:
        self.expire(now)
        out = []
        for s in range(1, self.next):
            if len(out) >= n:
                break
            if s in self.acked or s in self.inflight:
                continue
            c = self.counts.get(s, 0) + 1
            if self.max_deliveries is not None and c > self.max_deliveries:
                self.acked.add(s)
                self.dead.append((s, c - 1))
                continue
            self.counts[s] = c
            self.inflight[s] = now + vis
            out.append((s, c, now + vis))
        return out

    def ack(self, ss: list[int]) -> list[int]:
        done = [s for s in dict.fromkeys(ss) if s in self.inflight]
        for s in done:
            del self.inflight[s]
            self.acked.add(s)
        return done

    def nack(self, ss: list[int]) -> list[int]:
        done = [s for s in dict.fromkeys(ss) if s in self.inflight]
        for s in done:
            del self.inflight[s]
        return done

    def modify(self, ss: list[int], vis: int, now: int) -> list[int]:
        if vis <= 0:
            return self.nack(ss)
        self.expire(now)
        done = [s for s in dict.fromkeys(ss) if s in self.inflight]
        for s in done:
            self.inflight[s] = now + vis
        return done


@settings(max_examples=100, stateful_step_count=50, deadline=None)
class QueueMachine(RuleBasedStateMachine):
    """Random sends, receives, acks, nacks, deadline changes, time, flushes,
    reopens and crash-reopens (with journal rolls at a tiny threshold) agree
    with ``QueueModel`` step by step."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="queue-"))
        self.now = T0
        self.model = QueueModel(max_deliveries=3)
        self.dead: list[tuple[int, int]] = []
        self.q = self._open()

    def _open(self) -> QueueChannel:
        return QueueChannel.open(
            self.tmp, self.now, max_deliveries=3,
            dead_letter=lambda m: self.dead.append((m.sequence, m.delivery_count)),
            state_roll_min_entries=6)

    def _pick(self, data: st.DataObject) -> list[int]:
        hi = max(self.model.next, 2)
        return data.draw(st.lists(st.integers(0, hi), max_size=6))

    @rule(n=st.integers(1, 5))
    def send(self, n: int) -> None:
        got = self.q.send(msgs(*[b"v%d" % i for i in range(n)]), self.now)
        assert got == self.model.send(n)

    @rule(n=st.integers(0, 6), vis=st.integers(0, 300))
    def receive(self, n: int, vis: int) -> None:
        got = self.q.receive(n, vis, self.now)
        assert [(m.sequence, m.delivery_count, m.deadline_ms) for m in got] == \
            self.model.receive(n, vis, self.now)
        assert all(m.record.value is not None and m.record.offset + 1 == m.sequence for m in got)

    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        ss = self._pick(data)
        assert self.q.ack(ss) == self.model.ack(ss)

    @rule(data=st.data())
    def nack(self, data: st.DataObject) -> None:
        ss = self._pick(data)
        assert self.q.nack(ss, self.now) == self.model.nack(ss)

    @rule(data=st.data(), vis=st.integers(0, 300))
    def modify(self, data: st.DataObject, vis: int) -> None:
        ss = self._pick(data)
        assert self.q.modify_deadline(ss, vis, self.now) == self.model.modify(ss, vis, self.now)

    @rule(dt=st.integers(0, 200))
    def advance(self, dt: int) -> None:
        self.now += dt  # overdue deliveries stay in flight until something expires them

    @rule()
    def expire(self) -> None:
        assert self.q.expire(self.now) == self.model.expire(self.now)

    @rule()
    def flush(self) -> None:
        flush(self.q)

    @rule()
    def reopen(self) -> None:
        self.q.close()
        self.q = self._open()
        self.model.expire(self.now)  # open expires overdue deliveries

    @rule()
    def crash_after_flush(self) -> None:
        flush(self.q)
        abandoned, self.q = self.q, self._open()
        abandoned.close()  # only releases fds: everything was flushed before the "crash"
        self.model.expire(self.now)

    @invariant()
    def agrees(self) -> None:
        m = self.model
        assert self.dead == m.dead
        assert self.q.inflight_count == len(m.inflight)
        assert self.q.pending_count == m.next - 1 - len(m.acked)
        assert self.q.next_sequence == m.next
        for s in range(1, m.next):
            assert self.q.is_acked(s) == (s in m.acked)
            assert self.q.delivery_count(s) == (0 if s in m.acked else m.counts.get(s, 0))

    def teardown(self) -> None:
        self.q.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


TestQueueMachine = QueueMachine.TestCase
