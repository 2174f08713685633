"""ChannelLog: append, read, group commit, roll, restart and torn-tail recovery."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kmqkafka import records
from kmqkafka.store.config import LogConfig
from kmqkafka.store.errors import OffsetOutOfRange
from kmqkafka.store.log import ChannelLog

from . import all_records, flush, make_batch, reopen, segment_files

SMALL = LogConfig(segment_bytes=2_000, index_interval_bytes=200)


@pytest.fixture
def log(tmp_path: Path):
    log = ChannelLog.open(tmp_path / "ch", SMALL, 0)
    yield log
    log.close()


def test_new_log_starts_at_sequence_one(log: ChannelLog) -> None:
    assert (log.log_start, log.next_sequence, log.durable_sequence, log.size_bytes) == (1, 1, 1, 0)
    assert log.prepare_flush() is None
    assert log.read(1, 100).batches == []


def test_append_assigns_dense_sequences_and_base_offsets(log: ChannelLog) -> None:
    assert log.append(make_batch(3), 0) == (1, 3)
    assert log.append(make_batch(1), 0) == (4, 4)
    flush(log)
    got = log.read(1, 1 << 20)
    assert [records.read_header(b).base_offset for b in got.batches] == [0, 3]
    assert [r.offset + 1 for r in all_records(log)] == [1, 2, 3, 4]


def test_append_stamps_the_leader_epoch_and_keeps_the_crc(log: ChannelLog) -> None:
    """The producer sends partitionLeaderEpoch -1; the stored batch carries the broker's
    epoch (0), as Kafka's log validator stamps it, and still passes its CRC check."""
    sent = bytearray(make_batch(2))
    records.set_partition_leader_epoch(sent, -1)
    log.append(sent, 0)
    flush(log)
    stored = bytes(log.read(1, 1 << 20).batches[0])
    assert records.read_header(stored).partition_leader_epoch == 0
    records.validate_batch(stored)
    assert stored[16:] == bytes(sent)[16:]


def test_bad_batches_are_refused_and_nothing_is_stored(log: ChannelLog) -> None:
    good = make_batch(2)
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF
    for bad in (bytes(corrupt), good[:-1], good + good, b""):
        with pytest.raises(records.InvalidBatch):
            log.append(bad, 0)
    assert (log.next_sequence, log.size_bytes) == (1, 0)


def test_readers_see_only_flushed_data(log: ChannelLog) -> None:
    log.append(make_batch(2), 0)
    assert log.read(1, 1 << 20).batches == []
    assert len(log.read(1, 1 << 20, upto=log.next_sequence).batches) == 1
    token = log.prepare_flush()
    assert token is not None and token.covers == 3
    log.append(make_batch(2), 0)  # after prepare: not covered by this token
    token.run()
    log.complete_flush(token)
    assert log.durable_sequence == 3
    result = log.read(1, 1 << 20)
    assert (len(result.batches), result.high_watermark) == (1, 3)


def test_overlapping_tokens_advance_durable_in_order(log: ChannelLog) -> None:
    log.append(make_batch(1), 0)
    first = log.prepare_flush()
    log.append(make_batch(1), 0)
    second = log.prepare_flush()
    second.run()
    log.complete_flush(second)
    assert log.durable_sequence == 1  # the first token has not finished
    first.run()
    log.complete_flush(first)
    assert log.durable_sequence == 3


def test_read_bounds(log: ChannelLog) -> None:
    for _ in range(5):
        log.append(make_batch(2), 0)
    flush(log)
    with pytest.raises(OffsetOutOfRange):
        log.read(0, 100)
    with pytest.raises(OffsetOutOfRange):
        log.read(12, 100)
    assert log.read(11, 100).batches == []  # == next_sequence
    assert log.read(5, 1 << 20, upto=5).batches == []
    # upto is exclusive and excludes a batch that straddles it
    got = log.read(1, 1 << 20, upto=6)
    assert [records.read_header(b).base_offset for b in got.batches] == [0, 2]
    # a read may start inside a batch: the whole batch comes back
    assert records.read_header(log.read(4, 1).batches[0]).base_offset == 2


