"""Retention by age, bytes and message count; DeleteRecords (truncate_prefix)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kmqkafka.store.config import LogConfig
from kmqkafka.store.errors import OffsetOutOfRange
from kmqkafka.store.log import ChannelLog

from . import all_records, flush, make_batch, reopen, with_header

# one 10-record batch per segment: every append after the first rolls
ONE_PER_SEGMENT = LogConfig(segment_bytes=100, retention_ms=None)


def _filled(tmp_path: Path, config: LogConfig, n: int = 5) -> ChannelLog:
    log = ChannelLog.open(tmp_path, config, 0)
    for i in range(n):
        log.append(make_batch(10, ts=1_000 * (i + 1)), 1_000 * (i + 1))
    flush(log)
    assert log.segment_count == n
    return log


def test_retention_by_age_drops_old_closed_segments(tmp_path: Path) -> None:
    log = _filled(tmp_path, ONE_PER_SEGMENT.with_changes(retention_ms=2_500))
    assert log.enforce_retention(5_000) == 2  # newest 1000 and 2000 are older than 2500 ms
    assert log.log_start == 21
    assert [r.offset + 1 for r in all_records(log)][0] == 21
    with pytest.raises(OffsetOutOfRange):
        log.read(20, 100)
    assert log.enforce_retention(5_000) == 0
    log.close()


def test_an_expired_active_segment_is_rolled_and_dropped_as_in_kafka(tmp_path: Path) -> None:
    log = _filled(tmp_path, ONE_PER_SEGMENT.with_changes(retention_ms=1))
    assert log.enforce_retention(10**9) == 5
    assert (log.segment_count, log.log_start, log.next_sequence) == (1, 51, 51)
    assert log.read(51, 100).batches == []
    assert log.enforce_retention(10**9) == 0  # an empty log stays as it is
    assert log.append(make_batch(1, ts=10**9), 10**9) == (51, 51)
    flush(log)
    log = reopen(log)
    assert (log.log_start, log.next_sequence) == (51, 52)
    assert [r.offset + 1 for r in all_records(log)] == [51]
    log.close()


def test_a_young_active_segment_stays(tmp_path: Path) -> None:
    log = ChannelLog.open(tmp_path, LogConfig(retention_ms=1_000), 0)
    log.append(make_batch(10, ts=5_000), 5_000)
    flush(log)
    assert log.enforce_retention(5_900) == 0 and log.log_start == 1
    assert log.enforce_retention(6_001) == 1
    assert (log.log_start, log.next_sequence, log.segment_count) == (11, 11, 1)
    log.close()


def test_retention_by_bytes(tmp_path: Path) -> None:
    size = len(make_batch(10))
    log = _filled(tmp_path, ONE_PER_SEGMENT.with_changes(retention_bytes=3 * size))
    assert log.enforce_retention(0) == 2
    assert log.size_bytes == 3 * size  # not above the limit any more
    log.close()


def test_retention_by_bytes_keeps_at_least_the_limit(tmp_path: Path) -> None:
    """Kafka's rule: a segment goes only if what remains still holds retention.bytes."""
    size = len(make_batch(10))
    log = _filled(tmp_path, ONE_PER_SEGMENT.with_changes(retention_bytes=5 * size // 2))
    assert log.enforce_retention(0) == 2
    assert log.size_bytes == 3 * size  # dropping a third would leave less than the limit
    log.close()


def test_retention_by_bytes_at_the_limit_drops_nothing(tmp_path: Path) -> None:
    size = len(make_batch(10))
    log = _filled(tmp_path, ONE_PER_SEGMENT.with_changes(retention_bytes=5 * size))
    assert log.enforce_retention(0) == 0
    log.close()


def test_retention_by_messages(tmp_path: Path) -> None:
    log = _filled(tmp_path, ONE_PER_SEGMENT.with_changes(retention_messages=25))
    assert log.enforce_retention(0) == 3  # 50 -> 40 -> 30 -> 20 messages
    assert log.log_start == 31
    log.close()


def test_retention_needs_the_delete_policy(tmp_path: Path) -> None:
    log = _filled(tmp_path, ONE_PER_SEGMENT.with_changes(retention_messages=1, cleanup_policy="compact"))
    assert log.enforce_retention(0) == 0
    log.set_config(log.config.with_changes(cleanup_policy="compact,delete"))
    assert log.enforce_retention(0) == 4
    log.close()


def test_log_start_survives_restart(tmp_path: Path) -> None:
    log = _filled(tmp_path, ONE_PER_SEGMENT.with_changes(retention_messages=25))
    log.enforce_retention(0)
    log = reopen(log)
    assert (log.log_start, log.next_sequence) == (31, 51)
    assert [r.offset + 1 for r in all_records(log)] == list(range(31, 51))
    log.close()


def test_truncate_prefix_moves_log_start_inside_a_segment(tmp_path: Path) -> None:
    log = _filled(tmp_path, ONE_PER_SEGMENT)
    assert log.truncate_prefix(25) == 25
    assert log.segment_count == 3  # 1..10 and 11..20 dropped; 21..30 holds 25
    assert log.truncate_prefix(3) == 25  # lower: no change
    with pytest.raises(OffsetOutOfRange):
        log.read(24, 100)
    assert log.read(25, 100).batches  # batch 21..30 comes back whole
    with pytest.raises(OffsetOutOfRange):
        log.truncate_prefix(52)
    log = reopen(log)
    assert log.log_start == 25
    assert log.sequence_for_timestamp(0) == 25
    log.close()


def test_truncate_prefix_to_the_end(tmp_path: Path) -> None:
    log = _filled(tmp_path, ONE_PER_SEGMENT)
    assert log.truncate_prefix(51) == 51
    assert log.segment_count == 1
    assert log.read(51, 100).batches == []
    assert log.max_timestamp() is None
    assert log.append(make_batch(1), 0) == (51, 51)
    log = reopen(log)
    assert log.log_start == 51
    log.close()


def test_segments_without_a_timestamp_are_never_expired_by_age(tmp_path: Path) -> None:
    """A max timestamp of -1 once read as 1970 and deleted such data at the next retention
    run; it cannot be dated (alike on every node), so only size and count rules apply."""
    log = ChannelLog.open(tmp_path, ONE_PER_SEGMENT.with_changes(retention_ms=2_500), 0)
    for i in range(3):
        log.append(with_header(make_batch(10, ts=1_000 * (i + 1)), max_ts=-1),
                   1_000 * (i + 1))  # stored before produce recomputed the field
    flush(log)
    assert log.enforce_retention(10**12) == 0 and log.log_start == 1
    log = reopen(log)  # the rebuilt indexes read the stored headers again
    assert log.enforce_retention(10**12) == 0 and log.log_start == 1
    log.close()
