"""Transaction APIs (KIP-98): InitProducerId with a transactional id (22), AddPartitionsToTxn
(24), AddOffsetsToTxn (25), EndTxn (26), TxnOffsetCommit (28), DescribeTransactions (65),
ListTransactions (66).

Thin handlers over ``kmqkafka.coordinators.transactions.TxnCoordinator``, which lives at
``broker.extras["transactions"]`` on the node that serves coordinators (the Raft leader, as for
groups: FindCoordinator with key type 1 names it). Every handler is ``coordinated``: a call that
reaches a follower is relayed to the leader. Errors Kafka reports under older names for older
versions are mapped here (PRODUCER_FENCED is INVALID_PRODUCER_EPOCH before the versions that
know it).

ACLs, as Kafka's KafkaApis: InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn and
TxnOffsetCommit need WRITE on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
AddPartitionsToTxn also WRITE on each topic (a refused or unknown one fails the whole call, the
other partitions answering OPERATION_NOT_ATTEMPTED); AddOffsetsToTxn and TxnOffsetCommit READ on
the group (GROUP_AUTHORIZATION_FAILED), TxnOffsetCommit READ on each topic. DescribeTransactions
needs DESCRIBE on each id and lists only the topics the principal may describe;
ListTransactions lists only the ids it may describe.
"""
from __future__ import annotations

import datetime
from typing import Any

from kio.schema.errors import ErrorCode
from twisted.internet.defer import Deferred
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from kmqkafka.coordinators.group import ClassicGroup
from kmqkafka.coordinators.transactions import STATES, TxnCoordinator, TxnError
from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka import authz
from kmqkafka.kafka.context import Broker, RequestContext
from kmqkafka.kafka.errors import error_code_for
from kmqkafka.kafka.groups import coordinated, coordinator
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of

log = Logger()

INIT_PRODUCER_ID, ADD_PARTITIONS, ADD_OFFSETS, END_TXN, TXN_OFFSET_COMMIT = 22, 24, 25, 26, 28
DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 65, 66
_EXPIRY_CHECK_S = 1.0

# The first version of each API whose clients know PRODUCER_FENCED (KIP-588); older ones get
# INVALID_PRODUCER_EPOCH, as Kafka answers them.
_FENCED_SINCE = {INIT_PRODUCER_ID: 4, ADD_PARTITIONS: 2, ADD_OFFSETS: 2, END_TXN: 2,
                 TXN_OFFSET_COMMIT: 2}


def install(broker: Broker) -> TxnCoordinator:
    """Create the broker's transaction coordinator (idempotent) and its time-out loop, so
    that a transaction left open before a restart is aborted even if its producer never
    comes back. Safe before the store has started: state is loaded on first use."""
    txn = broker.extras.get("transactions")
    if txn is None:
        from kmqkafka.kafka.producers import producer_ids

        def partition_count(topic: str) -> int | None:
            found = broker.extras["topics"].get(topic)
            return None if found is None else found.partitions

        def offsets_committed(group_id: str, recs: list) -> None:
            groups = coordinator(broker)
            for key, value in recs:
                groups.offsets.replay(key, value)
            cg = broker.extras.get("consumer_groups")
            if group_id not in groups.groups and (cg is None or group_id not in cg.groups):
                groups.groups[group_id] = ClassicGroup(group_id)

        txn = TxnCoordinator(broker.store, producer_ids(broker).allocate, partition_count,
                             offsets_committed)
        broker.extras["transactions"] = txn
        _abort_expired_periodically(broker, txn)
    return txn


def txn_coordinator(broker: Broker) -> TxnCoordinator:
    """The loaded transaction coordinator of ``broker``."""
    txn = install(broker)
    if not txn.loaded:
        txn.load()
    return txn


def _abort_expired_periodically(broker: Broker, txn: TxnCoordinator) -> None:
    """Kafka's transaction.abort.timed.out.transaction.cleanup.interval.ms, run where the
    coordinator serves (its aborts replicate like any other write)."""
    def run() -> None:
        coordination = broker.extras.get("coordination")
        if not getattr(broker.store, "started", False) or (
                coordination is not None and not coordination.serving()):
            return
        txn_coordinator(broker).abort_expired().addErrback(
            lambda f: log.warn("aborting timed-out transactions failed: {error}",
                               error=f.getErrorMessage()))
    loop = LoopingCall(run)
    loop.clock = broker.reactor
    loop.start(_EXPIRY_CHECK_S, now=False)
    broker.extras["txn_expiry"] = loop