def test_max_bytes_and_min_one(log: ChannelLog) -> None:
    for _ in range(4):
        log.append(make_batch(5), 0)
    flush(log)
    size = len(make_batch(5))
    assert log.read(1, size - 1).nbytes == size  # min_one
    assert log.read(1, size - 1, min_one=False).batches == []
    assert len(log.read(1, 2 * size + 1).batches) == 2
    assert len(log.read(1, 2 * size).batches) == 2


def test_roll_by_size_and_age(tmp_path: Path) -> None:
    log = ChannelLog.open(tmp_path, LogConfig(segment_bytes=1_000, segment_ms=100), 0)
    big = make_batch(1, value=b"x" * 600, ts=0)
    log.append(big, 0)
    log.append(big, 0)  # would exceed 1000: rolls first
    assert log.segment_count == 2
    log.append(make_batch(1, ts=50), 50)  # 600 + small fits
    assert log.segment_count == 2
    log.append(make_batch(1, ts=200), 200)  # the segment's first batch is from 0: too old
    assert log.segment_count == 3
    log.append(make_batch(1, ts=-1), 500)  # no timestamp: the broker's clock since the first
    assert log.segment_count == 4          # append (at 200) decides
    huge = make_batch(1, value=b"y" * 5_000)
    log.append(huge, 200)  # bigger than a segment: goes alone in a fresh segment
    assert log.segment_count == 5
    flush(log)
    assert [r.offset + 1 for r in all_records(log)] == [1, 2, 3, 4, 5, 6]
    log.close()


def test_rolled_segment_gets_durable_indexes_at_the_next_flush(log: ChannelLog) -> None:
    for _ in range(40):
        log.append(make_batch(2, value=b"z" * 50), 0)
    assert log.segment_count > 1
    first = log.directory / "00000000000000000001.index"
    assert not first.exists() and first.with_name(first.name + ".part").exists()
    flush(log)
    assert first.exists() and first.stat().st_size > 0
    assert not list(log.directory.glob("*.part"))
    assert not log._retired_fds and not log._fd_refs  # rolled write fds were closed


def test_restart_keeps_everything(tmp_path: Path) -> None:
    log = ChannelLog.open(tmp_path, SMALL, 0)
    for i in range(50):
        log.append(make_batch(1 + i % 4, ts=i), i)
    flush(log)
    before = [(r.offset, r.value) for r in all_records(log)]
    log = reopen(log)
    assert log.next_sequence == log.durable_sequence == before[-1][0] + 2
    assert [(r.offset, r.value) for r in all_records(log)] == before
    assert log.append(make_batch(1), 0)[0] == before[-1][0] + 2
    log.close()


@pytest.mark.parametrize("damage", ["missing", "garbage", "short"])
def test_bad_closed_indexes_are_rebuilt(tmp_path: Path, damage: str) -> None:
    log = ChannelLog.open(tmp_path, SMALL, 0)
    for i in range(60):
        log.append(make_batch(2, ts=i), i)
    flush(log)
    before = [r.offset for r in all_records(log)]
    log.close()
    index = tmp_path / "00000000000000000001.index"
    if damage == "missing":
        index.unlink()
    elif damage == "garbage":
        index.write_bytes(b"\x00\x00\x00\x00\x00\x00\xff\xff" * 3)
    else:
        index.write_bytes(index.read_bytes()[:-3])
    log = ChannelLog.open(tmp_path, SMALL, 0)
    assert [r.offset for r in all_records(log)] == before
    for seq in range(1, log.next_sequence):
        first = records.read_header(log.read(seq, 1).batches[0])
        assert first.base_offset + 1 <= seq <= first.last_offset + 1
    log.close()


def test_torn_tail_is_cut_at_the_last_whole_batch(tmp_path: Path) -> None:
    log = ChannelLog.open(tmp_path, LogConfig(), 0)
    for _ in range(3):
        log.append(make_batch(2), 0)
    flush(log)
    log.close()
    path = segment_files(tmp_path)[-1]
    with open(path, "ab") as f:
        f.write(make_batch(2)[:30])
    log = ChannelLog.open(tmp_path, LogConfig(), 0)
    assert log.truncated_bytes == 30
    assert log.next_sequence == 7
    assert log.append(make_batch(1), 0) == (7, 7)
    log.close()


