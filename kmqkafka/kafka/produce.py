"""Produce (key 0, v3+): client RecordBatches appended to their partition's channel as sent.

Per partition, Kafka's rules (``_check``): exactly one RecordBatch of magic 2 (else
INVALID_RECORD), no zstd before v7 (UNSUPPORTED_COMPRESSION_TYPE), a good CRC (CORRUPT_MESSAGE),
no larger than the topic's ``max.message.bytes`` when set, else
``CONNECTORS_KAFKA_MAX_MESSAGE_BYTES`` (MESSAGE_TOO_LARGE), and an offset range matching its
record count (INVALID_RECORD). Every check runs before anything of that partition is appended,
so a bad partition stores nothing and never fails the other partitions of the request. Records
are decoded only for topics with record-level rules (``_RecordRules``: compacted topics need
keys, timestamp bounds; every refused record is named in ``record_errors``, as Kafka does);
otherwise the only work is the header check and the CRC, and the batch
reaches the store as the very ``bytes`` object kio decoded, with no copy. As Kafka's
ReplicaManager, a refused partition carries an ``error_message`` only when records were refused
(``RejectedRecords``); refusals from inside the log append (``AppendRefused``, the producer's
sequence or epoch, min.insync.replicas) report the log start offset, the rest -1. The store
stamps the partition leader epoch (0) as it writes the batch, as Kafka does. Topics with
``message.timestamp.type=LogAppendTime`` get Kafka's rewrite (timestamp type bit, max
timestamp = broker time, new CRC) in a copy of the batch; on CreateTime topics a batch whose
header max timestamp cannot be right gets it recomputed from its records
(``_with_max_timestamp``). A topic whose ``compression.type`` names a codec gets a batch sent
in another recompressed, on a decoding thread (``_Recompression``), as Kafka's LogValidator
does.

Idempotent producers (a batch with a producer id): the batch must carry a base sequence >= 0
(else INVALID_RECORD); its sequence and epoch are checked by the store when the append is
applied (store/producer_state.py), so the answer is decided in log order on every node:
OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH, or, for a retry of one of the producer's
last five batches, NONE with the original's base offset and nothing stored again (Kafka also
reports the original's max timestamp as the log append time then).

acks: 0 → no response (the connection is closed if a partition failed, as Kafka does);
1 → answered once the batches are in the page cache; -1 → once fsynced (group commit), and
NOT_ENOUGH_REPLICAS without appending while fewer members are in sync (live) than the topic's
``min.insync.replicas``; anything else → INVALID_REQUIRED_ACKS on every partition.

ACLs, checked before anything else as KafkaApis does: a request naming a transactional id
needs WRITE on that TRANSACTIONAL_ID (else every partition TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
each topic needs WRITE (else its partitions TOPIC_AUTHORIZATION_FAILED, whether the topic exists
or not). Auto-creating a missing topic also needs CREATE on the cluster or on the topic; a writer
without it gets UNKNOWN_TOPIC_OR_PARTITION. With acks=0 a refusal closes the connection, as any
other failed partition does.

Ordering: appends are proposed synchronously in request order, so pipelined requests to one
partition keep their order, including on the request that auto-creates the topic (the create
command is applied before the first append is proposed). A compressed batch whose records must
be decoded is decoded on a thread (``decoding``), and later batches to its partition wait
their turn behind it.
"""

from __future__ import annotations

import datetime
import struct
from typing import Any, NamedTuple

from kio.schema.errors import ErrorCode
from twisted.internet.defer import Deferred, DeferredSemaphore, gatherResults, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from kmqkafka import records
from kmqkafka.dispatch import CLOSE_CONNECTION, NO_RESPONSE, Dispatcher
from kmqkafka.kafka import authz, decoding, identity, produce_response
from kmqkafka.kafka.context import RequestContext
from kmqkafka.kafka.errors import KafkaError, error_code_for
from kmqkafka.kafka.topics import (INTERNAL_TOPICS, TOPIC_CONFIG_DEFAULTS, Topic, TopicCatalog,
                                   validate_topic_name)
from kmqkafka.kafka.transactions import txn_coordinator
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of
from kmqkafka.store.names import channel_for

API_KEY = 0
MIN_VERSION = 3
MAX_VERSION = 13

log = Logger()

_ATTRS = struct.Struct(">h")
_UTC = datetime.timezone.utc

# Store refusals Kafka's log raises while appending (the producer's sequence or epoch): the
# answer carries the log start offset, as Kafka's ReplicaManager reports for them.
_IN_APPEND = frozenset({ErrorCode.out_of_order_sequence_number, ErrorCode.invalid_producer_epoch})


