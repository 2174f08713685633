"""Compaction: latest value per key survives with its Sequence; tombstones age out."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from kmqkafka import records
from kmqkafka.store.config import LogConfig
from kmqkafka.store.log import ChannelLog

from . import all_records, flush, make_batch, reopen

COMPACT = LogConfig(segment_bytes=400, index_interval_bytes=100, cleanup_policy="compact",
                    retention_ms=None, delete_retention_ms=1_000)


def _compact(log: ChannelLog, now_ms: int) -> int:
    plan = log.compaction_plan(now_ms)
    if plan is None:
        return 0
    return log.install_compaction(plan.run())


def _kv(log: ChannelLog) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset + 1, r.key, r.value) for r in all_records(log)]


def test_no_plan_without_compact_policy_or_closed_segments(tmp_path: Path) -> None:
    log = ChannelLog.open(tmp_path, COMPACT.with_changes(cleanup_policy="delete"), 0)
    for i in range(20):
        log.append(make_batch(1, key=b"k"), 0)
    flush(log)
    assert log.compaction_plan(0) is None
    log.set_config(COMPACT.with_changes(segment_bytes=1 << 20))
    fresh = ChannelLog.open(tmp_path / "fresh", log.config, 0)
    fresh.append(make_batch(1, key=b"k"), 0)
    flush(fresh)
    assert fresh.compaction_plan(0) is None  # only the active segment
    fresh.close()
    log.close()


def test_latest_value_per_key_survives_with_its_sequence(tmp_path: Path) -> None:
    log = ChannelLog.open(tmp_path, COMPACT, 0)
    keys = [b"a", b"b", b"a", None, b"c", b"b", b"a", None] * 4
    for i, key in enumerate(keys):
        log.append(make_batch(1, key=key, values=[b"v%02d" % i]), 0)
    log.append(make_batch(1, key=b"tail", value=b"t"), 0)
    flush(log)
    next_before, start_before = log.next_sequence, log.log_start
    assert _compact(log, 0) > 0
    kv = _kv(log)
    closed_end = log._segments[-1].base
    # Only closed segments are cleaned and only they feed the key map (Kafka's cleanable
    # range ends at the active segment); keyless records do not survive a clean.
    latest = {key: i + 1 for i, key in enumerate(keys) if key is not None and i + 1 < closed_end}
    for i, key in enumerate(keys):
        seq = i + 1
        survives = seq >= closed_end or (key is not None and latest[key] == seq)
        assert ((seq, key, b"v%02d" % i) in kv) == survives, (seq, key)
    assert (log.next_sequence, log.log_start) == (next_before, start_before)
    assert log.append(make_batch(1), 0)[0] == next_before
    # reads from any Sequence work, and survive a restart
    for seq in range(1, log.next_sequence - 1):
        assert log.read(seq, 1).batches
    log = reopen(log)
    assert _kv(log)[: len(kv)] == kv
    log.close()


def test_tombstones_stay_delete_retention_ms_after_the_clean_that_kept_them(tmp_path: Path) -> None:
    """Kafka's delete horizon (KIP-534): the first clean stamps the tombstone's batch with
    now + delete.retention.ms, however old the tombstone's own timestamp is; a clean after
    that horizon drops it."""
    log = ChannelLog.open(tmp_path, COMPACT, 0)
    log.append(make_batch(1, key=b"x", value=b"old", ts=100), 100)
    log.append(make_batch(1, key=b"x", values=[None], ts=100), 100)  # tombstone, Sequence 2
    for i in range(10):
        log.append(make_batch(1, key=b"other%d" % i, value=b"p" * 60, ts=100), 100)
    flush(log)
    _compact(log, 50_000)  # the tombstone's timestamp is far older than delete_retention_ms
    assert [(s, k, v) for s, k, v in _kv(log) if k == b"x"] == [(2, b"x", None)]
    stamped = [records.read_header(b) for b in log.read(1, 1 << 20).batches]
    assert stamped[0].delete_horizon_ms == 51_000
    assert [r.timestamp for r in records.iter_records(log.read(2, 1 << 20).batches[0])] == [100]
    assert _compact(log, 50_900) == 0  # nothing new to clean, horizon not reached
    log = reopen(log)  # the horizon is in the batch: a restart keeps it
    _compact(log, 50_900)
    assert [(s, k, v) for s, k, v in _kv(log) if k == b"x"] == [(2, b"x", None)]
    _compact(log, 51_000)
    assert [(s, k, v) for s, k, v in _kv(log) if k == b"x"] == []
    assert log.log_start == 1
    log.close()


def test_active_segment_and_min_compaction_lag_bound_the_clean(tmp_path: Path) -> None:
    """Records in the active segment, or in segments younger than min.compaction.lag.ms,
    neither get cleaned nor supersede older ones (Kafka's firstUncleanableOffset)."""
    log = ChannelLog.open(tmp_path, COMPACT.with_changes(segment_bytes=1 << 20), 0)
    log.append(make_batch(1, key=b"a", values=[b"1"], ts=10), 10)
    log.append(make_batch(1, key=b"a", values=[b"2"], ts=10), 10)
    log.roll()
    log.append(make_batch(1, key=b"a", values=[b"3"], ts=20), 20)  # active segment
    flush(log)
    _compact(log, 30)
    assert [(s, v) for s, _k, v in _kv(log)] == [(2, b"2"), (3, b"3")]
    lagged = ChannelLog.open(tmp_path / "lag", COMPACT.with_changes(
        segment_bytes=1 << 20, min_compaction_lag_ms=1_000), 0)
    for v in (b"1", b"2"):
        lagged.append(make_batch(1, key=b"a", values=[v], ts=500), 500)
    lagged.roll()
    lagged.append(make_batch(1, key=b"b", values=[b"x"], ts=600), 600)
    flush(lagged)
    assert _compact(lagged, 1_400) == 0  # newest record 900 ms old: not yet
    assert len(_kv(lagged)) == 3
    _compact(lagged, 1_600)
    assert [(s, v) for s, _k, v in _kv(lagged)] == [(2, b"2"), (3, b"x")]
    lagged.close()
    log.close()


def test_dirty_ratio_and_max_compaction_lag_decide_when_a_pass_runs(tmp_path: Path) -> None:
    never = ChannelLog.open(tmp_path, COMPACT.with_changes(min_cleanable_dirty_ratio=1.0), 0)
    for i in range(12):
        never.append(make_batch(1, key=b"same", value=b"p" * 60, ts=0), 0)
    flush(never)
    assert never.compaction_plan(10) is None  # a never-cleaned log is 100 % dirty: not > 1.0
    never.set_config(never.config.with_changes(max_compaction_lag_ms=5_000))
    assert never.compaction_plan(4_000) is None
    assert _compact(never, 6_000) > 0  # dirt older than max.compaction.lag.ms: clean now
    never.close()
    rolled = ChannelLog.open(tmp_path / "roll", COMPACT.with_changes(
        segment_bytes=1 << 20, max_compaction_lag_ms=2_000), 0)
    rolled.append(make_batch(1, key=b"a", values=[b"1"], ts=1_000), 1_000)
    rolled.append(make_batch(1, key=b"a", values=[b"2"], ts=2_500), 2_500)
    assert rolled.segment_count == 1
    rolled.append(make_batch(1, key=b"a", values=[b"3"], ts=3_100), 3_100)  # 2.1 s of record time
    assert rolled.segment_count == 2
    rolled.close()


def test_segment_ms_counts_record_time(tmp_path: Path) -> None:
    """Kafka rolls by the incoming batch's timestamp against the segment's first batch's."""
    log = ChannelLog.open(tmp_path, LogConfig(segment_ms=600_000), 0)
    log.append(make_batch(1, values=[b"old"], ts=1_000), 7_200_000)
    log.append(make_batch(1, values=[b"new"], ts=7_200_000), 7_200_001)
    assert log.segment_count == 2
    log.close()


def test_rewritten_batches_keep_codec_producer_and_offsets(tmp_path: Path) -> None:
    log = ChannelLog.open(tmp_path, COMPACT.with_changes(segment_bytes=2_000), 0)
    batch = records.build_batch(
        [records.NewRecord(value=b"v%d" % i, key=b"k%d" % (i % 3), timestamp=50 + i) for i in range(9)],
        now_ms=50, compression=records.COMPRESSION_ZSTD, producer_id=7, producer_epoch=3,
        base_sequence=11, attributes=records.TRANSACTIONAL_FLAG,
    )
    log.append(batch, 0)
    log.append(records.build_control_batch(commit=True, producer_id=7, producer_epoch=3, now_ms=60), 0)
    log.append(make_batch(1, key=b"zz", value=b"q" * 2_000), 0)  # rolls: batch 1 and control closed
    log.append(make_batch(1), 0)
    flush(log)
    assert _compact(log, 0) == 1
    got = log.read(1, 1 << 20).batches
    header = records.validate_batch(got[0])
    assert (header.compression, header.producer_id, header.producer_epoch, header.base_sequence) == (
        records.COMPRESSION_ZSTD, 7, 3, 11)
    assert header.is_transactional and header.base_offset == 0
    assert [(r.offset + 1, r.value) for r in records.iter_records(got[0])] == [
        (7, b"v6"), (8, b"v7"), (9, b"v8")]
    control = records.validate_batch(got[1])
    assert control.is_control and control.base_offset == 9
    log.close()


def test_stale_result_is_discarded(tmp_path: Path) -> None:
    log = ChannelLog.open(tmp_path, COMPACT.with_changes(cleanup_policy="compact,delete",
                                                          retention_messages=5), 0)
    for i in range(30):
        log.append(make_batch(1, key=b"k", value=b"p" * 50), 0)
    flush(log)
    plan = log.compaction_plan(0)
    before = log.segment_count
    assert log.enforce_retention(0) > 0  # drops the segments the plan covers
    assert log.install_compaction(plan.run()) == 0
    assert not list(tmp_path.glob("*.cleaned"))
    assert log.segment_count < before
    log.close()


def test_all_records_removed_leaves_an_empty_segment_and_log_start(tmp_path: Path) -> None:
    log = ChannelLog.open(tmp_path, COMPACT, 0)
    for i in range(12):
        log.append(make_batch(1, key=b"same", value=b"p" * 60), 0)
    log.roll()
    flush(log)
    _compact(log, 0)
    assert log.log_start == 1
    assert [s for s, _, _ in _kv(log)] == [12]
    assert log.read(1, 100).batches  # reads from the start skip the empty segments
    log = reopen(log)
    assert [s for s, _, _ in _kv(log)] == [12] and log.log_start == 1
    log.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(
        st.lists(st.tuples(st.sampled_from([b"a", b"b", b"c", b"d", None]), st.booleans()),
                 min_size=1, max_size=4),
        min_size=1, max_size=40),
    now=st.integers(0, 3_000),
    restart=st.booleans(),
)
def test_compaction_matches_a_model(batches, now, restart) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        log = ChannelLog.open(Path(tmp), COMPACT, 0)
        model = []  # (seq, key, value, ts)
        for i, recs in enumerate(batches):
            ts = i * 50
            keys = [k for k, _ in recs]
            values = [None if tomb else b"v%d.%d" % (i, j) for j, (_, tomb) in enumerate(recs)]
            first, _ = log.append(make_batch(len(recs), keys=keys, values=values, ts=ts), ts)
            model.extend((first + j, k, v, ts) for j, (k, v) in enumerate(zip(keys, values)))
        flush(log)
        before = _kv(log)
        _compact(log, now)
        if restart:
            log = reopen(log)
        closed_end = log._segments[-1].base
        latest = {k: s for s, k, _, _ in model if k is not None and s < closed_end}
        # keyless records go; tombstones stay (the first clean only stamps their horizon)
        want = [(s, k, v) for s, k, v, ts in model
                if s >= closed_end or (k is not None and latest[k] == s)]
        assert _kv(log) == want
        assert log.next_sequence == len(model) + 1 and log.log_start == 1
        # compacting again changes nothing
        _compact(log, now)
        assert _kv(log) == want
        assert len(before) >= len(want)
        log.close()


