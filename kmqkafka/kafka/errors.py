"""Kafka-level domain errors: an ErrorCode plus the message Kafka (or the seed) uses."""

from __future__ import annotations

from kio.schema.errors import ErrorCode


class KafkaError(Exception):
    """A failure that maps to one Kafka error code, per partition or per request."""

    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        super().__init__(message or code.name)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"KafkaError({self.code.name}, {self.message!r})"


def error_code_for(exc: BaseException) -> ErrorCode:
    """Map any exception a handler meets to the Kafka error code a client should see."""
    from kmqkafka.records import InvalidBatch, UnsupportedCompression
    from kmqkafka.store import errors as store_errors

    if isinstance(exc, KafkaError):
        return exc.code
    if isinstance(exc, UnsupportedCompression):
        return ErrorCode.unsupported_compression_type
    if isinstance(exc, InvalidBatch):
        return ErrorCode.corrupt_message
    if isinstance(exc, store_errors.OffsetOutOfRange):
        return ErrorCode.offset_out_of_range
    if isinstance(exc, store_errors.ChannelNotFound):
        return ErrorCode.unknown_topic_or_partition
    if isinstance(exc, store_errors.ChannelExists):
        return ErrorCode.topic_already_exists
    if isinstance(exc, (store_errors.ReservedChannel, store_errors.InvalidChannelName)):
        return ErrorCode.invalid_topic_exception
    if isinstance(exc, store_errors.OutOfOrderSequence):
        return ErrorCode.out_of_order_sequence_number
    if isinstance(exc, store_errors.InvalidProducerEpoch):
        return ErrorCode.invalid_producer_epoch
    from kmqkafka.raft import errors as raft_errors

    if isinstance(exc, (raft_errors.NoLeaderError, raft_errors.NotLeaderError)):
        return ErrorCode.not_leader_or_follower
    if isinstance(exc, (raft_errors.CommitTimeout, raft_errors.ProposalLost,
                        raft_errors.TransportError)):
        return ErrorCode.request_timed_out
    if isinstance(exc, store_errors.StoreStopped):
        return ErrorCode.not_leader_or_follower
    if isinstance(exc, store_errors.StoreError):
        return ErrorCode.kafka_storage_error
    return ErrorCode.unknown_server_error
