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
