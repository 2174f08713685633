"""Idempotent-producer checks: the pure rules (Kafka's ProducerStateManager), the channel log
that applies them, their rebuild from disk, and the window that keeps every node alike."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kmqkafka import records
from kmqkafka.store import commands as c
from kmqkafka.store.config import LogConfig
from kmqkafka.store.errors import InvalidProducerEpoch, OutOfOrderSequence, StoreError
from kmqkafka.store.log import ChannelLog
from kmqkafka.store.machine import StateMachine
from kmqkafka.store.producer_state import (
    MAX_SEQ, NUM_BATCHES_TO_RETAIN, BatchMetadata, ProducerState, in_sequence, last_seq_of,
)
from kmqkafka.store.segment import HEADER_CHUNK, iter_file_batches, iter_producer_headers

from . import all_records, flush

PID = 42
SMALL = LogConfig(segment_bytes=2_000, index_interval_bytes=200)


def meta(base_seq: int, n: int, first: int, ts: int = 0) -> BatchMetadata:
    return BatchMetadata(base_seq, last_seq_of(base_seq, n - 1), first, first + n - 1, ts)


def idem(base_seq: int, n: int = 1, *, pid: int = PID, epoch: int = 0, ts: int = 1_000,
         value: bytes = b"v") -> bytes:
    """A batch of ``n`` records as an idempotent producer sends it."""
    return records.build_batch(
        [records.NewRecord(value=value + b"%d" % i, key=b"k%d" % i, timestamp=ts)
         for i in range(n)],
        now_ms=ts, producer_id=pid, producer_epoch=epoch, base_sequence=base_seq)


# --- the rules --------------------------------------------------------------------------------


def test_sequence_arithmetic_wraps_at_int32_max() -> None:
    assert last_seq_of(10, 4) == 14
    assert last_seq_of(MAX_SEQ, 0) == MAX_SEQ
    assert last_seq_of(MAX_SEQ, 1) == 0
    assert last_seq_of(MAX_SEQ - 1, 3) == 1
    assert in_sequence(4, 5) and in_sequence(MAX_SEQ, 0)
    assert not in_sequence(4, 6) and not in_sequence(4, 4) and not in_sequence(MAX_SEQ, 1)


def test_an_unknown_producer_may_start_at_any_sequence() -> None:
    state = ProducerState()
    assert state.check(PID, 3, 1234, 9, floor=1) is None
    assert state.check(PID, 0, 0, 0, floor=1) is None


def test_same_epoch_must_continue_right_after_the_last_sequence() -> None:
    state = ProducerState()
    state.record(PID, 0, meta(0, 3, first=1), floor=1)  # seqs 0..2
    assert state.check(PID, 0, 3, 1, floor=1) is None
    with pytest.raises(OutOfOrderSequence, match=r"5 \(incoming seq. number\), 2 \(current end"):
        state.check(PID, 0, 5, 0, floor=1)  # a gap
    with pytest.raises(OutOfOrderSequence):
        state.check(PID, 0, 1, 1, floor=1)  # overlaps, but is no batch that was stored
    assert isinstance(OutOfOrderSequence("x"), StoreError)


def test_sequence_wraps_to_zero_after_int32_max() -> None:
    state = ProducerState()
    state.record(PID, 0, meta(MAX_SEQ - 1, 2, first=1), floor=1)
    assert state.check(PID, 0, 0, 0, floor=1) is None
    with pytest.raises(OutOfOrderSequence):
        state.check(PID, 0, 1, 0, floor=1)


def test_a_retry_of_one_of_the_last_five_batches_is_a_duplicate() -> None:
    state = ProducerState()
    for i in range(7):  # seqs 2i..2i+1 at Sequences 10i+1..10i+2
        state.record(PID, 0, meta(2 * i, 2, first=10 * i + 1, ts=100 + i), floor=1)
    for i in range(7 - NUM_BATCHES_TO_RETAIN, 7):
        assert state.check(PID, 0, 2 * i, 1, floor=1) == meta(2 * i, 2, 10 * i + 1, 100 + i)
    with pytest.raises(OutOfOrderSequence):
        state.check(PID, 0, 2, 1, floor=1)  # the sixth-oldest is forgotten, as in Kafka
    with pytest.raises(OutOfOrderSequence):
        state.check(PID, 0, 12, 0, floor=1)  # same first seq, other last seq: not a duplicate
    assert state.find(PID, 61) == meta(12, 2, 61, 106)


def test_an_older_epoch_is_fenced_even_with_a_known_sequence() -> None:
    state = ProducerState()
    state.record(PID, 2, meta(0, 1, first=1), floor=1)
    with pytest.raises(InvalidProducerEpoch, match="epoch 2"):
        state.check(PID, 1, 1, 0, floor=1)
    with pytest.raises(InvalidProducerEpoch):
        state.check(PID, 1, 0, 0, floor=1)


def test_a_new_epoch_starts_at_sequence_zero_and_forgets_the_old_batches() -> None:
    state = ProducerState()
    state.record(PID, 0, meta(0, 5, first=1), floor=1)
    with pytest.raises(OutOfOrderSequence, match="new epoch"):
        state.check(PID, 1, 5, 0, floor=1)
    assert state.check(PID, 1, 0, 0, floor=1) is None
    state.record(PID, 1, meta(0, 1, first=6), floor=1)
    entry = state.entry(PID, floor=1)
    assert entry is not None and entry.epoch == 1 and list(entry.batches) == [meta(0, 1, 6)]
    with pytest.raises(InvalidProducerEpoch):
        state.check(PID, 0, 0, 4, floor=1)  # the old epoch's batch is no duplicate any more


def test_a_producer_whose_batches_left_the_window_is_unknown() -> None:
    state = ProducerState()
    state.record(PID, 5, meta(0, 3, first=1), floor=1)  # Sequences 1..3
    assert state.entry(PID, floor=3) is not None
    assert state.entry(PID, floor=4) is None
    assert state.check(PID, 0, 77, 0, floor=4) is None  # any epoch, any sequence
    assert state.check(PID, 5, 0, 2, floor=4) is None  # and no duplicate either
    state.record(PID, 0, meta(77, 1, first=10), floor=4)
    entry = state.entry(PID, floor=4)
    assert entry is not None and entry.epoch == 0 and list(entry.batches) == [meta(77, 1, 10)]


def test_duplicates_are_only_found_among_batches_inside_the_window() -> None:
    state = ProducerState()
    state.record(PID, 0, meta(0, 1, first=1), floor=1)
    state.record(PID, 0, meta(1, 1, first=2), floor=1)
    assert state.check(PID, 0, 0, 0, floor=1) == meta(0, 1, 1)
    with pytest.raises(OutOfOrderSequence):
        state.check(PID, 0, 0, 0, floor=2)


def test_forgotten_producers_are_pruned() -> None:
    state = ProducerState()
    for pid in range(3000):
        state.record(pid, 0, meta(0, 1, first=pid + 1), floor=max(1, pid - 10))
    assert len(state) < 2100  # pruned along the way, amortised
    assert state.prune(floor=2990) > 0 and len(state) == 11  # pids 2989..2999


# --- the channel log ----------------------------------------------------------------------------


def open_log(path: Path, window: int = 1000, config: LogConfig = SMALL) -> ChannelLog:
    return ChannelLog.open(path, config, 0, producer_window=window)


def reopen_log(log: ChannelLog) -> ChannelLog:
    window = log._producer_window
    log.close()
    return ChannelLog.open(log.directory, log.config, 0, producer_window=window)


def test_a_duplicate_is_not_stored_and_answers_with_the_original_sequences(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    assert log.append(idem(0, 3), 0) == (1, 3)
    assert log.append(idem(3, 2), 0) == (4, 5)
    size = log.size_bytes
    assert log.append(idem(0, 3), 0) == (1, 3)  # first < next_sequence: a duplicate
    assert log.append(idem(3, 2), 0) == (4, 5)
    assert (log.next_sequence, log.size_bytes) == (6, size)
    flush(log)
    assert [r.offset + 1 for r in all_records(log)] == [1, 2, 3, 4, 5]
    log.close()


def test_refused_batches_store_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(idem(0, epoch=3), 0)
    size = log.size_bytes
    with pytest.raises(OutOfOrderSequence):
        log.append(idem(7, epoch=3), 0)
    with pytest.raises(OutOfOrderSequence):
        log.append(idem(1, epoch=4), 0)
    with pytest.raises(InvalidProducerEpoch):
        log.append(idem(1, epoch=2), 0)
    assert (log.next_sequence, log.size_bytes) == (2, size)
    assert log.append(idem(1, epoch=3), 0) == (2, 2)
    log.close()


def test_batches_without_a_producer_id_or_without_a_window_are_unchecked(tmp_path: Path) -> None:
    log = open_log(tmp_path / "a")
    plain = records.build_batch([records.NewRecord(value=b"x")], now_ms=0)
    assert [log.append(plain, 0) for _ in range(2)] == [(1, 1), (2, 2)]
    log.close()
    unchecked = ChannelLog.open(tmp_path / "b", SMALL, 0)  # queues and coordinator logs
    assert unchecked.producers is None
    assert [unchecked.append(idem(5), 0) for _ in range(2)] == [(1, 1), (2, 2)]
    unchecked.close()


def test_control_batches_are_not_producer_batches(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(idem(0), 0)
    marker = records.build_control_batch(commit=True, producer_id=PID, producer_epoch=0, now_ms=0)
    assert [log.append(marker, 0) for _ in range(2)] == [(2, 2), (3, 3)]
    assert log.append(idem(0), 0) == (1, 1)  # still a duplicate: the markers changed nothing
    log.close()


def test_a_retry_after_a_restart_is_still_recognised(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for i in range(40):  # several segments
        log.append(idem(2 * i, 2, value=b"p" * 60), 0)
    assert log.segment_count > 3
    log = reopen_log(log)
    assert log.append(idem(76, 2, value=b"p" * 60), 0) == (77, 78)
    assert log.append(idem(70, 2, value=b"p" * 60), 0) == (71, 72)
    with pytest.raises(OutOfOrderSequence):
        log.append(idem(81), 0)
    with pytest.raises(InvalidProducerEpoch):
        log.append(idem(0, epoch=-1), 0)
    assert log.append(idem(0, epoch=1), 0) == (81, 81)
    log = reopen_log(log)
    assert log.append(idem(0, epoch=1), 0) == (81, 81)
    log.close()


def test_the_window_bounds_what_a_restart_reads_and_what_is_remembered(tmp_path: Path) -> None:
    log = open_log(tmp_path, window=10)
    log.append(idem(0, pid=1), 0)  # Sequence 1
    log.append(idem(0, 3, pid=2), 0)  # 2..4
    for i in range(9):
        log.append(idem(i, pid=3), 0)  # 5..13
    # floor = 14 - 10 = 4: producer 1 is forgotten, producer 2 (last Sequence 4) is not.
    assert log.producer_floor == 4
    for rebuilt in (False, True):  # in memory, then rebuilt from disk
        if rebuilt:
            log = reopen_log(log)
        assert log.producers.entry(1, log.producer_floor) is None
        assert log.producers.entry(2, log.producer_floor) is not None
    assert log.append(idem(0, 3, pid=2), 0) == (2, 4)
    with pytest.raises(OutOfOrderSequence):
        log.append(idem(5, pid=2), 0)
    assert log.append(idem(999, pid=1), 0) == (14, 14)  # unknown: any sequence is accepted
    # That append moved the floor to 5: producer 2 is forgotten now, on disk and in memory.
    assert log.append(idem(5, pid=2), 0) == (15, 15)
    log.close()


def test_delete_records_forgets_producers_whose_batches_are_gone(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(idem(0, 2, pid=1), 0)
    log.append(idem(0, 2, pid=2), 0)
    log.truncate_prefix(3)
    assert log.append(idem(50, pid=1), 0) == (5, 5)  # unknown now
    assert log.append(idem(0, 2, pid=2), 0) == (3, 4)  # still a duplicate
    log = reopen_log(log)
    assert log.append(idem(50, pid=1), 0) == (5, 5)
    log.close()


def test_compaction_cleans_idempotent_batches_and_keeps_their_headers_in_the_window(
        tmp_path: Path) -> None:
    """Superseded records of an idempotent producer go like any others (kafka-python and
    Java producers are idempotent by default); inside the window a batch left without
    records stays as an empty batch, so the producer state read back from the headers, and
    retries of those batches, are what they were."""
    config = SMALL.with_changes(cleanup_policy="compact")
    log = open_log(tmp_path, window=15, config=config)
    for i in range(12):  # same key everywhere: only the last record would survive
        log.append(idem(i, value=b"p" * 100), 0)
        log.append(records.build_batch([records.NewRecord(value=b"q" * 100, key=b"k0")],
                                       now_ms=0), 0)
    flush(log)
    floor = log.producer_floor
    active_base = log._segments[-1].base
    assert any(floor <= s < active_base for s in range(1, 25, 2))  # some in closed segments
    plan = log.compaction_plan(0)
    assert plan is not None and plan.producer_floor == floor
    log.install_compaction(plan.run())
    flush(log)
    batches = [records.read_header(b) for b in log.read(1, 1 << 30).batches]
    kept = [(r.offset + 1, h.producer_id) for h, b in zip(
        batches, log.read(1, 1 << 30).batches) for r in records.iter_records(b)]
    assert all(seq >= active_base for seq, pid in kept if pid == PID)  # cleaned
    assert len(kept) < 24
    mine = [h for h in batches if h.producer_id == PID]
    assert [h.base_offset + 1 for h in mine] == [s for s in range(1, 25, 2) if s >= floor]
    assert all(h.records_count == 0 for h in mine if h.base_offset + 1 < active_base)
    assert all(h.last_offset_delta == 0 and h.base_sequence == (h.base_offset // 2)
               for h in mine)
    before = {pid: list(e.batches) for pid, e in log.producers._entries.items()}
    log = reopen_log(log)
    after = {pid: list(e.batches) for pid, e in log.producers._entries.items()}
    assert after[PID] == [m for m in before[PID] if m.last_sequence >= log.producer_floor]
    newest_cleaned = max(h.base_sequence for h in mine if h.base_offset + 1 < active_base)
    assert newest_cleaned >= 7  # among the producer's last five batches: still a duplicate
    seq = 2 * newest_cleaned + 1
    assert log.append(idem(newest_cleaned, value=b"p" * 100), 0) == (seq, seq)
    log.close()


def test_header_walk_matches_a_full_walk_with_batches_of_every_size(tmp_path: Path) -> None:
    path = tmp_path / "seg.log"
    sizes = [1, 1, 3 * HEADER_CHUNK, 5, HEADER_CHUNK - 40, 2, HEADER_CHUNK * 2, 1, 1]
    with open(path, "wb") as f:
        for i, size in enumerate(sizes):
            f.write(records.build_batch([records.NewRecord(value=b"x" * size)], now_ms=i,
                                        base_offset=i, producer_id=i, producer_epoch=1,
                                        base_sequence=i))
    fd = os.open(path, os.O_RDONLY)
    try:
        total = os.fstat(fd).st_size
        full = [records.read_header(b) for _pos, b in iter_file_batches(fd, total)]
        walked = list(iter_producer_headers(fd, total))
        assert [(w[0], w[5], w[7]) for w in walked] == \
            [(h.base_offset, h.producer_id, h.base_sequence) for h in full]
        assert len(list(iter_producer_headers(fd, total - 1))) == len(sizes) - 1  # cut off
    finally:
        os.close(fd)


# --- every node must decide alike --------------------------------------------------------------

_PIDS = st.integers(0, 3)
_STEP = st.one_of(
    st.tuples(st.just("next"), _PIDS, st.integers(1, 3)),  # a well-behaved producer
    st.tuples(st.just("next"), _PIDS, st.integers(1, 3)),
    st.tuples(st.just("bump"), _PIDS),  # KIP-360: new epoch, sequence 0
    st.tuples(st.just("send"), _PIDS, st.integers(0, 3), st.integers(0, 12), st.integers(1, 3)),
    st.tuples(st.just("retry"), _PIDS, st.integers(0, 6)),
    st.tuples(st.just("retry"), _PIDS, st.integers(0, 6)),
    st.tuples(st.just("trim"), st.integers(0, 8)),
    st.just(("restart",)),
)


def _visible(log: ChannelLog) -> dict:
    floor = log.producer_floor
    out = {}
    for pid, entry in log.producers._entries.items():
        batches = [m for m in entry.batches if m.last_sequence >= floor]
        if batches:
            out[pid] = (entry.epoch, batches)
    return out


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_STEP, min_size=1, max_size=50), st.integers(3, 25))
def test_a_rebuilt_state_decides_exactly_like_the_live_one(steps: list, window: int) -> None:
    """Whatever happened, a node that rebuilds its state from its log (a copy of it here) holds
    what one that applied every batch itself holds, so both answer every next batch alike."""
    with tempfile.TemporaryDirectory() as tmp:
        live_dir, copy_dir = Path(tmp) / "live", Path(tmp) / "copy"
        log = open_log(live_dir, window=window)
        sent: dict[int, list[bytes]] = {}
        producers: dict[int, list[int]] = {}  # pid -> [epoch, next seq], the producer's view
        try:
            for step in steps:
                if step[0] in ("next", "bump"):
                    view = producers.setdefault(step[1], [0, 0])
                    if step[0] == "bump":
                        view[:] = [view[0] + 1, 0]
                    n = step[2] if step[0] == "next" else 1
                    batch = idem(view[1], n, pid=step[1], epoch=view[0])
                elif step[0] == "send":
                    _, pid, epoch, seq, n = step
                    batch = idem(seq, n, pid=pid, epoch=epoch)
                elif step[0] == "retry":
                    _, pid, back = step
                    if not sent.get(pid):
                        continue
                    batch = sent[pid][-1 - min(back, len(sent[pid]) - 1)]
                elif step[0] == "trim":
                    log.truncate_prefix(min(log.log_start + step[1], log.next_sequence))
                    continue
                else:
                    before = _visible(log)
                    log = reopen_log(log)
                    assert _visible(log) == before
                    continue
                flush(log)
                shutil.rmtree(copy_dir, ignore_errors=True)
                shutil.copytree(live_dir, copy_dir)
                twin = open_log(copy_dir, window=window)
                try:
                    assert _visible(twin) == _visible(log)
                    outcomes = []
                    for target in (log, twin):
                        try:
                            outcomes.append(target.append(batch, 0))
                        except StoreError as exc:
                            outcomes.append(type(exc))
                    assert outcomes[0] == outcomes[1]
                    assert _visible(twin) == _visible(log)
                finally:
                    twin.close()
                if isinstance(outcomes[0], tuple):
                    sent.setdefault(step[1], []).append(batch)
                    header = records.read_header(batch)
                    producers[step[1]] = [header.producer_epoch,
                                          last_seq_of(header.base_sequence,
                                                      header.last_offset_delta) + 1]
        finally:
            log.close()


# --- the state machine --------------------------------------------------------------------------


def test_apply_answers_duplicates_and_refusals_on_every_path(tmp_path: Path) -> None:
    machine = StateMachine(tmp_path)
    machine.recover(0)
    machine.apply(1, c.CreateChannel("kafka.t"))
    first = machine.apply(2, c.Append("kafka.t", 0, idem(0, 2, ts=555)))
    assert (first.first_sequence, first.last_sequence, first.duplicate) == (1, 2, False)
    again = machine.apply(3, c.Append("kafka.t", 0, memoryview(idem(0, 2, ts=555))))
    assert (again.first_sequence, again.last_sequence, again.duplicate) == (1, 2, True)
    assert again.max_timestamp == 555
    with pytest.raises(OutOfOrderSequence):
        machine.apply(4, c.Append("kafka.t", 0, idem(9)))
    group = machine.apply_group(5, [c.Append("kafka.t", 0, idem(2)),
                                    c.Append("kafka.t", 0, idem(2)),
                                    c.Append("kafka.t", 0, idem(4))])
    assert group[0].duplicate is False and group[1].duplicate is True
    assert isinstance(group[2], OutOfOrderSequence)
    assert machine.channel("kafka.t").next_sequence == 4
    # A deleted and re-created topic starts with no producers.
    machine.apply(6, c.DeleteChannel("kafka.t"))
    machine.apply(7, c.CreateChannel("kafka.t"))
    assert machine.apply(8, c.Append("kafka.t", 0, idem(9))).first_sequence == 1
    machine.close()
    restarted = StateMachine(tmp_path)
    restarted.recover(0)
    assert restarted.apply(9, c.Append("kafka.t", 0, idem(9))).duplicate is True
    restarted.close()
