"""Positional questions about a partition: ListOffsets (key 2, v1+) and OffsetForLeaderEpoch (23).

ListOffsets, per partition (offset = Sequence - 1, only durable data counts):

* ``-2`` EARLIEST and ``-4`` EARLIEST_LOCAL → log start offset (timestamp -1);
* ``-1`` LATEST → high watermark (timestamp -1);
* ``-3`` MAX_TIMESTAMP → the record with the largest timestamp and that timestamp (-1/-1 when
  the partition is empty);
* ``-5`` LATEST_TIERED and ``-6`` EARLIEST_PENDING_UPLOAD → -1/-1 (there is no tiered storage);
* a timestamp ``>= 0`` → the first record whose timestamp is at least it, with the record's own
  timestamp; -1/-1 when there is none, as Kafka answers.

READ_COMMITTED is answered like READ_UNCOMMITTED (no open transactions exist yet).

The leader epoch is the Raft term (``identity.leader_epoch``; 0 on a lone node). A
``current_leader_epoch`` above it gets UNKNOWN_LEADER_EPOCH, one below it other than -1 (no
check) FENCED_LEADER_EPOCH. Every stored batch carries epoch 0 (no committed record is ever
truncated), so OffsetForLeaderEpoch follows Kafka's epoch-cache lookup over epoch 0 from offset
0 and the current epoch from the end: the current epoch → (it, high watermark); an epoch from 0
up to it → (0, high watermark); a higher epoch or -1 → (-1, -1); another negative one → that
epoch with end offset 0. ListOffsets LATEST names the current epoch, as Kafka's does (the
latest in its cache), every other answer epoch 0.

ACLs: both need DESCRIBE on each topic (OffsetForLeaderEpoch also passes with CLUSTER_ACTION on
the cluster), else its partitions answer TOPIC_AUTHORIZATION_FAILED, existing or not.

On a cluster both are answered by the partition leader, as in Kafka (whose followers refuse a
consumer's ListOffsets and OffsetForLeaderEpoch): a follower relays them (``leader_routed``),
and the leader answers once it has applied all it knows to be committed (``settled_first``).
A follower's own applied end may still lack a record the leader has acknowledged: answered
there, ListOffsets LATEST disagreed between nodes right after an ack, and a consumer
validating its position (KIP-320) could take the shorter end for a truncated log.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kio.schema.errors import ErrorCode

from kmqkafka import records
from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka import authz, identity
from kmqkafka.kafka.context import RequestContext
from kmqkafka.kafka.errors import error_code_for
from kmqkafka.kafka.groups import leader_routed
from kmqkafka.kafka.topics import TopicCatalog
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of
from kmqkafka.store.names import channel_for

LIST_OFFSETS = 2
OFFSET_FOR_LEADER_EPOCH = 23

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
EARLIEST_PENDING_UPLOAD = -6


def _epoch_error(current: int, epoch: int) -> ErrorCode | None:
    """Kafka's leader-epoch check of a request's ``current_leader_epoch`` against ``epoch``."""
    if current == -1:
        return None
    if current > epoch:
        return ErrorCode.unknown_leader_epoch
    if current < epoch:
        return ErrorCode.fenced_leader_epoch
    return None


def _channel(topics: TopicCatalog, name: str, partition: int) -> str | None:
    topic = topics.get(name) if name else None
    if topic is None or not 0 <= partition < topic.partitions:
        return None
    return channel_for(topic.name, partition)


# --- ListOffsets ----------------------------------------------------------------------------


def offset_for(store: Any, channel: str, timestamp: int,
               committed: bool = False) -> tuple[int, int]:
    """(timestamp, offset) that ListOffsets answers for ``timestamp``; raises StoreError.
    ``committed`` (isolation READ_COMMITTED): nothing at or past the last stable offset."""
    b = store.bounds(channel)
    # Sequence of the first record not yet durable (or, read_committed, not yet stable)
    hw = store.stable_end(channel) if committed else b.high_watermark
    if timestamp == LATEST:
        return -1, hw - 1
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return -1, b.log_start - 1
    if timestamp in (LATEST_TIERED, EARLIEST_PENDING_UPLOAD):
        return -1, -1
    if timestamp == MAX_TIMESTAMP:
        found = store.max_timestamp(channel)
        if found is None or found[1] >= hw:
            return -1, -1
        return found[0], found[1] - 1
    seq = store.sequence_for_timestamp(channel, max(timestamp, 0))
    if seq is None or seq >= hw:
        return -1, -1
    return _record_timestamp(store, channel, seq), seq - 1


def _record_timestamp(store: Any, channel: str, seq: int) -> int:
    """Timestamp of the record at ``seq`` (decodes only the one batch holding it)."""
    rr = store.read(channel, seq, 1)
    for batch in rr.batches:
        header = records.read_header(batch)
        if header.attributes & records.TIMESTAMP_TYPE_LOG_APPEND:
            return header.max_timestamp
        for rec in records.iter_records(batch):
            if rec.offset + 1 == seq:
                return rec.timestamp
    return -1


def list_offsets(request: Any, ctx: RequestContext) -> Any:
    """ListOffsets: per-partition answers, never failing the whole request."""
    t = types_of(ctx)
    store = ctx.broker.store
    topics: TopicCatalog = ctx.broker.extras["topics"]
    part_cls = t.ListOffsetsPartitionResponse
    epoch = identity.leader_epoch(ctx.broker)
    committed = getattr(request, "isolation_level", 0) == 1
    # As Kafka: every occurrence of a partition named more than once is INVALID_REQUEST.
    named = Counter((topic.name, p.partition_index)
                    for topic in request.topics for p in topic.partitions)
    out = []
    for topic in request.topics:
        parts = []
        denied = not authz.allowed(ctx, authz.DESCRIBE, authz.TOPIC, topic.name)
        for p in topic.partitions:
            index = p.partition_index
            code: ErrorCode | None = _epoch_error(getattr(p, "current_leader_epoch", -1), epoch)
            ts, offset = -1, -1
            if denied:  # Kafka authorizes first: neither duplicates nor epochs are looked at
                code = ErrorCode.topic_authorization_failed
            elif named[topic.name, index] > 1:
                code = ErrorCode.invalid_request
            channel = _channel(topics, topic.name, index)
            if code is None and channel is None:
                code = ErrorCode.unknown_topic_or_partition
            if code is None:
                try:
                    ts, offset = offset_for(store, channel, p.timestamp, committed)
                    code = ErrorCode.none
                except Exception as exc:
                    code = error_code_for(exc)
            parts.append(make(part_cls, partition_index=index, error_code=code, timestamp=ts,
                              offset=offset,
                              leader_epoch=-1 if offset < 0 else
                              epoch if p.timestamp == LATEST else 0))
        out.append(make(t.ListOffsetsTopicResponse, name=topic.name, partitions=tuple(parts)))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, topics=tuple(out))


# --- OffsetForLeaderEpoch -------------------------------------------------------------------


def epoch_end(requested_epoch: int, high_watermark: int, current_epoch: int = 0
              ) -> tuple[int, int]:
    """(epoch, end offset) for ``requested_epoch`` from an epoch cache holding epoch 0 at
    offset 0 and ``current_epoch`` at the end (no records are stamped with a later epoch)."""
    if requested_epoch == -1 or requested_epoch > current_epoch:
        return -1, -1
    if requested_epoch == current_epoch:
        return current_epoch, high_watermark
    if requested_epoch >= 0:
        return 0, high_watermark
    return requested_epoch, 0


def offset_for_leader_epoch(request: Any, ctx: RequestContext) -> Any:
    """OffsetForLeaderEpoch: end offset of the requested epoch, per partition."""
    t = types_of(ctx)
    store = ctx.broker.store
    topics: TopicCatalog = ctx.broker.extras["topics"]
    part_cls = t.EpochEndOffset
    current = identity.leader_epoch(ctx.broker)
    # Kafka: CLUSTER_ACTION on the cluster (what brokers used it for) covers every topic;
    # otherwise a consumer (KIP-320) needs DESCRIBE on each.
    by_topic = not authz.allowed(ctx, authz.CLUSTER_ACTION, authz.CLUSTER, authz.CLUSTER_NAME)
    out = []
    for topic in request.topics:
        parts = []
        denied = by_topic and not authz.allowed(ctx, authz.DESCRIBE, authz.TOPIC, topic.topic)
        for p in topic.partitions:
            code = (ErrorCode.topic_authorization_failed if denied
                    else _epoch_error(p.current_leader_epoch, current))
            epoch, end = -1, -1
            channel = _channel(topics, topic.topic, p.partition)
            if code is None and channel is None:
                code = ErrorCode.unknown_topic_or_partition
            if code is None:
                try:
                    epoch, end = epoch_end(p.leader_epoch,
                                           store.bounds(channel).high_watermark - 1, current)
                    code = ErrorCode.none
                except Exception as exc:
                    code = error_code_for(exc)
            parts.append(make(part_cls, error_code=code, partition=p.partition,
                              leader_epoch=epoch, end_offset=end))
        out.append(make(t.OffsetForLeaderTopicResult, topic=topic.topic, partitions=tuple(parts)))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, topics=tuple(out))


def register(dispatcher: Dispatcher) -> None:
    """Register ListOffsets v1..v10 and OffsetForLeaderEpoch v2..v4 (clipped to kio). The
    table matches Kafka 4.1 (ListOffsets v11 came with 4.2, and with it OffsetCommit v10)."""
    dispatcher.register(LIST_OFFSETS, leader_routed(identity.settled_first(list_offsets)), 1, 10)
    dispatcher.register(OFFSET_FOR_LEADER_EPOCH,
                        leader_routed(identity.settled_first(offset_for_leader_epoch)), 2, 4)