def _sequences(log: ChannelLog) -> list[int]:
    return [r.offset + 1 for r in all_records(log)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=30),
    cut=st.floats(0, 1, exclude_max=True),
    mode=st.sampled_from(["truncate", "flip"]),
)
def test_recovery_keeps_every_batch_before_the_damage(sizes, cut, mode) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        log = ChannelLog.open(d, SMALL, 0)
        spans = [log.append(make_batch(n, value=b"p" * 20), 0) for n in sizes]
        flush(log)
        log.close()
        path = segment_files(d)[-1]
        data = bytearray(path.read_bytes())
        if not data:
            return
        at = int(cut * len(data))
        if mode == "truncate":
            data = data[:at]
        else:
            data[at] ^= 0x5A
        path.write_bytes(bytes(data))
        base = int(path.name.split(".")[0])
        log = ChannelLog.open(d, SMALL, 0)
        # Batches of the last segment that end before the damage survive.
        surviving = [s for s in spans if s[1] < base]
        pos = 0
        for first, last in (s for s in spans if s[0] >= base):
            size = len(make_batch(last - first + 1, value=b"p" * 20))
            if pos + size > at:
                if mode == "flip" and 12 <= at - pos < 16:
                    at = len(data) + 1  # partitionLeaderEpoch: outside the CRC, harmless
                else:
                    break
            surviving.append((first, last))
            pos += size
        expected = [q for first, last in surviving for q in range(first, last + 1)]
        assert _sequences(log) == expected
        nxt = expected[-1] + 1 if expected else 1
        assert log.next_sequence == nxt
        assert log.append(make_batch(1), 0) == (nxt, nxt)
        log.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 8), st.integers(0, 400)),
        st.tuples(st.just("flush")),
        st.tuples(st.just("roll")),
        st.tuples(st.just("restart")),
        st.tuples(st.just("read"), st.floats(0, 1, exclude_max=True), st.integers(1, 3_000), st.booleans()),
    ),
    max_size=60,
))
def test_reads_match_a_model(ops) -> None:
    """Random appends/flushes/rolls/restarts; every read equals the model's answer."""
    with tempfile.TemporaryDirectory() as tmp:
        log = ChannelLog.open(Path(tmp), SMALL, 0)
        model: list[tuple[int, int, int]] = []  # (first, last, size)
        durable = 1
        try:
            for op in ops:
                if op[0] == "append":
                    batch = make_batch(op[1], value=b"m" * op[2])
                    first, last = log.append(batch, 0)
                    assert first == (model[-1][1] + 1 if model else 1)
                    model.append((first, last, len(batch)))
                elif op[0] == "flush":
                    flush(log)
                    durable = log.next_sequence
                elif op[0] == "roll":
                    log.roll()
                elif op[0] == "restart":
                    log = reopen(log)
                    durable = log.next_sequence
                else:
                    _, frac, budget, min_one = op
                    seq = 1 + int(frac * log.next_sequence)  # 1..next_sequence
                    got = log.read(seq, budget, min_one=min_one)
                    want, total = [], 0
                    for first, last, size in model:
                        if last < seq:
                            continue
                        if last >= durable:
                            break
                        if total + size > budget and (want or not min_one):
                            break
                        want.append(first)
                        total += size
                        if total >= budget:
                            break
                    assert [records.read_header(b).base_offset + 1 for b in got.batches] == want
                    assert got.nbytes == total == sum(len(b) for b in got.batches)
                    assert got.high_watermark == durable
            assert log.durable_sequence == durable
        finally:
            log.close()


