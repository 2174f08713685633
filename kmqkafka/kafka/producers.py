"""InitProducerId (key 22): producer ids for idempotent producers; DescribeProducers (key 61).

Ids are unique for the life of the store and across a cluster: each node hands them out from
blocks it claims with a compare-and-set of the stored block end in the ``txn`` coordinator
family, durable before any id of the block is used, so neither a restart nor another node
ever hands one out again. (Each node used to extend its own block from its own counter, so
two nodes gave out the same ids, and the second producer's acknowledged batches were
dropped as the first one's retries.) A request naming a transactional id goes to the
transaction coordinator (``transactions.py``), relayed to the leader like a group call.

DescribeProducers lists, per requested partition, every producer whose last batch is still in
the partition's producer window (``store/producer_state.py``) with its epoch, last sequence and
the max timestamp of its last batch, and the first offset of its open transaction in that
partition (-1: none; the coordinator epoch is always -1). Every node holds the same state up to
what it applied, so any node answers.

ACLs (as KafkaApis): InitProducerId with a transactional id needs WRITE on that TRANSACTIONAL_ID
(else TRANSACTIONAL_ID_AUTHORIZATION_FAILED); without one, IDEMPOTENT_WRITE on the cluster or
WRITE on any topic (else CLUSTER_AUTHORIZATION_FAILED). DescribeProducers needs READ on each
topic (else its partitions TOPIC_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import os
from typing import Any

from kio.schema.errors import ErrorCode
from twisted.internet.defer import Deferred, DeferredLock
from twisted.logger import Logger
from twisted.python.failure import Failure

from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka import authz
from kmqkafka.kafka.context import RequestContext
from kmqkafka.kafka.errors import KafkaError, error_code_for
from kmqkafka.kafka.topics import TopicCatalog, validate_topic_name
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of
from kmqkafka.store.errors import KeyConflict
from kmqkafka.store.names import channel_for

log = Logger()

API_KEY = 22
DESCRIBE_PRODUCERS = 61
MIN_VERSION = 0
MAX_VERSION = 5
BLOCK = 1000
_CLAIM_TRIES = 16
_KEY = b"producer_id.block_end"
FAMILY = "txn"


class ProducerIds:
    """Allocates producer ids in durable blocks. Reactor thread only."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._lock = DeferredLock()
        self._next: int | None = None
        self._block_end = 0

    def allocate(self) -> Deferred:
        """Fire with a producer id never handed out before."""
        return self._lock.run(self._allocate)

    async def _allocate_async(self) -> int:
        if self._next is None or self._next >= self._block_end:
            self._next, self._block_end = await self._claim_block()
        pid = self._next
        self._next += 1
        return pid

    async def _claim_block(self) -> tuple[int, int]:
        """[start, end) past every block claimed so far, by any node. A lost race (another
        node's claim applied first) is applied here too by the time it fails: read again."""
        for _ in range(_CLAIM_TRIES):
            raw = self._store.keyed_get(FAMILY, _KEY)
            start = int(raw.split()[0]) if raw else 0
            # The claim is unique ("end token"): a compare-and-set passes when the key
            # already holds the value written (a command replayed after a crash), so racing
            # claims that all wrote the bare end all passed and shared one block.
            claim = b"%d %s" % (start + BLOCK, os.urandom(8).hex().encode())
            try:
                await self._store.keyed_put(FAMILY, [(_KEY, claim)], expect=[(_KEY, raw)])
            except KeyConflict:
                continue
            return start, start + BLOCK
        raise KafkaError(ErrorCode.coordinator_load_in_progress,
                         "producer id blocks are being claimed by other nodes; retry")

    def _allocate(self) -> Deferred:
        return Deferred.fromCoroutine(self._allocate_async())


def producer_ids(broker: Any) -> ProducerIds:
    ids = broker.extras.get("producer_ids")
    if ids is None:
        ids = broker.extras["producer_ids"] = ProducerIds(broker.store)
    return ids


