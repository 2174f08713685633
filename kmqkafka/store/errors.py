"""Domain errors of the channel store; surfaces map them to wire error codes."""

from __future__ import annotations


class StoreError(Exception):
    """Base class for every error the store reports to a caller."""


class ChannelNotFound(StoreError):
    """The named channel does not exist."""


class ChannelExists(StoreError):
    """A channel with that name already exists."""


class ReservedChannel(StoreError):
    """The name is in the internal ``_kafka.`` namespace, closed to every client surface."""

    def __init__(self, name: str) -> None:
        super().__init__(f"channel {name!r} is reserved for internal use")
        self.name = name


class InvalidChannelName(StoreError):
    """The name is empty, too long or otherwise unusable as a channel."""


class OffsetOutOfRange(StoreError):
    """A read asked for a Sequence outside [log_start, next_sequence]."""

    def __init__(self, sequence: int, log_start: int, next_sequence: int) -> None:
        super().__init__(
            f"sequence {sequence} is outside [{log_start}, {next_sequence}]"
        )
        self.sequence = sequence
        self.log_start = log_start
        self.next_sequence = next_sequence


class CorruptStore(StoreError):
    """Stored bytes failed their checksum where a torn tail cannot explain it."""


class StorageFailure(StoreError):
    """The disk refused a write (e.g. no space left); the command was not applied and the
    store keeps serving (Kafka's KAFKA_STORAGE_ERROR)."""


class StoreStopped(StoreError):
    """The store is shutting down and takes no new work."""


class KeyConflict(StoreError):
    """A compare-and-set on a coordinator key found a different value than expected."""


class OutOfOrderSequence(StoreError):
    """An idempotent producer's batch does not follow its previous one (Kafka's
    OUT_OF_ORDER_SEQUENCE_NUMBER); nothing is stored."""


class InvalidProducerEpoch(StoreError):
    """An idempotent producer's batch carries an epoch older than its latest one (Kafka's
    INVALID_PRODUCER_EPOCH); nothing is stored."""