def test_time_lookup_and_max_timestamp(tmp_path: Path) -> None:
    log = ChannelLog.open(tmp_path, SMALL, 0)
    assert log.sequence_for_timestamp(0) is None and log.max_timestamp() is None
    # records out of order inside batches; batches roughly increasing
    log.append(make_batch(3, stamps=[100, 90, 110]), 0)      # 1..3
    log.append(make_batch(2, stamps=[200, 250]), 0)          # 4..5
    log.append(make_batch(2, stamps=[240, 260]), 0)          # 6..7
    for i in range(30):
        log.append(make_batch(2, stamps=[300 + i, 300 + i]), 0)  # 8..67
    flush(log)
    assert log.sequence_for_timestamp(0) == 1
    assert log.sequence_for_timestamp(95) == 1
    assert log.sequence_for_timestamp(101) == 3
    assert log.sequence_for_timestamp(255) == 7  # batch 4..5 max 250 < 255
    assert log.sequence_for_timestamp(245) == 5
    assert log.sequence_for_timestamp(315) == 38
    assert log.sequence_for_timestamp(330) is None
    assert log.max_timestamp() == (329, 66)
    log = reopen(log)
    assert log.sequence_for_timestamp(315) == 38
    assert log.max_timestamp() == (329, 66)
    log.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stamps=st.lists(st.lists(st.integers(0, 1_000), min_size=1, max_size=5), min_size=1, max_size=40),
       target=st.integers(0, 1_050))
def test_time_lookup_matches_a_linear_scan(stamps, target) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        log = ChannelLog.open(Path(tmp), SMALL, 0)
        flat = []
        for batch_stamps in stamps:
            log.append(make_batch(len(batch_stamps), stamps=batch_stamps), 0)
            flat.extend(batch_stamps)
        flush(log)
        # Kafka semantics: first record of the first batch whose max >= target
        want = None
        i = 0
        for batch_stamps in stamps:
            if max(batch_stamps) >= target:
                want = 1 + i + next(j for j, t in enumerate(batch_stamps) if t >= target)
                break
            i += len(batch_stamps)
        assert log.sequence_for_timestamp(target) == want
        top = max(flat)
        assert log.max_timestamp() == (top, 1 + flat.index(top))
        log.close()


def test_delete_removes_the_directory(tmp_path: Path) -> None:
    log = ChannelLog.open(tmp_path / "ch", SMALL, 0)
    log.append(make_batch(1), 0)
    log.delete()
    assert not (tmp_path / "ch").exists()


def test_rolled_fd_stays_open_while_a_token_holds_it(log: ChannelLog) -> None:
    log.append(make_batch(1, value=b"a" * 1_500), 0)
    token = log.prepare_flush()
    held = token.fds[0]
    log.append(make_batch(1, value=b"b" * 1_500), 0)  # rolls: the old write fd is retired
    assert log.segment_count == 2
    flush_second = log.prepare_flush()
    assert held not in flush_second.fds  # nothing new was written through it
    flush_second.run()
    log.complete_flush(flush_second)
    token.run()  # would fail with EBADF if the fd had been closed
    log.complete_flush(token)
    assert log.durable_sequence == 3 and not log._retired_fds


def test_corrupt_closed_segment_without_index_cuts_the_log_there(tmp_path: Path) -> None:
    log = ChannelLog.open(tmp_path, SMALL, 0)
    for _ in range(60):
        log.append(make_batch(2, value=b"c" * 40), 0)
    flush(log)
    log.close()
    first = segment_files(tmp_path)[0]
    (tmp_path / "00000000000000000001.index").unlink()
    data = bytearray(first.read_bytes())
    batch_size = len(make_batch(2, value=b"c" * 40))
    data[3 * batch_size + 70] ^= 0xFF  # inside the 4th batch (Sequences 7..8)
    first.write_bytes(bytes(data))
    log = ChannelLog.open(tmp_path, SMALL, 0)
    assert log.next_sequence == 7 and log.segment_count == 1
    assert _sequences(log) == list(range(1, 7))
    assert log.append(make_batch(1), 0) == (7, 7)
    log.close()


def test_a_roll_after_a_flush_closes_the_old_segments_write_fd(tmp_path: Path) -> None:
    """The write fd of a rolled segment goes once its writes are durable: at the flush that
    syncs them, or at the roll itself when a flush already did."""
    log = ChannelLog.open(tmp_path, LogConfig(segment_bytes=1_000), 0)
    big = make_batch(1, value=b"x" * 600)

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    log.append(big, 0)
    flush(log)
    before = open_fds()
    for _ in range(50):
        log.append(big, 0)  # rolls every time: the previous batch filled the segment
        flush(log)
    assert log.segment_count == 51
    # a closed segment keeps its two index mappings (each holds a descriptor), no writer
    assert open_fds() <= before + 2 * 50 + 2
    assert not log._retired_fds
    log.close()