class _Answer(NamedTuple):
    """One partition's answer; ``record_errors`` are (batch index, message) of refused records."""

    index: int
    error: ErrorCode
    base_offset: int
    log_start: int
    append_time_ms: int
    message: str | None
    record_errors: tuple[tuple[int, str], ...] = ()


class AppendRefused(KafkaError):
    """A refusal Kafka raises from inside the log append (UnifiedLog, LogValidator's batch
    checks, Partition's min.insync.replicas check) rather than while reading the request.

    Kafka's ReplicaManager answers these with the partition's log start offset and, like
    every refusal but a record-level one, no ``error_message``: the text stays in the
    broker's log (``message``), the client sees the error code."""


class BrokerLimit(KafkaError):
    """A refusal of kmqkafka's own that Kafka never gives: its message is sent, since no
    error code alone explains it."""


class RejectedRecords(KafkaError):
    """Kafka's RecordValidationException: records of the batch broke a topic rule.

    ``record_errors`` names every such record by its index in the batch, as Kafka's
    ``record_errors`` does; clients (kafka-python, the Java producer) fail exactly those records
    with their own message and the rest as innocent members of a refused batch."""

    def __init__(self, code: ErrorCode, message: str,
                 record_errors: tuple[tuple[int, str], ...]) -> None:
        super().__init__(code, message)
        self.record_errors = record_errors


def handle(request: Any, ctx: RequestContext) -> Any:
    """Serve one Produce; returns a Deferred of the response (or of NO_RESPONSE for acks=0)."""
    acks = request.acks
    uses_ids = ctx.api_version >= 13
    topics: TopicCatalog = ctx.broker.extras["topics"]
    per_topic: list[tuple[Any, Deferred]] = []
    # ACLs (KafkaApis): the transactional id first, for the whole request; then WRITE per topic.
    transactional_id = request.transactional_id
    txn_denied = transactional_id is not None and not authz.allowed(
        ctx, authz.WRITE, authz.TRANSACTIONAL_ID, transactional_id)
    for td in request.topic_data:
        topic_key = td.topic_id if uses_ids else td.name
        refused = (ErrorCode.transactional_id_authorization_failed if txn_denied
                   else _write_refused(ctx, topics, topic_key, uses_ids))
        if refused is not None:
            d = succeed([(p.index, refused, -1, -1, -1, None) for p in td.partition_data])
        elif acks not in (0, 1, -1):
            d = succeed([(p.index, ErrorCode.invalid_required_acks, -1, -1, -1, None)
                         for p in td.partition_data])
        else:
            d = _produce_topic(ctx, topics, topic_key, td.partition_data, acks, uses_ids,
                               request.transactional_id)
        per_topic.append((topic_key, d))
    d = _gather([d for _k, d in per_topic])
    if acks == 0:
        # No answer to carry an error: Kafka closes the connection instead, so the client
        # notices (and refreshes its metadata) rather than losing records silently.
        return d.addCallback(lambda results: CLOSE_CONNECTION if any(
            answer[1] is not ErrorCode.none for answers in results for answer in answers)
            else NO_RESPONSE)
    keys = [k for k, _d in per_topic]
    return d.addCallback(_respond, keys, ctx)


def _write_refused(ctx: RequestContext, topics: TopicCatalog, topic_key: Any,
                   uses_ids: bool) -> ErrorCode | None:
    """TOPIC_AUTHORIZATION_FAILED when the principal may not WRITE the topic (known or not,
    valid name or not: Kafka authorizes before it looks), else None. An unknown topic id is
    left to ``_produce_topic`` (UNKNOWN_TOPIC_ID: there is no name to authorize)."""
    if not authz.enabled(ctx):
        return None
    if uses_ids:
        topic = topics.by_id(topic_key) if topic_key is not None else None
        if topic is None:
            return None
        name = topic.name
    else:
        name = topic_key
    if name is None or authz.allowed(ctx, authz.WRITE, authz.TOPIC, name):
        return None
    return ErrorCode.topic_authorization_failed


def _may_create(ctx: RequestContext, name: str) -> bool:
    """May the principal have ``name`` auto-created: CREATE on the cluster or on the topic."""
    return (authz.allowed(ctx, authz.CREATE, authz.CLUSTER, authz.CLUSTER_NAME)
            or authz.allowed(ctx, authz.CREATE, authz.TOPIC, name))