def handle(request: Any, ctx: RequestContext) -> Any:
    if request.transactional_id is not None:
        return _transactional(request, ctx)
    if not _may_write_idempotently(ctx):
        return make(ctx.response_type, throttle_time=NO_THROTTLE,
                    error_code=ErrorCode.cluster_authorization_failed, producer_id=-1,
                    producer_epoch=-1)
    # v3+ (KIP-360) may name the producer: KafkaApis refuses a half-named one (an id without
    # an epoch or the reverse) before it reaches the coordinator.
    named_id = getattr(request, "producer_id", -1) != -1
    if named_id != (getattr(request, "producer_epoch", -1) != -1):
        return make(ctx.response_type, throttle_time=NO_THROTTLE,
                    error_code=ErrorCode.invalid_request, producer_id=-1, producer_epoch=-1)
    # Without a transactional id Kafka always answers a new producer id at epoch 0, whatever
    # id and epoch the request names (KIP-360 lets it name them; an idempotent producer bumps
    # its epoch itself): answering that id's next epoch would let any client fence any
    # producer.
    d = producer_ids(ctx.broker).allocate()
    d.addCallback(lambda new_pid: make(
        ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
        producer_id=new_pid, producer_epoch=0))
    return d.addErrback(_refused, ctx)


def _may_write_idempotently(ctx: RequestContext) -> bool:
    """Kafka's rule for an id without a transactional id: IDEMPOTENT_WRITE on the cluster, or
    WRITE on some topic (KIP-679: an idempotent producer needs no more than a writer does)."""
    return (authz.allowed(ctx, authz.IDEMPOTENT_WRITE, authz.CLUSTER, authz.CLUSTER_NAME)
            or authz.allowed_by_type(ctx, authz.WRITE, authz.TOPIC))


def _refused(failure: Failure, ctx: RequestContext) -> Any:
    """No leader, a lost proposal, claims racing: an error the client retries on."""
    code = error_code_for(failure.value)
    if code is ErrorCode.unknown_server_error:
        log.failure("InitProducerId failed", failure)
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=code,
                producer_id=-1, producer_epoch=-1)


def describe(request: Any, ctx: RequestContext) -> Any:
    """DescribeProducers (key 61): every producer a partition knows (module docstring)."""
    t = types_of(ctx)
    topics: TopicCatalog = ctx.broker.extras["topics"]
    machine = ctx.broker.store.machine
    out = []
    for tr in request.topics:
        error, message = ErrorCode.none, None
        if not authz.allowed(ctx, authz.READ, authz.TOPIC, tr.name):
            # Kafka authorizes before it looks the topic up: existing or not, valid or not.
            error = ErrorCode.topic_authorization_failed
        else:
            try:
                validate_topic_name(tr.name)
            except KafkaError as exc:
                error, message = exc.code, exc.message
        topic = topics.get(tr.name) if error is ErrorCode.none else None
        if topic is None and error is ErrorCode.none:
            error = ErrorCode.unknown_topic_or_partition
        parts = []
        for index in tr.partition_indexes:
            if topic is None or not 0 <= index < topic.partitions:
                parts.append(make(t.PartitionResponse, partition_index=index,
                                  error_code=error if topic is None
                                  else ErrorCode.unknown_topic_or_partition,
                                  error_message=message, active_producers=()))
                continue
            log = machine.channels.get(channel_for(topic.name, index))
            producers = getattr(log, "producers", None)
            active = producers.active(log.producer_floor) if producers is not None else []
            txns = getattr(log, "txns", None)
            open_txns = txns.open if txns is not None else {}
            parts.append(make(t.PartitionResponse, partition_index=index,
                              error_code=ErrorCode.none, error_message=None,
                              active_producers=tuple(
                                  make(t.ProducerState, producer_id=pid,
                                       producer_epoch=entry.epoch,
                                       last_sequence=entry.batches[-1].last_seq,
                                       last_timestamp=entry.batches[-1].max_timestamp,
                                       coordinator_epoch=-1,
                                       current_txn_start_offset=open_txns.get(pid, 0) - 1)
                                  for pid, entry in active)))
        out.append(make(t.TopicResponse, name=tr.name, partitions=tuple(parts)))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, topics=tuple(out))


def _transactional(request: Any, ctx: RequestContext) -> Any:
    from kmqkafka.kafka import transactions
    from kmqkafka.kafka.groups import coordinated

    # WRITE on the transactional id is checked in ``transactions.init_producer_id``, where the
    # coordinator runs: ``coordinated`` has restored a relayed request's principal by then.
    return coordinated(transactions.init_producer_id, transactions.init_producer_error)(request,
                                                                                         ctx)


def register(dispatcher: Dispatcher) -> None:
    dispatcher.register(API_KEY, handle, MIN_VERSION, MAX_VERSION)
    dispatcher.register(DESCRIBE_PRODUCERS, describe, 0, 0)
