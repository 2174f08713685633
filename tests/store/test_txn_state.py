"""A partition's transactions: open ones hold the last stable offset back, ABORT markers record
the ranges read_committed readers skip, markers fence older epochs, and a reopened log rebuilds
exactly the state it had (only logs that ever held a transactional batch pay for the scan)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kmqkafka import records
from kmqkafka.store.config import LogConfig
from kmqkafka.store.errors import InvalidProducerEpoch
from kmqkafka.store.log import TRANSACTIONAL_MARK, ChannelLog
from kmqkafka.store.txn_state import ABORT, COMMIT, AbortedTxn, PartitionTxns

from . import all_records, flush


def test_open_transactions_hold_the_stable_end_at_their_first_record() -> None:
    t = PartitionTxns()
    assert t.stable_end(10) == 10
    t.on_data(7, 4)
    t.on_data(7, 6)  # a later batch of the same transaction
    t.on_data(8, 5)
    assert t.first_unstable() == 4 and t.stable_end(10) == 4
    t.on_marker(7, 0, COMMIT, 9)
    assert t.stable_end(10) == 5
    t.on_marker(8, 0, ABORT, 11)
    assert t.stable_end(12) == 12
    assert t.aborted == [AbortedTxn(8, 5, 11)]


def test_aborted_ranges_are_those_a_read_may_meet() -> None:
    t = PartitionTxns()
    for pid, first, marker in ((1, 1, 3), (2, 4, 6), (3, 7, 9)):
        t.on_data(pid, first)
        t.on_marker(pid, 0, ABORT, marker)
    assert [a.producer_id for a in t.aborted_between(1, 100)] == [1, 2, 3]
    assert [a.producer_id for a in t.aborted_between(4, 100)] == [2, 3]
    assert [a.producer_id for a in t.aborted_between(4, 7)] == [2]  # 3 starts at 7
    assert t.aborted_between(10, 100) == []
    t.forget_below(7)
    assert [a.producer_id for a in t.aborted] == [3]


def test_a_marker_without_records_here_records_no_range_but_still_fences() -> None:
    t = PartitionTxns()
    t.on_marker(5, 3, ABORT, 1)
    assert t.aborted == [] and t.first_unstable() is None
    with pytest.raises(InvalidProducerEpoch):
        t.check(5, 2)
    t.check(5, 3)
    t.check(6, 0)  # another producer is unaffected


def txn_batch(pid: int, epoch: int, seq: int, *values: bytes) -> bytes:
    return records.build_batch([records.NewRecord(value=v, timestamp=1_000) for v in values],
                               now_ms=1_000, attributes=records.TRANSACTIONAL_FLAG,
                               producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def marker(pid: int, epoch: int, commit: bool) -> bytes:
    return records.build_control_batch(commit=commit, producer_id=pid, producer_epoch=epoch,
                                       now_ms=1_000)


def open_log(path: Path) -> ChannelLog:
    return ChannelLog.open(path, LogConfig(), 0, producer_window=1 << 18)


def state(log: ChannelLog) -> tuple:
    t = log.txns
    assert t is not None
    return dict(t.open), list(t.aborted), dict(t.fences)


def test_a_reopened_log_rebuilds_its_transactions(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    plain = records.build_batch([records.NewRecord(value=b"p", timestamp=1)], now_ms=1)
    log.append(plain, 0)
    assert not (tmp_path / TRANSACTIONAL_MARK).exists()
    log.append(txn_batch(1, 0, 0, b"a", b"b"), 0)  # Sequences 2-3
    assert (tmp_path / TRANSACTIONAL_MARK).exists()
    log.append(txn_batch(2, 0, 0, b"c"), 0)  # 4
    log.append(marker(1, 0, commit=False), 0)  # 5: aborts 2-3
    log.append(txn_batch(1, 0, 2, b"d"), 0)  # 6: a new transaction of producer 1
    log.append(marker(2, 1, commit=True), 0)  # 7: commits 4, fences epoch 0 of producer 2
    log.roll()  # the rebuild must cross segments
    log.append(txn_batch(3, 0, 0, b"e"), 0)  # 8
    flush(log)
    assert log.stable_end(log.durable_sequence) == 6
    with pytest.raises(InvalidProducerEpoch):
        log.append(txn_batch(2, 0, 1, b"zombie"), 0)
    before = state(log)
    assert before == ({1: 6, 3: 8}, [AbortedTxn(1, 2, 5)], {1: 0, 2: 1})
    log.close()
    again = open_log(tmp_path)
    assert state(again) == before
    assert again.stable_end(again.durable_sequence) == 6
    with pytest.raises(InvalidProducerEpoch):
        again.append(txn_batch(2, 0, 1, b"zombie"), 0)
    again.close()


def test_only_a_log_marked_transactional_is_scanned_at_open(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(txn_batch(1, 0, 0, b"a"), 0)
    flush(log)
    log.close()
    (tmp_path / TRANSACTIONAL_MARK).unlink()  # as if the log had never held one
    again = open_log(tmp_path)
    assert state(again) == ({}, [], {})
    again.close()
    (tmp_path / TRANSACTIONAL_MARK).touch()
    marked = open_log(tmp_path)
    assert state(marked) == ({1: 1}, [], {})
    marked.close()


def test_compaction_stops_at_an_open_transaction(tmp_path: Path) -> None:
    """Kafka's cleaner never passes the last stable offset: an open transaction's record must
    not supersede (and so remove) the committed value of its key."""
    log = ChannelLog.open(tmp_path, LogConfig(cleanup_policy="compact",
                                              min_cleanable_dirty_ratio=0.0),
                          0, producer_window=1 << 18)
    keyed = records.build_batch([records.NewRecord(key=b"k", value=b"committed",
                                                   timestamp=1_000)], now_ms=1_000)
    log.append(keyed, 0)
    log.roll()
    pending = records.build_batch([records.NewRecord(key=b"k", value=b"pending",
                                                     timestamp=1_000)], now_ms=1_000,
                                  attributes=records.TRANSACTIONAL_FLAG, producer_id=9,
                                  producer_epoch=0, base_sequence=0)
    log.append(pending, 0)
    log.roll()
    log.append(keyed, 0)  # the active segment
    flush(log)
    plan = log.compaction_plan(10_000)
    assert plan is not None and [src.base for src in plan.sources] == [1]
    log.install_compaction(plan.run())
    assert [r.value for r in all_records(log)][:2] == [b"committed", b"pending"]
    log.append(marker(9, 0, commit=False), 0)
    log.roll()
    flush(log)
    plan = log.compaction_plan(10_000)
    # With the transaction ended, the segments up to the active one may clean.
    assert plan is not None and [src.base for src in plan.sources] == [1, 2, 3]
    log.abandon_compaction()
    plan.close() if hasattr(plan, "close") else None
    log.close()


def test_compaction_drops_aborted_records_and_keeps_the_committed_value(tmp_path: Path) -> None:
    """As Kafka's cleaner: an aborted record neither supersedes its key's committed value nor
    survives a clean (its marker stays)."""
    log = ChannelLog.open(tmp_path, LogConfig(cleanup_policy="compact",
                                              min_cleanable_dirty_ratio=0.0),
                          0, producer_window=1 << 18)

    def keyed(value: bytes, **txn: Any) -> bytes:
        return records.build_batch([records.NewRecord(key=b"k", value=value, timestamp=1_000)],
                                   now_ms=1_000, **txn)

    log.append(keyed(b"committed"), 0)  # 1
    log.append(keyed(b"aborted", attributes=records.TRANSACTIONAL_FLAG, producer_id=9,
                     producer_epoch=0, base_sequence=0), 0)  # 2
    log.append(marker(9, 0, commit=False), 0)  # 3
    log.roll()
    log.append(keyed(b"tail"), 0)  # the active segment: supersedes nothing yet
    flush(log)
    plan = log.compaction_plan(10_000)
    assert plan is not None
    log.install_compaction(plan.run())
    rows = [(r.offset, r.value) for r in all_records(log)]
    assert rows[0] == (0, b"committed") and (1, b"aborted") not in rows
    assert log.stable_end(log.durable_sequence) == log.durable_sequence
    log.close()
