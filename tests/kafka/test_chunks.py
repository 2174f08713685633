"""Chunked response encoding is byte-identical to kio's BytesIO output and yields only bytes."""

import datetime
import io

from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import response as f
from kio.serial import entity_writer

from kmqkafka.net.chunks import ChunkWriter, RecordChain


def fetch_response(records):
    part = f.PartitionData(partition_index=0, error_code=ErrorCode.none, high_watermark=10,
                           last_stable_offset=10, log_start_offset=0, aborted_transactions=None,
                           preferred_read_replica=-1, records=records)
    return f.FetchResponse(throttle_time=datetime.timedelta(0), error_code=ErrorCode.none,
                           session_id=0, responses=(f.FetchableTopicResponse(topic="t", partitions=(part,)),))


def test_chunked_output_matches_kio_and_is_all_bytes():
    big = bytes(range(256)) * 300  # 76 KiB: kept as its own chunk
    for records in (big, memoryview(big), bytearray(big), RecordChain([big[:5000], memoryview(big)[5000:]]),
                    b"small", None):
        expected = io.BytesIO()
        plain = bytes(records) if isinstance(records, (memoryview, bytearray, RecordChain)) else records
        entity_writer(f.FetchResponse)(expected, fetch_response(plain))
        out = ChunkWriter()
        entity_writer(f.FetchResponse)(out, fetch_response(records))
        chunks = out.chunks()
        assert all(type(c) is bytes for c in chunks)
        assert b"".join(chunks) == expected.getvalue()
        assert out.size == len(expected.getvalue())


def test_a_large_bytes_value_is_passed_through_without_a_copy():
    big = b"x" * 100_000
    out = ChunkWriter()
    entity_writer(f.FetchResponse)(out, fetch_response(big))
    assert any(c is big for c in out.chunks())