def test_a_pass_runs_only_for_new_dirt_or_due_tombstones(tmp_path: Path) -> None:
    """Passes come every 15 s (Kafka's cleaner backoff): after a clean, the next one waits
    for enough new dirt (``min.cleanable.dirty.ratio``) or a kept tombstone's horizon."""
    log = ChannelLog.open(tmp_path, COMPACT, 0)
    for i in range(12):
        log.append(make_batch(1, key=b"k%d" % (i % 3), values=[b"v%02d" % i]), 0)
    log.append(make_batch(1, key=b"gone", values=[None]), 0)
    for i in range(6):
        log.append(make_batch(1, key=b"k%d" % (i % 3), values=[b"u%02d" % i]), 0)
    flush(log)
    assert _compact(log, 0) > 0
    assert not _due(log, 10)                        # nothing new since
    assert _due(log, COMPACT.delete_retention_ms)   # the tombstone's horizon
    for i in range(12):
        log.append(make_batch(1, key=b"k%d" % (i % 3), values=[b"w%02d" % i]), 2_000)
    flush(log)
    assert _due(log, 2_001)                         # new closed segments
    log.close()


def _due(log: ChannelLog, now_ms: int) -> bool:
    """Whether a pass is due at ``now_ms`` (a plan made to tell is abandoned)."""
    plan = log.compaction_plan(now_ms)
    if plan is None:
        return False
    log.abandon_compaction()
    for source in plan.sources:
        os.close(source.fd)
    return True