def _produce_topic(ctx: RequestContext, topics: TopicCatalog, topic_key: Any,
                   partitions: tuple[Any, ...], acks: int, uses_ids: bool,
                   transactional: str | None = None) -> Deferred:
    """Fires with the list of ``_Answer`` for one topic's partitions; never fails."""

    def all_failed(code: ErrorCode, message: str | None = None) -> Deferred:
        return succeed([(p.index, code, -1, -1, -1, message) for p in partitions])

    if uses_ids:
        topic = topics.by_id(topic_key) if topic_key is not None else None
        if topic is None:
            return all_failed(ErrorCode.unknown_topic_id)
        if topic.name in INTERNAL_TOPICS:
            return all_failed(ErrorCode.invalid_topic_exception)
        return _produce_partitions(ctx, topic, partitions, acks, transactional)
    try:
        validate_topic_name(topic_key)
    except KafkaError as exc:
        return all_failed(exc.code, exc.message)
    if topic_key in INTERNAL_TOPICS:  # as Kafka's ReplicaManager, whether it exists or not
        return all_failed(ErrorCode.invalid_topic_exception)
    topic = topics.get(topic_key)
    if topic is not None:
        return _produce_partitions(ctx, topic, partitions, acks, transactional)
    if not ctx.broker.settings.kafka_auto_create_topics or not _may_create(ctx, topic_key):
        # The principal may write the topic (``_write_refused``) but not create it.
        return all_failed(ErrorCode.unknown_topic_or_partition)
    try:
        created = topics.create(topic_key)
    except KafkaError as exc:
        if exc.code is not ErrorCode.topic_already_exists:
            return all_failed(exc.code, exc.message)
        created = None
    # A store without Raft applies the create at once: appending now keeps request order.
    topic = topics.get(topic_key)
    if topic is not None:
        d = _produce_partitions(ctx, topic, partitions, acks, transactional)
        if created is not None:
            # Answer only once the topic itself is durable as well.
            d = gatherResults([created, d], consumeErrors=True).addCallback(lambda r: r[1])
            d.addErrback(lambda f: [(p.index, error_code_for(f.value), -1, -1, -1, None)
                                    for p in partitions])
        return d
    assert created is not None

    def lost_race(f: Any) -> Any:
        # Another request's create of this name was ordered first (both were proposed before
        # either applied): produce to the topic it made.
        f.trap(KafkaError)
        existing = topics.get(topic_key)
        if f.value.code is ErrorCode.topic_already_exists and existing is not None:
            return existing
        return f

    def then(t: Topic) -> Deferred:
        return _produce_partitions(ctx, t, partitions, acks, transactional)

    created.addErrback(lost_race)
    created.addCallback(then)
    created.addErrback(lambda f: [(p.index, error_code_for(f.value), -1, -1, -1, None)
                                  for p in partitions])
    return created


def _limit(ctx: RequestContext, topic: Topic) -> int:
    """The topic's max.message.bytes, else the cluster's dynamic message.max.bytes, else the
    start-up setting."""
    explicit = topic.configs.get("max.message.bytes") or topic.defaults.get("max.message.bytes")
    if explicit is not None:
        return int(explicit)
    return ctx.broker.settings.kafka_max_message_bytes


def _produce_partitions(ctx: RequestContext, topic: Topic, partitions: tuple[Any, ...],
                        acks: int, transactional: str | None = None) -> Deferred:
    broker = ctx.broker
    store = broker.store
    version = ctx.api_version
    limit = _limit(ctx, topic)
    segment_bytes = int(topic.config_value("segment.bytes") or _UNBOUNDED)
    log_append = topic.config_value("message.timestamp.type") == "LogAppendTime"
    rules = _RecordRules.of(topic, log_append)
    target = _Recompression.of(topic, limit)
    durable = acks == -1
    short_isr = durable and _short_isr(ctx, topic)
    # The broker's clock, once per request, only for LogAppendTime and timestamp bounds.
    now_ms = int(broker.reactor.seconds() * 1000) if log_append or rules is not None else -1
    metric = broker.metrics.bytes_in(topic.name)
    order, slots = _decoding_state(broker)
    out: list[Deferred] = []
    for p in partitions:
        index = p.index
        if not 0 <= index < topic.partitions:
            out.append(succeed((index, ErrorCode.unknown_topic_or_partition, -1, -1, -1, None)))
            continue
        blob = p.records
        channel = channel_for(topic.name, index)
        if short_isr:
            out.append(succeed((index, ErrorCode.not_enough_replicas, -1,
                                _log_start(store, channel), -1, None)))
            continue
        name = f"{topic.name}-{index}"

        def append(blob: Any, index: int = index, channel: str = channel) -> Deferred:
            """Append the checked batch ``blob`` (or answer the refusal it failed with)."""
            if isinstance(blob, Failure):
                return succeed(_refused(blob, index, channel, store))
            data = _log_append_time(blob, now_ms) if log_append else blob
            d = store.append_batch(channel, data, durable=durable, checked=True)  # by _check
            d.addCallbacks(_appended, _append_failed,
                           callbackArgs=(index, channel, store, now_ms if log_append else -1,
                                         metric, len(blob)),
                           errbackArgs=(index, channel, store))
            return d

        try:
            header = _check(blob, limit, version, segment_bytes, transactional is not None)
            if header.attributes & records.TRANSACTIONAL_FLAG:
                _verify_transaction(broker, transactional, header, topic.name, index)
            blob = _client_timestamp_type(blob, header, log_append)
            recompress = (target if target is not None and target.codec != header.compression
                          else None)
            if header.compression != records.COMPRESSION_NONE or recompress is not None:
                ready = decoding.off_reactor(broker.reactor, slots, _decoded, blob, header,
                                             log_append, rules, now_ms, name, broker.reactor,
                                             recompress)
                out.append(order.run(channel, ready, append))
                continue
            blob = _decoded(blob, header, log_append, rules, now_ms, name, broker.reactor)
        except KafkaError as exc:
            out.append(succeed(_refused(Failure(exc), index, channel, store)))
            continue
        if order.waiting(channel):
            out.append(order.run(channel, succeed(blob), append))
        else:
            out.append(append(blob))
    return _gather(out)


