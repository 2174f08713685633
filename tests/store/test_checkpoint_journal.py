"""The applied-index journal's file: padded when it starts, records overwritten in place, a
torn record read as the end, and journals written before the padding still read and extended."""
from __future__ import annotations

import os

from kmqkafka.store import checkpoint
from kmqkafka.store.checkpoint import JOURNAL, ROLL_BYTES, SPARE, CheckpointJournal


def test_records_overwrite_the_padding_of_a_new_file_in_place(tmp_path):
    journal = CheckpointJournal(tmp_path)
    path = tmp_path / JOURNAL
    journal.write(journal.prepare(1, {}, lambda: {"kafka.a": 1}, {}))
    assert path.stat().st_size == ROLL_BYTES + SPARE
    inode = path.stat().st_ino
    for applied in range(2, 40):
        journal.write(journal.prepare(applied, {"kafka.a": applied}, dict, {}))
    assert path.stat().st_size == ROLL_BYTES + SPARE  # nothing appended: no size to journal
    assert path.stat().st_ino == inode
    folded = checkpoint.read(tmp_path)
    assert folded.applied == 39 and folded.channels == {"kafka.a": 39}
    journal.close()
    again = CheckpointJournal(tmp_path)  # resumes just past the last record
    again.write(again.prepare(40, {"kafka.b": 7}, dict, {}))
    again.close()
    assert checkpoint.read(tmp_path).channels == {"kafka.a": 39, "kafka.b": 7}


def test_a_torn_record_over_the_padding_ends_the_journal_and_is_overwritten(tmp_path):
    journal = CheckpointJournal(tmp_path)
    journal.write(journal.prepare(1, {}, lambda: {"kafka.a": 1}, {}))
    journal.write(journal.prepare(2, {"kafka.a": 5}, dict, {}))
    end = checkpoint.read(tmp_path).end
    torn = journal.prepare(3, {"kafka.a": 9, "kafka.b": 4}, dict, {})
    journal.close()
    fd = os.open(tmp_path / JOURNAL, os.O_WRONLY)  # a crash left half the record
    os.pwrite(fd, torn.record[:len(torn.record) // 2], torn.at)
    os.close(fd)
    folded = checkpoint.read(tmp_path)
    assert (folded.applied, folded.channels) == (2, {"kafka.a": 5})
    again = CheckpointJournal(tmp_path)
    assert checkpoint.read(tmp_path).end == end
    again.write(again.prepare(3, {"kafka.c": 2}, dict, {}))  # lands on the torn bytes
    again.close()
    folded = checkpoint.read(tmp_path)
    assert (folded.applied, folded.channels) == (3, {"kafka.a": 5, "kafka.c": 2})


def test_a_journal_written_without_padding_is_read_and_extended(tmp_path):
    old = b"".join(checkpoint._record(n, {"kafka.a": n}, n == 1, {}) for n in (1, 2, 3))
    (tmp_path / JOURNAL).write_bytes(old)
    journal = CheckpointJournal(tmp_path)
    journal.write(journal.prepare(4, {"kafka.b": 2}, dict, {}))
    journal.close()
    assert (tmp_path / JOURNAL).stat().st_size > len(old)
    folded = checkpoint.read(tmp_path)
    assert (folded.applied, folded.channels) == (4, {"kafka.a": 3, "kafka.b": 2})


def test_a_roll_starts_a_new_padded_file_with_every_channel(tmp_path):
    journal = CheckpointJournal(tmp_path)
    ends = {f"kafka.t~{p}": 1 for p in range(200)}
    journal.write(journal.prepare(1, {}, lambda: dict(ends), {}))
    applied = 1
    while True:  # partition-sized records until the journal rolls
        applied += 1
        ends[f"kafka.t~{applied % 200}"] = applied
        token = journal.prepare(applied, dict(ends), lambda: dict(ends), {})
        journal.write(token)
        if token.full:
            break
        assert applied < 10_000
    journal.close()
    path = tmp_path / JOURNAL
    assert path.stat().st_size == ROLL_BYTES + SPARE
    assert checkpoint.read(tmp_path).end == len(token.record)
    folded = checkpoint.read(tmp_path)
    assert folded.applied == applied and folded.channels == ends


def test_records_written_after_a_torn_tail_are_read(tmp_path):
    """A crash that tore the last record of a journal without padding: the next record goes
    where the valid ones end, not after the torn bytes, where no reader would reach it (and
    a second crash would cut the channels back past records that were acknowledged)."""
    whole = b"".join(checkpoint._record(n, {"kafka.a": n}, n == 1, {}) for n in (1, 2))
    torn = checkpoint._record(3, {"kafka.a": 3}, False, {})
    (tmp_path / JOURNAL).write_bytes(whole + torn[:len(torn) - 3])
    journal = CheckpointJournal(tmp_path)
    journal.write(journal.prepare(4, {"kafka.a": 9}, dict, {}))
    journal.close()
    folded = checkpoint.read(tmp_path)
    assert (folded.applied, folded.channels) == (4, {"kafka.a": 9})


def test_zeros_end_the_journal(tmp_path):
    """Zeros read as a record of length 0 whose CRC matches (crc32c of nothing is 0): they end
    the journal like a torn tail instead of failing start-up."""
    whole = checkpoint._record(1, {"kafka.a": 1}, True, {})
    (tmp_path / JOURNAL).write_bytes(whole + bytes(64))
    folded = checkpoint.read(tmp_path)
    assert (folded.applied, folded.channels) == (1, {"kafka.a": 1})
    assert checkpoint.read(tmp_path).end == len(whole)


def test_an_older_writer_starts_a_padded_journal_over_with_a_full_record(tmp_path):
    """An older kmqkafka appends at the file's size (after the padding, where no reader
    looks) but rolls first once that size reaches ROLL_BYTES: every padded file is that
    large, so a downgrade's first record replaces the file instead of hiding behind padding."""
    journal = CheckpointJournal(tmp_path)
    journal.write(journal.prepare(1, {}, lambda: {"kafka.a": 1}, {}))
    journal.write(journal.prepare(2, {"kafka.a": 2}, dict, {}))
    journal.close()
    assert (tmp_path / JOURNAL).stat().st_size >= ROLL_BYTES