def test_a_pass_planned_before_a_delete_never_reaches_the_channel_created_after(
        tmp_path: Path) -> None:
    """The cleaner runs off the reactor: a topic deleted and created again meanwhile has the
    same directory and segment bases, and got the old topic's cleaned segments installed."""
    from kmqkafka.store import commands as c
    from kmqkafka.store.machine import StateMachine

    machine = StateMachine(tmp_path)
    machine.recover(0)
    config = {"segment_bytes": 400, "index_interval_bytes": 100, "cleanup_policy": "compact"}
    index = 1

    def apply(cmd: c.Command) -> object:
        nonlocal index
        index += 1
        return machine.apply(index, cmd)

    def fill(prefix: bytes) -> None:
        apply(c.CreateChannel("kafka.t", "events", config))
        for i in range(30):
            apply(c.Append("kafka.t", 0, make_batch(1, key=b"k", values=[prefix + b"%d" % i])))
        flush(machine.channels["kafka.t"])

    fill(b"old")
    assert apply(c.Compact("kafka.t", 0)) is True
    ((name, plan),) = machine.take_compactions()
    apply(c.DeleteChannel("kafka.t"))
    fill(b"new")
    result = plan.run()  # the cleaner thread, while the reactor went on
    assert result.segments
    machine.install_compaction(name, result, plan.owner)
    log = machine.channels["kafka.t"]
    assert [r.value for r in all_records(log)] == [b"new%d" % i for i in range(30)]
    assert not list(log._dir.glob("*.cleaned"))
    machine.close()