def _gather(results: list[Deferred]) -> Deferred:
    """The results of Deferreds that never fail, in order, once all have fired: one
    callback each and a countdown. A DeferredList (``gatherResults``) costs more than the
    rest of the answer for each partition of a many-partition request; a lone Deferred is
    only wrapped in a list."""
    if len(results) == 1:
        return results[0].addCallback(_listed)
    return _Gathered(results).done


def _listed(result: Any) -> list[Any]:
    return [result]


class _Gathered:
    """``_gather``'s countdown over several Deferreds."""

    __slots__ = ("done", "_out", "_left")

    def __init__(self, results: list[Deferred]) -> None:
        self.done: Deferred = Deferred()
        self._out: list[Any] = [None] * len(results)
        self._left = len(results)
        if not results:
            self.done.callback(self._out)
        for i, d in enumerate(results):
            d.addCallback(self._put, i)

    def _put(self, result: Any, i: int) -> None:
        self._out[i] = result
        self._left -= 1
        if not self._left:
            self.done.callback(self._out)


def _decoded(blob: bytes, header: records.BatchHeader, log_append: bool,
             rules: "_RecordRules | None", now_ms: int, name: str, clock: Any,
             recompress: "_Recompression | None" = None) -> bytes:
    """The checks that may decode the records of ``blob`` (header ``header``), and the batch
    to store; raises ``KafkaError`` for a refusal. Runs on a thread for a compressed batch
    (``decoding``), so it touches nothing shared: every compressed batch is decompressed and
    its records counted there (``records.check_records``), as Kafka's LogValidator does,
    because a batch stored with a payload that does not decompress stopped every consumer of
    its partition at that offset."""
    if header.compression != records.COMPRESSION_NONE:
        try:
            records.check_records(blob, header)
        except records.InvalidBatch as exc:
            raise KafkaError(ErrorCode.corrupt_message, str(exc)) from None
    if recompress is not None:
        blob, header = recompress.apply(blob)
    if not log_append:
        blob = _with_max_timestamp(blob, header, clock)
    if rules is not None:
        newest = rules.check(blob, now_ms, name)
        if newest is not None and not log_append:  # decoded anyway: make it exact
            blob = _set_max_timestamp(blob, newest, clock,
                                      records.read_header(blob).max_timestamp)
    return blob


def _refused(failure: Failure, index: int, channel: str, store: Any) -> _Answer:
    """The answer for a batch refused before its append. As Kafka's ReplicaManager: only a
    refusal of records (RecordValidationException) sends its message, with the bad records;
    it and a refusal from inside the log append report the log start offset; a refusal of
    the request's batch as such (size, CRC, format) reports neither."""
    exc = failure.value
    if isinstance(exc, RejectedRecords):
        return _Answer(index, exc.code, -1, _log_start(store, channel), -1, exc.message,
                       exc.record_errors)
    if isinstance(exc, AppendRefused):
        return _Answer(index, exc.code, -1, _log_start(store, channel), -1, None)
    if isinstance(exc, BrokerLimit):
        return _Answer(index, exc.code, -1, -1, -1, exc.message)
    if isinstance(exc, KafkaError):
        return _Answer(index, exc.code, -1, -1, -1, None)
    log.failure("checking a batch for {channel} failed", failure, channel=channel)
    return _Answer(index, ErrorCode.unknown_server_error, -1, -1, -1, None)