# A write of the coordinator's that failed, as Kafka's TransactionStateManager reports it to
# the client: leadership lost -> look for the coordinator again; timed out -> retry.
_WRITE_ERRORS = {ErrorCode.not_leader_or_follower: ErrorCode.not_coordinator,
                 ErrorCode.request_timed_out: ErrorCode.coordinator_not_available}


def _code(failure: Failure, ctx: RequestContext) -> ErrorCode:
    if failure.check(TxnError):
        code = failure.value.code
    else:
        code = error_code_for(failure.value)
        code = _WRITE_ERRORS.get(code, code)
        if code is ErrorCode.unknown_server_error:
            log.failure("transaction call {api} failed", failure, api=ctx.api_key)
    if code is ErrorCode.producer_fenced and ctx.api_version < _FENCED_SINCE.get(ctx.api_key, 0):
        code = ErrorCode.invalid_producer_epoch
    return code


# --- InitProducerId ---------------------------------------------------------------------


def _may_write(ctx: RequestContext, transactional_id: str) -> bool:
    """WRITE on the transactional id: what a transactional producer needs for every call."""
    return authz.allowed(ctx, authz.WRITE, authz.TRANSACTIONAL_ID, transactional_id)


def _may_read_group(ctx: RequestContext, group_id: str) -> bool:
    return authz.allowed(ctx, authz.READ, authz.GROUP, group_id)


def init_producer_id(request: Any, ctx: RequestContext) -> Deferred | Any:
    if not _may_write(ctx, request.transactional_id):
        return init_producer_error(request, ctx, ErrorCode.transactional_id_authorization_failed)
    d = txn_coordinator(ctx.broker).init_producer(
        request.transactional_id, int(_ms(request.transaction_timeout)),
        int(getattr(request, "producer_id", -1)), int(getattr(request, "producer_epoch", -1)))

    def ok(ids: tuple[int, int]) -> Any:
        return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                    producer_id=ids[0], producer_epoch=ids[1])

    def failed(f: Failure) -> Any:
        return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=_code(f, ctx),
                    producer_id=-1, producer_epoch=-1)
    return d.addCallbacks(ok, failed)


def _ms(value: Any) -> int:
    if hasattr(value, "total_seconds"):
        return int(value.total_seconds() * 1000)
    return int(value)


def init_producer_error(request: Any, ctx: RequestContext, code: ErrorCode) -> Any:
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=code, producer_id=-1,
                producer_epoch=-1)


# --- AddPartitionsToTxn -----------------------------------------------------------------


def add_partitions(request: Any, ctx: RequestContext) -> Deferred | Any:
    wanted = [(t.name, int(p)) for t in request.v3_and_below_topics for p in t.partitions]
    if not _may_write(ctx, request.v3_and_below_transactional_id):
        return _partition_results(request, ctx, ErrorCode.transactional_id_authorization_failed)
    names = sorted({name for name, _ in wanted})
    writable = set(authz.filtered(ctx, authz.WRITE, authz.TOPIC, names))
    if len(writable) < len(names):
        # Kafka adds none of the partitions then: the refused ones say why, the unknown ones
        # too, and the others were not attempted.
        catalog = ctx.broker.extras["topics"]

        def verdict(name: str, index: int) -> ErrorCode:
            if name not in writable:
                return ErrorCode.topic_authorization_failed
            found = catalog.get(name)
            if found is None or not 0 <= index < found.partitions:
                return ErrorCode.unknown_topic_or_partition
            return ErrorCode.operation_not_attempted

        return _partition_results(request, ctx, {tp: verdict(*tp) for tp in wanted})
    d = txn_coordinator(ctx.broker).add_partitions(
        request.v3_and_below_transactional_id, int(request.v3_and_below_producer_id),
        int(request.v3_and_below_producer_epoch), wanted)
    d.addCallback(lambda codes: _partition_results(request, ctx, codes))
    return d.addErrback(lambda f: _partition_results(request, ctx, _code(f, ctx)))


def _partition_results(request: Any, ctx: RequestContext,
                       codes: dict[tuple[str, int], ErrorCode] | ErrorCode) -> Any:
    t = types_of(ctx)
    topics = []
    for topic in request.v3_and_below_topics:
        parts = tuple(
            make(t.AddPartitionsToTxnPartitionResult, partition_index=int(p),
                 partition_error_code=codes if isinstance(codes, ErrorCode)
                 else codes[(topic.name, int(p))])
            for p in topic.partitions)
        topics.append(make(t.AddPartitionsToTxnTopicResult, name=topic.name,
                           results_by_partition=parts))
    return make(ctx.response_type, throttle_time=NO_THROTTLE,
                results_by_topic_v3_and_below=tuple(topics))


def add_partitions_error(request: Any, ctx: RequestContext, code: ErrorCode) -> Any:
    return _partition_results(request, ctx, code)


