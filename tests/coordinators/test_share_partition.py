"""A share-partition's in-flight window: acquiring, acknowledging, releasing, lock expiry, the
delivery limit, the start offset moving over finished records, and what survives a restart."""
from __future__ import annotations

import pytest

from kmqkafka.coordinators.share_partition import (
    ACK_ACCEPT, ACK_GAP, ACK_REJECT, ACK_RELEASE, ACK_RENEW, ACKNOWLEDGED, ACQUIRED, ARCHIVED,
    AVAILABLE, AckError, SharePartition,
)


def test_new_records_are_acquired_once_and_accepting_moves_the_start() -> None:
    sp = SharePartition(10)
    assert sp.acquire(10, 14, "a", 1000) == [(10, 14, 1)]
    assert sp.next == 15
    assert sp.acquire(10, 14, "b", 1000) == []  # already locked by a
    sp.acknowledge("a", 10, 12, [ACK_ACCEPT])
    assert sp.start == 13
    assert sp.records[13].state == ACQUIRED


def test_release_makes_a_record_available_again_with_its_count() -> None:
    sp = SharePartition(0)
    sp.acquire(0, 2, "a", 1000)
    sp.acknowledge("a", 0, 2, [ACK_ACCEPT, ACK_RELEASE, ACK_ACCEPT])
    assert sp.start == 1 and sp.available_runs() == [(1, 1)]
    assert sp.acquire(0, 2, "b", 2000) == [(1, 1, 2)]  # a redelivery: next stays 3
    assert sp.next == 3


def test_reject_and_gap_archive() -> None:
    sp = SharePartition(0)
    sp.acquire(0, 3, "a", 1000)
    sp.acknowledge("a", 0, 1, [ACK_REJECT])
    sp.acknowledge("a", 2, 3, [ACK_GAP])
    assert sp.start == 4 and not sp.records


def test_acknowledging_what_the_member_does_not_hold_is_refused_whole() -> None:
    sp = SharePartition(0)
    sp.acquire(0, 3, "a", 1000)
    with pytest.raises(AckError) as e:
        sp.acknowledge("b", 0, 0, [ACK_ACCEPT])
    assert not e.value.invalid_request
    with pytest.raises(AckError):
        sp.acknowledge("a", 2, 5, [ACK_ACCEPT])  # 4 and 5 were never handed out
    assert all(sp.records[o].state == ACQUIRED for o in range(4))  # nothing changed
    with pytest.raises(AckError) as e:
        sp.acknowledge("a", 0, 3, [ACK_ACCEPT, ACK_ACCEPT])  # neither 1 nor 4 types
    assert e.value.invalid_request
    with pytest.raises(AckError) as e:
        sp.acknowledge("a", 0, 0, [7])
    assert e.value.invalid_request


def test_locks_run_out_and_renew_extends_them() -> None:
    sp = SharePartition(0)
    sp.acquire(0, 1, "a", 1000)
    sp.acknowledge("a", 1, 1, [ACK_RENEW], now_ms=900, lock_ms=500)
    assert sp.next_deadline() == 1000
    assert sp.expire(999) is False
    assert sp.expire(1000) is True
    assert sp.records[0].state == AVAILABLE and sp.records[1].state == ACQUIRED
    assert sp.next_deadline() == 1400


def test_the_delivery_limit_archives_a_record_released_too_often() -> None:
    sp = SharePartition(0, delivery_limit=3)
    for n in range(1, 4):
        assert sp.acquire(0, 0, "a", 1000) == [(0, 0, n)]
        sp.release_member("a")
    assert sp.start == 1 and not sp.records  # archived after the third delivery


def test_a_member_leaving_releases_only_its_own_records() -> None:
    sp = SharePartition(0)
    sp.acquire(0, 1, "a", 1000)
    sp.acquire(2, 3, "b", 1000)
    assert sp.release_member("a") is True
    assert sp.available_runs() == [(0, 1)]
    assert sp.acquired_by("b") == [2, 3]
    assert sp.release_member("a") is False


def test_the_window_is_bounded() -> None:
    sp = SharePartition(0, max_in_flight=10)
    sp.acquire(0, 7, "a", 1000)
    assert sp.room() == 2
    sp.acknowledge("a", 0, 4, [ACK_ACCEPT])
    assert sp.room() == 7


def test_gaps_and_log_truncation() -> None:
    sp = SharePartition(0)
    sp.archive_new(0, 2)  # offsets 0-2 hold nothing to deliver (e.g. a marker)
    assert sp.start == 3 and sp.next == 3
    sp.acquire(3, 6, "a", 1000)
    sp.release_member("a")
    sp.archive_gap(3, 4)  # compacted away meanwhile
    assert sp.start == 5
    sp.skip_to(6)  # DeleteRecords
    assert sp.start == 6 and sorted(sp.records) == [6]


def test_encode_keeps_finished_and_released_records_and_frees_locks() -> None:
    sp = SharePartition(100)
    sp.acquire(100, 109, "a", 1000)
    sp.acknowledge("a", 101, 101, [ACK_ACCEPT])
    sp.acknowledge("a", 102, 102, [ACK_RELEASE])
    sp.acknowledge("a", 105, 106, [ACK_REJECT])
    back = SharePartition.decode(sp.encode())
    assert (back.start, back.next) == (100, 110)
    states = {o: (r.state, r.count) for o, r in back.records.items()}
    assert states[100] == (AVAILABLE, 1)  # held by a when saved: free again, count kept
    assert states[101] == (ACKNOWLEDGED, 1)
    assert states[102] == (AVAILABLE, 1)
    assert states[105] == states[106] == (ARCHIVED, 1)
    assert back.acquire(100, 109, "b", 5000) == [(100, 100, 2), (102, 104, 2), (107, 109, 2)]