class _RecordRules:
    """Topic rules Kafka checks record by record: a compacted topic takes no record without a
    key, and a CreateTime topic bounds how far record timestamps lie from the broker's clock
    (``message.timestamp.before.max.ms`` / ``after.max.ms``, by default unbounded / one hour
    as in Kafka 4). A batch is
    decoded only when the bounds need it: with no ``before`` bound, a batch whose header's max
    timestamp is within ``after`` is within it record by record."""

    __slots__ = ("compacted", "before_ms", "after_ms")

    def __init__(self, compacted: bool, before_ms: int, after_ms: int) -> None:
        self.compacted = compacted
        self.before_ms = before_ms
        self.after_ms = after_ms

    @classmethod
    def of(cls, topic: Topic, log_append: bool) -> "_RecordRules | None":
        compacted = "compact" in (topic.config_value("cleanup.policy") or "")
        before = after = _UNBOUNDED
        if not log_append:
            before = _timestamp_bound(topic, "message.timestamp.before.max.ms")
            after = _timestamp_bound(topic, "message.timestamp.after.max.ms")
        if not compacted and before == after == _UNBOUNDED:
            return None
        return cls(compacted, before, after)

    def check(self, blob: bytes, now_ms: int, partition: str) -> int | None:
        """Raise ``RejectedRecords`` (or ``KafkaError``) if a record breaks a rule. Returns the
        records' newest timestamp when they were decoded, None when the header sufficed."""
        header = records.read_header(blob)
        if not self.decodes(header, now_ms):
            return None
        count = header.records_count
        if count > MAX_CHECKED_RECORDS:
            # Decoding runs on the reactor: 10 KB of zstd holding 15 M keyed records held it
            # for 55 s. Clients batch far fewer (librdkafka: 10,000 by default).
            raise BrokerLimit(ErrorCode.invalid_record,
                             f"{count} records in one batch; a topic whose records the broker "
                             f"checks takes at most {MAX_CHECKED_RECORDS} per batch")
        refused: list[tuple[int, str]] = []
        late = False
        newest = records.NO_TIMESTAMP
        try:
            for i, record in enumerate(records.iter_records(blob)):
                newest = max(newest, record.timestamp)
                problem = self._problem(record, i, now_ms, partition)
                if problem is not None:
                    late = late or problem[0] is ErrorCode.invalid_timestamp
                    refused.append((i, problem[1]))
        except records.InvalidBatch as exc:
            raise KafkaError(error_code_for(exc), str(exc)) from None
        if refused:
            # Kafka checks every record and, if any timestamp is out of bounds, answers
            # INVALID_TIMESTAMP for the batch (LogValidator.processRecordErrors).
            code = ErrorCode.invalid_timestamp if late else ErrorCode.invalid_record
            raise RejectedRecords(code, refused[0][1], tuple(refused))
        return newest

    def decodes(self, header: records.BatchHeader, now_ms: int) -> bool:
        """``check`` must decode the records of a batch with this header: with no ``before``
        bound on a topic that is not compacted, a batch whose newest record is within
        ``after`` has every record within it."""
        return (self.compacted or self.before_ms != _UNBOUNDED
                or header.max_timestamp - now_ms > self.after_ms)

    def _problem(self, record: Any, i: int, now_ms: int,
                 partition: str) -> tuple[ErrorCode, str] | None:
        """The first rule record ``i`` breaks (its key before its timestamp, as Kafka)."""
        if self.compacted and record.key is None:
            return (ErrorCode.invalid_record, "Compacted topic cannot accept message without "
                    f"key in topic partition {partition}.")
        ts = record.timestamp
        if ts != records.NO_TIMESTAMP and (now_ms - ts > self.before_ms
                                           or ts - now_ms > self.after_ms):
            return (ErrorCode.invalid_timestamp,
                    f"Timestamp {ts} of message with offset {i} is out of range. The "
                    f"timestamp should be within [{now_ms - self.before_ms}, "
                    f"{now_ms + self.after_ms}]")
        return None


