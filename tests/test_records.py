"""Record batch codecs: every codec round-trips, and none decompresses past its limit."""
from __future__ import annotations

import cramjam
import pytest

from kmqkafka import records
from kmqkafka.records import NewRecord, build_batch

CODECS = [records.COMPRESSION_GZIP, records.COMPRESSION_SNAPPY, records.COMPRESSION_LZ4,
          records.COMPRESSION_ZSTD]


@pytest.mark.parametrize("codec", [records.COMPRESSION_NONE, *CODECS])
def test_every_codec_round_trips(codec: int) -> None:
    sent = [NewRecord(value=b"v%d" % i * 50, key=b"k%d" % i, timestamp=1_000 + i)
            for i in range(200)]
    batch = build_batch(sent, now_ms=1_000, compression=codec)
    got = list(records.iter_records(batch))
    assert [(r.key, r.value, r.timestamp) for r in got] == [
        (s.key, s.value, s.timestamp) for s in sent]


@pytest.mark.parametrize("codec", CODECS)
def test_a_bomb_is_refused_at_the_limit(codec: int) -> None:
    plain = b"\0" * (4 << 20)
    packed = records.compress(codec, plain)
    assert len(packed) < len(plain) // 10
    assert records.decompress(codec, packed, limit=len(plain)) == plain
    with pytest.raises(records.InvalidBatch, match="more than"):
        records.decompress(codec, packed, limit=len(plain) - 1)


def test_xerial_snappy_chunks_count_towards_the_limit() -> None:
    chunk = bytes(cramjam.snappy.compress_raw(b"\0" * (1 << 20)))
    framed = records._XERIAL_MAGIC + b"\x00\x00\x00\x01\x00\x00\x00\x01" + b"".join(
        len(chunk).to_bytes(4, "big") + chunk for _ in range(3))
    assert len(records.decompress(records.COMPRESSION_SNAPPY, framed)) == 3 << 20
    with pytest.raises(records.InvalidBatch, match="more than"):
        records.decompress(records.COMPRESSION_SNAPPY, framed, limit=(3 << 20) - 1)


@pytest.mark.parametrize("codec", CODECS)
def test_garbage_is_an_invalid_batch(codec: int) -> None:
    with pytest.raises(records.InvalidBatch):
        records.decompress(codec, b"\x82SNAPPY\x00\x00" + b"\xff\x13junk" * 20)


def _records_section(values: list[bytes]) -> bytes:
    """A records section of length-prefixed records (only the lengths matter to the walk)."""
    out = bytearray()
    for value in values:
        records._write_varint(out, len(value))
        out += value
    return bytes(out)


def _batch_of(section: bytes, codec: int, count: int) -> tuple[bytes, records.BatchHeader]:
    """A batch whose header claims ``count`` records and whose body is ``section``."""
    template = build_batch([NewRecord(value=b"x")], now_ms=1, compression=codec)
    batch = template[:records.HEADER_SIZE] + records.compress(codec, section)
    header = records.read_header(template)._replace(
        batch_length=len(batch) - records.LOG_OVERHEAD, records_count=count)
    return batch, header


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("chunk", [1, 3, 7, 1 << 20])
def test_the_record_walk_is_the_same_whatever_the_chunks(codec: int, chunk: int,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk counts records across chunk boundaries, lengths cut in two included (a
    300-byte record's length takes two bytes)."""
    monkeypatch.setattr(records, "DECOMPRESS_CHUNK", chunk)
    values = [b"v" * n for n in (0, 1, 63, 64, 300, 9, 200_000, 5)]
    section = _records_section(values)
    batch, header = _batch_of(section, codec, len(values))
    records.check_records(batch, header)
    for count in (len(values) - 1, len(values) + 1):
        with pytest.raises(records.InvalidBatch):
            records.check_records(batch, header._replace(records_count=count))
    for broken in (section[:-1], section + b"\x00", section[:-301], section[:1]):
        batch, header = _batch_of(broken, codec, len(values))
        with pytest.raises(records.InvalidBatch):
            records.check_records(batch, header)


@pytest.mark.parametrize("codec", [records.COMPRESSION_GZIP, records.COMPRESSION_LZ4,
                                   records.COMPRESSION_ZSTD])
def test_walking_a_bomb_holds_one_chunk(codec: int) -> None:
    """A batch that expands to ``DECOMPRESSED_MAX`` is walked a chunk at a time: held whole
    (twice, while it was joined) it cost every decode thread 256 MiB of fresh memory, and a
    request of two dozen of them took seconds of page faults. (Snappy is no bomb: a raw
    block expands at most about 21 times, and its size is checked before it is.)"""
    import tracemalloc

    section = _records_section([bytes(64 << 20)])
    batch, header = _batch_of(section, codec, 1)
    tracemalloc.start()
    try:
        records.check_records(batch, header)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"the walk held {peak >> 20} MiB"