def test_one_compaction_plan_at_a_time(tmp_path: Path) -> None:
    """Every node of a cluster proposes its own Compact commands: a second plan for the same
    segments wrote the same ``.cleaned`` files under the first. No second plan is made until
    the first is installed or abandoned."""
    log = ChannelLog.open(tmp_path, COMPACT, 0)
    for i in range(40):
        log.append(make_batch(1, key=b"k%d" % (i % 3), values=[b"v%02d" % i]), 0)
    flush(log)
    first = log.compaction_plan(0)
    assert first is not None
    assert log.compaction_plan(0) is None
    log.abandon_compaction()
    again = log.compaction_plan(0)
    assert again is not None and log.compaction_plan(0) is None
    assert log.install_compaction(again.run()) > 0
    for i in range(40):  # new dirt: a new pass is due and may be planned
        log.append(make_batch(1, key=b"k%d" % (i % 3), values=[b"w%02d" % i]), 0)
    flush(log)
    assert _due(log, 0)
    for source in first.sources:  # the abandoned plan's fds
        os.close(source.fd)
    log.close()


def _superseded_then_compacted(tmp_path: Path) -> ChannelLog:
    """A compact,delete log (retention.ms 4 s, 400-byte segments) of twelve records of one
    key dated 1,000-1,011 ms, compacted at 2,000 ms: every segment but the last emptied."""
    cfg = COMPACT.with_changes(cleanup_policy="compact,delete", retention_ms=4_000)
    log = ChannelLog.open(tmp_path, cfg, 0)
    for i in range(12):
        log.append(make_batch(1, key=b"same", value=b"p" * 60, ts=1_000 + i), 1_000 + i)
    log.roll()
    flush(log)
    _compact(log, 2_000)
    return log


def test_time_retention_goes_on_past_segments_the_cleaner_emptied(tmp_path: Path) -> None:
    """compact,delete: segments emptied by compaction (every key superseded later) expire
    like any other, so time retention keeps dropping the segments behind them."""
    log = _superseded_then_compacted(tmp_path)
    assert [s for s, _, _ in _kv(log)] == [12]
    assert log.segment_count > 2  # emptied segments before the one keeping offset 12
    assert log.enforce_retention(100_000) > 0
    assert (log.log_start, log.next_sequence) == (13, 13)
    assert _kv(log) == []
    log = reopen(log)
    assert (log.log_start, log.next_sequence) == (13, 13)
    log.close()


def test_segments_the_cleaner_emptied_keep_their_records_date(tmp_path: Path) -> None:
    """Kafka dates a cleaned segment by the original's last-modified time: one the cleaner
    emptied expires retention.ms after its records would have, not at once, so the log
    start of a compact,delete topic stays put (across a restart too) until then."""
    log = _superseded_then_compacted(tmp_path)
    assert log.segment_count > 2
    assert log.enforce_retention(3_000) == 0
    assert log.log_start == 1
    log = reopen(log)
    assert log.enforce_retention(3_000) == 0
    assert log.log_start == 1
    assert [s for s, _, _ in _kv(log)] == [12]
    assert log.enforce_retention(100_000) > 0
    assert (log.log_start, log.next_sequence) == (13, 13)
    log.close()