class _Recompression(NamedTuple):
    """A topic whose ``compression.type`` names a codec: Kafka's LogValidator stores every
    batch in that codec (``uncompressed``: none), recompressing one the producer sent in
    another at the topic's ``compression.<codec>.level``, and checks the result against
    ``max.message.bytes`` again. Batches already in it are stored as sent."""

    codec: int
    level: int | None
    limit: int

    @classmethod
    def of(cls, topic: Topic, limit: int) -> "_Recompression | None":
        """The topic's recompression, None for ``producer`` (keep what the client sent)."""
        known = _TOPIC_CODECS.get(topic.config_value("compression.type") or "producer")
        if known is None:  # "producer" (validated on the way in: nothing else is stored)
            return None
        codec, level_config = known
        level = int(topic.config_value(level_config) or -1) if level_config else None
        if level == -1 and codec == records.COMPRESSION_GZIP:
            level = None  # gzip's -1 is zlib's own default
        return cls(codec, level, limit)

    def apply(self, blob: bytes) -> tuple[bytes, records.BatchHeader]:
        """The batch in the topic's codec and its header; raises ``KafkaError``."""
        try:
            out = records.recompressed(blob, self.codec, self.level)
        except records.InvalidBatch as exc:
            raise KafkaError(ErrorCode.corrupt_message, str(exc)) from None
        if len(out) > self.limit:
            raise KafkaError(ErrorCode.message_too_large,
                             f"batch of {len(out)} bytes once recompressed exceeds "
                             f"max.message.bytes {self.limit}")
        return out, records.read_header(out)


_TOPIC_CODECS = {
    "uncompressed": (records.COMPRESSION_NONE, None),
    "gzip": (records.COMPRESSION_GZIP, "compression.gzip.level"),
    "snappy": (records.COMPRESSION_SNAPPY, None),
    "lz4": (records.COMPRESSION_LZ4, "compression.lz4.level"),
    "zstd": (records.COMPRESSION_ZSTD, "compression.zstd.level"),
}

_UNBOUNDED = 2**63 - 1
MAX_CHECKED_RECORDS = 200_000


def _timestamp_bound(topic: Topic, name: str) -> int:
    """A timestamp bound of the topic (``_UNBOUNDED``: none): its own, else the default."""
    explicit = topic.configs.get(name)
    return int(explicit if explicit is not None else TOPIC_CONFIG_DEFAULTS[name])


def _short_isr(ctx: RequestContext, topic: Topic) -> bool:
    """Kafka's acks=all refusal applies: the in-sync replicas (the live members) are fewer
    than the topic's ``min.insync.replicas``."""
    min_isr = int(topic.config_value("min.insync.replicas") or 1)
    if min_isr <= 1:
        return False
    _replicas, isr, _offline = identity.replicas(
        ctx.broker, identity.brokers(ctx.broker, ctx.listener))
    return len(isr) < min_isr


def _verify_transaction(broker: Any, transactional_id: str | None,
                        header: records.BatchHeader, topic: str, partition: int) -> None:
    """KIP-890's verification, where this node coordinates transactions (the Raft leader,
    which clients send their Produce to): a transactional batch must come from the id's
    current producer and epoch, for a partition its open transaction added. Otherwise it
    would open a transaction no marker ever ends, holding the last stable offset back for
    good. (A node that does not coordinate stores it unverified, as Kafka before 3.6.)"""
    coordination = broker.extras.get("coordination")
    if "transactions" not in broker.extras or (coordination is not None
                                               and not coordination.serving()):
        return
    meta = txn_coordinator(broker).describe(transactional_id)
    if meta is None or meta.producer_id != header.producer_id \
            or meta.epoch != header.producer_epoch:
        raise KafkaError(ErrorCode.invalid_producer_epoch,
                         f"producer {header.producer_id} epoch {header.producer_epoch} is not "
                         f"the current producer of transactional id {transactional_id!r}")
    if meta.state != "Ongoing" or (topic, partition) not in meta.partitions:
        raise KafkaError(ErrorCode.invalid_txn_state,
                         f"{topic}-{partition} is not part of an ongoing transaction of "
                         f"{transactional_id!r}")


