"""Tests of the channel store; shared builders for the segment-log tests."""

from __future__ import annotations

from pathlib import Path

from kmqkafka import records
from kmqkafka.store.config import LogConfig
from kmqkafka.store.log import ChannelLog


def with_header(batch: bytes, *, max_ts: int | None = None,
                attributes: int | None = None) -> bytes:
    """``batch`` with the header fields given replaced and its CRC recomputed: the shapes
    clients send that a well-behaved one never does (sarama 1.22's max timestamp -1)."""
    buf = bytearray(batch)
    if max_ts is not None:
        buf[35:43] = max_ts.to_bytes(8, "big", signed=True)
    if attributes is not None:
        buf[21:23] = attributes.to_bytes(2, "big")
    buf[17:21] = records.crc32c(memoryview(buf)[21:]).to_bytes(4, "big")
    return bytes(buf)


def make_batch(n: int = 1, *, ts: int = 1_000, key: bytes | None = None, value: bytes = b"v",
               keys: list | None = None, values: list | None = None, stamps: list | None = None,
               compression: int = records.COMPRESSION_NONE) -> bytes:
    """A client-style batch of ``n`` records (base offset 0)."""
    recs = []
    for i in range(n):
        recs.append(records.NewRecord(
            value=values[i] if values is not None else value + b"%d" % i,
            key=keys[i] if keys is not None else key,
            timestamp=stamps[i] if stamps is not None else ts,
        ))
    return records.build_batch(recs, now_ms=ts, compression=compression)


def flush(log: ChannelLog) -> None:
    """Run one group commit synchronously, as the I/O thread would."""
    token = log.prepare_flush()
    if token is not None:
        token.run()
        log.complete_flush(token)


def all_records(log: ChannelLog, start: int | None = None) -> list[records.Record]:
    """Every record readable from ``start`` (default log_start), CRC-checked."""
    out = []
    seq = log.log_start if start is None else start
    result = log.read(seq, 1 << 40)
    for batch in result.batches:
        records.validate_batch(batch)
        out.extend(records.iter_records(batch))
    return out


def reopen(log: ChannelLog, now_ms: int = 0, config: LogConfig | None = None) -> ChannelLog:
    log.close()
    return ChannelLog.open(log.directory, config or log.config, now_ms)


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))