def test_a_new_log_start_is_written_by_the_next_flush(log: ChannelLog) -> None:
    """truncate_prefix and retention move log_start at once for readers; its file is
    rewritten (fsyncs and all) by the next flush, on the I/O thread, not on the reactor."""
    for i in range(30):
        log.append(make_batch(1, value=f"v{i}".encode()), 0)
    flush(log)
    path = log.directory / "log-start"
    before = path.read_bytes() if path.exists() else None
    assert log.truncate_prefix(12) == 12 and log.log_start == 12
    assert (path.read_bytes() if path.exists() else None) == before
    flush(log)
    assert path.read_bytes() == b"12\n"
    again = reopen(log)
    assert again.log_start == 12
    again.close()


def test_a_saved_config_is_written_by_the_next_flush(log: ChannelLog) -> None:
    """set_config applies at once; with ``save`` its config.json is written (fsyncs and all)
    by the next flush, on the I/O thread, not on the reactor."""
    path = log.directory / "config.json"
    before = path.read_bytes() if path.exists() else None
    changed = log.config.with_changes(retention_ms=123_456)
    log.set_config(changed, save=True)
    assert log.config is changed
    assert (path.read_bytes() if path.exists() else None) == before
    flush(log)
    assert LogConfig.from_json(path.read_bytes()) == changed
    log.set_config(changed.with_changes(retention_ms=7))  # not saved: nothing to flush
    assert log.prepare_flush() is None