def _check(blob: bytes | None, limit: int, version: int,
           segment_bytes: int, transactional: bool = False) -> records.BatchHeader:
    """Raise KafkaError for the partition unless ``blob`` is one acceptable batch; return its
    header.

    Kafka's rules for Produce v3+ first (``ProduceRequest.validateRecords``): exactly one
    RecordBatch of magic 2 per partition, and no zstd before v7. Then its log checks: a base
    offset of 0, size (max.message.bytes, then segment.bytes), CRC, no control batches, a
    sequence with a producer id, and an offset range that matches the record count (else the
    log would skip offsets)."""
    if not blob:
        raise KafkaError(ErrorCode.invalid_record, f"Produce requests with version {version} "
                         "must have at least one record batch per partition")
    n = len(blob)
    if n > 16 and blob[16] != records.MAGIC_V2:
        raise KafkaError(ErrorCode.invalid_record, f"Produce requests with version {version} "
                         "are only allowed to contain record batches with magic version 2")
    if n < records.HEADER_SIZE:
        raise KafkaError(ErrorCode.corrupt_message, "record set shorter than a batch header")
    view = memoryview(blob)
    header = records.read_header(view)
    if header.attributes & records.TRANSACTIONAL_FLAG and not transactional:
        # KafkaApis checks the transactional id of a request with transactional batches
        # before anything else: a request without one is not authorized to write them.
        raise KafkaError(ErrorCode.transactional_id_authorization_failed,
                         "transactional batches need the request's transactional id")
    if version < 7 and header.compression == records.COMPRESSION_ZSTD:
        raise KafkaError(ErrorCode.unsupported_compression_type,
                         f"Produce requests with version {version} are not allowed to use "
                         "ZStandard compression")
    if header.size < n:
        raise KafkaError(ErrorCode.invalid_record, f"Produce requests with version {version} "
                         "are only allowed to contain exactly one record batch per partition")
    if header.base_offset != 0:
        raise AppendRefused(ErrorCode.invalid_record, "The baseOffset of the record batch should "
                         f"be 0, but it is {header.base_offset}")
    if header.size > limit:
        raise KafkaError(ErrorCode.message_too_large,
                         f"batch of {header.size} bytes exceeds max.message.bytes {limit}")
    if header.size > segment_bytes:
        raise KafkaError(ErrorCode.record_list_too_large,
                         f"Message batch size is {header.size} bytes which exceeds the maximum "
                         f"configured segment size of {segment_bytes}.")
    try:
        header = records.validate_batch(view)
    except records.InvalidBatch as exc:
        raise KafkaError(error_code_for(exc), str(exc)) from None
    if header.attributes & records.CONTROL_FLAG:
        raise AppendRefused(ErrorCode.invalid_record,
                            "Clients are not allowed to write control records")
    if header.producer_id >= 0 and header.base_sequence < 0:
        raise AppendRefused(ErrorCode.invalid_record,
                         f"Invalid sequence number {header.base_sequence} in record batch "
                         f"with producerId {header.producer_id}")
    if header.records_count <= 0 or header.last_offset_delta + 1 != header.records_count:
        raise AppendRefused(ErrorCode.invalid_record,
                         f"Inconsistent batch offset range [0, {header.last_offset_delta}] "
                         f"and count of records {header.records_count}")
    return header


def _client_timestamp_type(blob: bytes, header: records.BatchHeader, log_append: bool) -> bytes:
    """A client batch with the LogAppendTime bit set, as Kafka's LogValidator takes it: on a
    LogAppendTime topic (or with no timestamp to go by) every record is refused with
    INVALID_TIMESTAMP; on a CreateTime topic the batch is stored as CreateTime (the bit
    cleared in a copy, as ``setMaxTimestamp(CREATE_TIME, ...)`` does), so its records read
    back with their own timestamps."""
    if not header.attributes & records.TIMESTAMP_TYPE_LOG_APPEND or header.is_control:
        return blob
    if log_append or header.max_timestamp == records.NO_TIMESTAMP:
        why = "Producer should not set timestamp type to LogAppendTime."
        raise RejectedRecords(
            ErrorCode.invalid_timestamp, f"Invalid timestamp type in message 0. {why}",
            tuple((i, f"Invalid timestamp type in message {i}. {why}")
                  for i in range(max(header.records_count, 1))))
    return _rewritten(blob, attributes=header.attributes & ~records.TIMESTAMP_TYPE_LOG_APPEND)


def _with_max_timestamp(blob: bytes, header: records.BatchHeader, clock: Any) -> bytes:
    """``blob``, or a copy whose header's max timestamp is the records' own, as Kafka stores a
    CreateTime batch (LogValidator recomputes it from the records). Retention, time lookups
    and the timestamp bounds read that header field; a client that leaves it unset (sarama
    1.22 sends -1) dated its batches to 1970, so the next retention run deleted them, with
    acks=all. Only a header that cannot be right (below the first timestamp, or negative) is
    recomputed here: the hot path decodes no records. (A header that claims a later max than
    its records' is made exact by ``_RecordRules`` when it decodes them: past the topic's
    ``after`` bound it must. One between its first record's and its true max is kept.)"""
    if not _max_timestamp_wrong(header):
        return blob
    try:
        newest = max((r.timestamp for r in records.iter_records(blob)), default=-1)
    except records.InvalidBatch as exc:
        raise KafkaError(error_code_for(exc), str(exc)) from None
    return _set_max_timestamp(blob, newest, clock, header.max_timestamp)


def _max_timestamp_wrong(header: records.BatchHeader) -> bool:
    """The header's max timestamp cannot be its records' (below the first, or negative)."""
    return header.max_timestamp < max(header.base_timestamp, 0) and not header.is_control