# --- AddOffsetsToTxn / EndTxn -----------------------------------------------------------


def _top_level(d: Deferred, ctx: RequestContext) -> Deferred:
    d.addCallback(lambda _: make(ctx.response_type, throttle_time=NO_THROTTLE,
                                 error_code=ErrorCode.none))
    return d.addErrback(lambda f: make(ctx.response_type, throttle_time=NO_THROTTLE,
                                       error_code=_code(f, ctx)))


def add_offsets(request: Any, ctx: RequestContext) -> Deferred | Any:
    refused = None
    if not _may_write(ctx, request.transactional_id):
        refused = ErrorCode.transactional_id_authorization_failed
    elif not _may_read_group(ctx, request.group_id):
        refused = ErrorCode.group_authorization_failed
    if refused is not None:
        return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=refused)
    return _top_level(txn_coordinator(ctx.broker).add_offsets(
        request.transactional_id, int(request.producer_id), int(request.producer_epoch),
        request.group_id), ctx)


def end_txn(request: Any, ctx: RequestContext) -> Deferred | Any:
    if not _may_write(ctx, request.transactional_id):
        return make(ctx.response_type, throttle_time=NO_THROTTLE,
                    error_code=ErrorCode.transactional_id_authorization_failed)
    return _top_level(txn_coordinator(ctx.broker).end(
        request.transactional_id, int(request.producer_id), int(request.producer_epoch),
        bool(request.committed)), ctx)


# --- TxnOffsetCommit --------------------------------------------------------------------


def txn_offset_commit(request: Any, ctx: RequestContext) -> Deferred | Any:
    if not _may_write(ctx, request.transactional_id):
        return _commit_results(request, ctx, {}, ErrorCode.transactional_id_authorization_failed)
    if not _may_read_group(ctx, request.group_id):
        return _commit_results(request, ctx, {}, ErrorCode.group_authorization_failed)
    broker = ctx.broker
    topics = broker.extras["topics"]
    readable = set(authz.filtered(ctx, authz.READ, authz.TOPIC,
                                  sorted({topic.name for topic in request.topics})))
    errors: dict[tuple[str, int], ErrorCode] = {}
    pending = []
    for topic in request.topics:
        found = topics.get(topic.name) if topic.name in readable else None
        for p in topic.partitions:
            index = int(p.partition_index)
            if topic.name not in readable:
                errors[(topic.name, index)] = ErrorCode.topic_authorization_failed
                continue
            if found is None or not 0 <= index < found.partitions:
                errors[(topic.name, index)] = ErrorCode.unknown_topic_or_partition
                continue
            pending.append((topic.name, index, int(p.committed_offset),
                            int(getattr(p, "committed_leader_epoch", -1)),
                            p.committed_metadata))
    if not pending and len(readable) < len({topic.name for topic in request.topics}):
        # Nothing left to commit once refused topics are set aside: as in Kafka, the
        # coordinator is not asked.
        return _commit_results(request, ctx, errors, ErrorCode.none)
    group_error = _check_member(request, ctx)
    if group_error is not ErrorCode.none:
        return _commit_results(request, ctx, errors, group_error)
    d = txn_coordinator(broker).commit_offsets(
        request.transactional_id, int(request.producer_id), int(request.producer_epoch),
        request.group_id, pending)
    d.addCallback(lambda _: _commit_results(request, ctx, errors, ErrorCode.none))
    return d.addErrback(lambda f: _commit_results(request, ctx, errors, _code(f, ctx)))


def _check_member(request: Any, ctx: RequestContext) -> ErrorCode:
    """v3 (KIP-447) names the consumer's member and generation: a zombie of an old
    generation is refused as OffsetCommit would refuse it."""
    generation = int(getattr(request, "generation_id", -1))
    member_id = getattr(request, "member_id", "") or ""
    if generation < 0 and not member_id:
        return ErrorCode.none
    cg = ctx.broker.extras.get("consumer_groups")
    if cg is not None and request.group_id in getattr(cg, "groups", {}):
        return ErrorCode.none  # KIP-848 members are checked by their epoch on commit
    groups = coordinator(ctx.broker)
    code, _group = groups.validate_commit(request.group_id, generation, member_id,
                                          getattr(request, "group_instance_id", None))
    return code


def _commit_results(request: Any, ctx: RequestContext, errors: dict, code: ErrorCode) -> Any:
    t = types_of(ctx)
    return make(ctx.response_type, throttle_time=NO_THROTTLE, topics=tuple(
        make(t.TxnOffsetCommitResponseTopic, name=topic.name, partitions=tuple(
            make(t.TxnOffsetCommitResponsePartition, partition_index=int(p.partition_index),
                 error_code=errors.get((topic.name, int(p.partition_index)), code))
            for p in topic.partitions))
        for topic in request.topics))