def test_only_an_unchecked_append_verifies_the_crc(log: ChannelLog,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The produce path validates each batch before proposing it; applying it again on the
    same node skips the second CRC pass. Anything else is verified as before."""
    bad = bytearray(make_batch(1, value=b"x"))
    bad[-1] ^= 0xFF  # the CRC covers the records
    with pytest.raises(records.InvalidBatch):
        log.append(bytes(bad), 0)
    assert log.next_sequence == 1
    y, z = make_batch(1, value=b"y"), make_batch(1, value=b"z")
    passes: list[int] = []
    real = records.crc32c
    monkeypatch.setattr(records, "crc32c", lambda data: passes.append(1) or real(data))
    log.append(y, 0)
    assert len(passes) == 1
    passes.clear()
    log.append(z, 0, checked=True)
    assert passes == [] and log.next_sequence == 3


def test_closing_under_a_running_flush_closes_each_fd_once_after_the_flush(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic deleted while its flush runs on the I/O thread: ``close`` closed the active
    segment's fd twice (as the segment's and as the token's), and the second close could hit
    a file the I/O thread had just opened under that number (a checkpoint write then failed
    with EBADF and the node refused every write). The fds the running token syncs are now
    closed once, by the token, when it is done."""
    log = ChannelLog.open(tmp_path / "ch", LogConfig(segment_bytes=4096), 0)
    log.append(make_batch(1, value=b"x" * 3000), 0)
    log.append(make_batch(1, value=b"y" * 3000), 0)  # rolls: a retired fd and index parts
    running = log.prepare_flush()
    assert running is not None
    closes: list[int] = []
    real_close = os.close
    monkeypatch.setattr(os, "close", lambda fd: (closes.append(fd), real_close(fd))[1])
    log.close()
    synced = set(running.fds) | {fd for _s, parts in running.index_jobs for fd, _p, _f in parts}
    assert not synced & set(closes), "closed under the flush still using them"
    assert len(closes) == len(set(closes))
    running.abandoned = True
    running.run()
    assert synced <= set(closes)
    assert len(closes) == len(set(closes)), f"closed twice: {closes}"


def _fill(log: ChannelLog, n: int = 45) -> None:
    for i in range(n):
        log.append(make_batch(1 + i % 3, ts=1_000 + (i * 37) % 11, value=b"x" * (i % 50)), 0)
    flush(log)


def _counting_scans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    from kmqkafka.store import log as log_module

    calls: list[int] = []
    real = log_module.scan_log

    def counted(*args, **kwargs):
        calls.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(log_module, "scan_log", counted)
    return calls


def test_a_clean_stop_saves_what_the_start_up_scan_would_find(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Start-up walks every batch of each active segment; after a clean stop it takes the
    index saved then instead, and what it takes equals what the walk builds."""
    from kmqkafka.store.segment import scan_log

    log = ChannelLog.open(tmp_path, SMALL, 0)
    _fill(log)
    before = [(r.offset, r.value, r.timestamp) for r in all_records(log)]
    log.close(save_scan=True)
    saved = list(tmp_path.glob("*.scan"))
    assert len(saved) == 1
    active_file = segment_files(tmp_path)[-1]
    base = int(active_file.name.split(".")[0])
    fd = os.open(active_file, os.O_RDONLY)
    try:
        walked = scan_log(fd, active_file.stat().st_size, base, SMALL.index_interval_bytes,
                          dense=True)
    finally:
        os.close(fd)
    scans = _counting_scans(monkeypatch)
    log = ChannelLog.open(tmp_path, SMALL, 0)
    assert scans == [] and not list(tmp_path.glob("*.scan"))
    active = log._active
    got = active.builder
    assert (active.size, log.next_sequence) == (walked.valid_size, walked.next_sequence)
    for name in ("rels", "positions", "times", "time_rels"):
        assert list(getattr(got, name)) == list(getattr(walked.index, name)), name
    assert (got.max_timestamp, got.max_timestamp_rel, got._last_offset_pos,
            got._last_time_pos) == (walked.index.max_timestamp, walked.index.max_timestamp_rel,
                                    walked.index._last_offset_pos, walked.index._last_time_pos)
    assert [(r.offset, r.value, r.timestamp) for r in all_records(log)] == before
    assert log.append(make_batch(2), 0)[0] == before[-1][0] + 2
    flush(log)
    log.close()  # not a clean stop: the next start walks again
    log = ChannelLog.open(tmp_path, SMALL, 0)
    assert scans == [base]
    log.close()


@pytest.mark.parametrize("change", ["torn tail", "cut", "bad checksum", "stale", "rewritten"])
def test_a_saved_scan_that_no_longer_fits_is_not_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    """The saved index is taken only for the segment and the file size it was saved with:
    otherwise the segment is walked as after a crash, and the saved file is removed."""
    log = ChannelLog.open(tmp_path, SMALL, 0)
    _fill(log)
    log.close(save_scan=True)
    (saved,) = tmp_path.glob("*.scan")
    active_file = segment_files(tmp_path)[-1]
    if change == "torn tail":
        with open(active_file, "ab") as f:
            f.write(make_batch(2)[:30])
    elif change == "cut":
        os.truncate(active_file, active_file.stat().st_size - 1)
    elif change == "bad checksum":
        data = bytearray(saved.read_bytes())
        data[-1] ^= 1
        saved.write_bytes(bytes(data))
    elif change == "rewritten":  # same size, but its last batch names other offsets
        from kmqkafka.store.segment import iter_file_batches

        fd = os.open(active_file, os.O_RDONLY)
        try:
            *_, (last, _batch) = iter_file_batches(fd, active_file.stat().st_size)
        finally:
            os.close(fd)
        data = bytearray(active_file.read_bytes())
        data[last + 7] ^= 1  # the base offset's low byte (the CRC does not cover it)
        active_file.write_bytes(bytes(data))
    else:  # a scan saved for a segment that has rolled since
        stale = saved.read_bytes()
        log = ChannelLog.open(tmp_path, SMALL, 0)
        log.roll()
        log.append(make_batch(1), 0)
        flush(log)
        log.close()
        saved.write_bytes(stale)
        assert segment_files(tmp_path)[-1] != active_file
    scans = _counting_scans(monkeypatch)
    log = ChannelLog.open(tmp_path, SMALL, 0)
    assert scans == [int(segment_files(tmp_path)[-1].name.split(".")[0])]
    assert not list(tmp_path.glob("*.scan"))
    if change in ("cut", "rewritten"):
        assert log.truncated_bytes > 0
    elif change == "torn tail":
        assert log.truncated_bytes == 30
    seqs = [r.offset for r in all_records(log)]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert log.append(make_batch(1), 0)[0] == log.next_sequence - 1
    log.close()