def _decoding_state(broker: Any) -> tuple[decoding.PartitionOrder, DeferredSemaphore]:
    """The broker's append order and decoder slots, made on first use."""
    state = broker.extras.get(_DECODING)
    if state is None:
        state = broker.extras[_DECODING] = (decoding.PartitionOrder(),
                                            DeferredSemaphore(decoding.DECODERS))
    return state


_DECODING = "produce_decoding"


def _set_max_timestamp(blob: bytes, newest: int, clock: Any, current: int) -> bytes:
    """``blob`` with ``newest`` as its header's max timestamp (``current`` now), in a copy
    with a new CRC when that changes it. Records without any timestamp (``newest`` < 0) get
    the broker's clock, so they age from when they were stored: Kafka falls back to the
    segment file's modification time, which differs from node to node."""
    if newest < 0:
        newest = int(clock.seconds() * 1000)
    return blob if current == newest else _rewritten(blob, max_timestamp=newest)


def _log_append_time(blob: bytes, now_ms: int) -> bytes:
    """Kafka's LogAppendTime rewrite of a batch: the timestamp-type bit, max timestamp = broker
    time, a new CRC (in a copy)."""
    (attrs,) = _ATTRS.unpack_from(blob, 21)
    return _rewritten(blob, attributes=attrs | records.TIMESTAMP_TYPE_LOG_APPEND,
                      max_timestamp=now_ms)


def _rewritten(blob: bytes, *, attributes: int | None = None,
               max_timestamp: int | None = None) -> bytes:
    """A copy of the batch ``blob`` with the header fields given replaced and its CRC (which
    covers them) recomputed."""
    return records.resealed(bytearray(blob), attributes=attributes, max_timestamp=max_timestamp)


def _log_start(store: Any, channel: str) -> int:
    """The partition's log start offset, -1 if the store cannot say."""
    try:
        return store.bounds(channel).log_start - 1
    except Exception:
        return -1


def _appended(result: Any, index: int, channel: str, store: Any, now_ms: int, metric: Any,
              size: int) -> _Answer:
    """The append was applied: ``size`` bytes count in ``metric`` (as Kafka's bytes-in, only
    what was stored). The topic may have been deleted right after it (before this answer):
    the records were still stored, so NONE, with an unknown log start."""
    metric.inc(size)
    if result.duplicate:
        now_ms = result.max_timestamp  # as Kafka answers a duplicate (UnifiedLog.append)
    return (index, ErrorCode.none, result.first_sequence - 1, _log_start(store, channel),
            now_ms, None)


def _append_failed(failure: Any, index: int, channel: str, store: Any) -> _Answer:
    exc = failure.value
    inner = getattr(exc, "subFailure", None)  # FirstError from gatherResults
    if inner is not None:
        exc = inner.value
    code = error_code_for(exc)
    if code is ErrorCode.unknown_server_error:
        log.failure("append to {channel} failed", failure, channel=channel)
    log_start = _log_start(store, channel) if code in _IN_APPEND else -1
    return (index, code, -1, log_start, -1, None)


def _respond(per_topic: list[list[_Answer]], keys: list[Any], ctx: RequestContext) -> Any:
    t = types_of(ctx)
    uses_ids = ctx.api_version >= 13
    part_cls = t.PartitionProduceResponse
    topic_cls = t.TopicProduceResponse
    error_cls = getattr(t, "BatchIndexAndErrorMessage", None)  # v8+
    out = []
    for key, answers in zip(keys, per_topic):
        parts = tuple(_partition_response(part_cls, error_cls, _Answer(*a)) for a in answers)
        if uses_ids:
            out.append(topic_cls(topic_id=key, partition_responses=parts))
        else:
            out.append(topic_cls(name=key, partition_responses=parts))
    return make(ctx.response_type, responses=tuple(out), throttle_time=NO_THROTTLE)


def _partition_response(part_cls: type, error_cls: type | None, a: _Answer) -> Any:
    """One PartitionProduceResponse; record errors exist from v8 (``error_cls`` None before)."""
    errors = () if error_cls is None else tuple(
        make(error_cls, batch_index=i, batch_index_error_message=m) for i, m in a.record_errors)
    append_time = (None if a.append_time_ms < 0 else
                   datetime.datetime.fromtimestamp(a.append_time_ms / 1000, _UTC))
    return make(part_cls, index=a.index, error_code=a.error, base_offset=a.base_offset,
                log_append_time=append_time, log_start_offset=a.log_start,
                record_errors=errors, error_message=a.message)


def register(dispatcher: Dispatcher) -> None:
    """Register Produce v3..v13 (clipped to what kio provides), answered through the
    hand-written response encoder."""
    produce_response.install()
    dispatcher.register(API_KEY, handle, MIN_VERSION, MAX_VERSION)