def txn_offset_commit_error(request: Any, ctx: RequestContext, code: ErrorCode) -> Any:
    return _commit_results(request, ctx, {}, code)


# --- DescribeTransactions / ListTransactions --------------------------------------------


def describe_transactions(request: Any, ctx: RequestContext) -> Any:
    t = types_of(ctx)
    txn = txn_coordinator(ctx.broker)
    out = []
    for tid in request.transactional_ids:
        if not authz.allowed(ctx, authz.DESCRIBE, authz.TRANSACTIONAL_ID, tid):
            out.append(make(t.TransactionState,
                            error_code=ErrorCode.transactional_id_authorization_failed,
                            transactional_id=tid, transaction_state="",
                            transaction_timeout=_timeout(0), transaction_start_time=_time(0),
                            producer_id=-1, producer_epoch=-1, topics=()))
            continue
        meta = txn.describe(tid)
        if meta is None:
            out.append(make(t.TransactionState, error_code=ErrorCode.transactional_id_not_found,
                            transactional_id=tid, transaction_state="",
                            transaction_timeout=_timeout(0), transaction_start_time=_time(0),
                            producer_id=-1, producer_epoch=-1, topics=()))
            continue
        by_topic: dict[str, list[int]] = {}
        for topic, p in meta.partitions:
            by_topic.setdefault(topic, []).append(p)
        # Only the topics the principal may describe are listed.
        by_topic = {name: ps for name, ps in by_topic.items()
                    if authz.allowed(ctx, authz.DESCRIBE, authz.TOPIC, name)}
        out.append(make(t.TransactionState, error_code=ErrorCode.none, transactional_id=tid,
                        transaction_state=meta.state,
                        transaction_timeout=_timeout(meta.timeout_ms),
                        transaction_start_time=_time(meta.start_ms),
                        producer_id=meta.producer_id,
                        producer_epoch=meta.epoch, topics=tuple(
                            make(t.TopicData, topic=name, partitions=tuple(ps))
                            for name, ps in by_topic.items())))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, transaction_states=tuple(out))


def describe_error(request: Any, ctx: RequestContext, code: ErrorCode) -> Any:
    t = types_of(ctx)
    return make(ctx.response_type, throttle_time=NO_THROTTLE, transaction_states=tuple(
        make(t.TransactionState, error_code=code, transactional_id=tid, transaction_state="",
             transaction_timeout=_timeout(0), transaction_start_time=_time(0),
             producer_id=-1, producer_epoch=-1, topics=()) for tid in request.transactional_ids))


def _timeout(ms: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=ms)


def _time(ms: int) -> datetime.datetime:
    """kio's datetime for an epoch-millisecond field (Kafka's -1, "no transaction", included:
    an unknown id answers 0, the schema's default)."""
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)


def list_transactions(request: Any, ctx: RequestContext) -> Any:
    t = types_of(ctx)
    txn = txn_coordinator(ctx.broker)
    states = set(request.state_filters or ())
    pids = {int(p) for p in request.producer_id_filters or ()}
    min_ms = int(getattr(request, "duration_filter", -1))
    now = ctx.broker.store.now_ms()
    rows = []
    for meta in txn.txns.values():
        if states and meta.state not in states:
            continue
        if pids and meta.producer_id not in pids:
            continue
        if min_ms >= 0 and (meta.state != "Ongoing" or now - meta.start_ms < min_ms):
            continue
        if not authz.allowed(ctx, authz.DESCRIBE, authz.TRANSACTIONAL_ID,
                             meta.transactional_id):
            continue
        rows.append(make(t.TransactionState, transactional_id=meta.transactional_id,
                         producer_id=meta.producer_id, transaction_state=meta.state))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                unknown_state_filters=tuple(s for s in states if s not in STATES),
                transaction_states=tuple(rows))


def register(dispatcher: Dispatcher) -> None:
    dispatcher.register(ADD_PARTITIONS, coordinated(add_partitions, add_partitions_error), 0, 3)
    dispatcher.register(ADD_OFFSETS, coordinated(add_offsets), 0, 3)
    dispatcher.register(END_TXN, coordinated(end_txn), 0, 3)
    dispatcher.register(TXN_OFFSET_COMMIT,
                        coordinated(txn_offset_commit, txn_offset_commit_error), 0, 3)
    dispatcher.register(DESCRIBE_TRANSACTIONS, coordinated(describe_transactions,
                                                           describe_error), 0, 0)
    dispatcher.register(LIST_TRANSACTIONS, coordinated(list_transactions), 0, 1)
