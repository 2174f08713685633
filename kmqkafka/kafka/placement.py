"""Replica placement admin APIs: AlterPartitionReassignments (45), ListPartitionReassignments
(46) and AlterReplicaLogDirs (34).

Every node holds every partition in its one data dir (the Raft cluster replicates the whole
store), so no replica can move: a reassignment to the replicas a partition already has, or a
log-dir move to the dir it is already in, is the no-op Kafka also answers NONE for; any other
target is refused with Kafka's error for a target it cannot take, and no reassignment is ever
in progress.

With ACLs on, each needs a right on the cluster, as in Kafka: ALTER for AlterReplicaLogDirs
(every partition CLUSTER_AUTHORIZATION_FAILED) and AlterPartitionReassignments (the request
and every partition), DESCRIBE for ListPartitionReassignments (the request).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka import authz, identity
from kmqkafka.kafka.context import RequestContext
from kmqkafka.kafka.topics import TopicCatalog
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of

ALTER_REPLICA_LOG_DIRS = 34
ALTER_PARTITION_REASSIGNMENTS = 45
LIST_PARTITION_REASSIGNMENTS = 46

_CLUSTER_REFUSED = "Cluster authorization failed."


def _on_cluster(ctx: RequestContext, operation: int) -> bool:
    return authz.allowed(ctx, operation, authz.CLUSTER, authz.CLUSTER_NAME)


def _catalog(ctx: RequestContext) -> TopicCatalog:
    return ctx.broker.extras["topics"]


def _has_partition(ctx: RequestContext, topic: str, partition: int) -> bool:
    found = _catalog(ctx).get(topic)
    return found is not None and 0 <= partition < found.partitions


def _reassignment_error(ctx: RequestContext, topic: str, partition: int,
                        target: tuple[int, ...] | None) -> tuple[ErrorCode, str | None]:
    if not _has_partition(ctx, topic, partition):
        return ErrorCode.unknown_topic_or_partition, "This server does not host this topic-partition."
    if target is None:  # a cancellation
        return (ErrorCode.no_reassignment_in_progress,
                f"Unable to cancel reassignment for {topic}-{partition}: no reassignment is "
                "in progress.")
    current = set(identity.replica_ids(ctx.broker))
    if not target or len(set(target)) != len(target):
        return ErrorCode.invalid_replica_assignment, (
            f"The proposed replica assignment {list(target)} is empty or names a broker twice.")
    if set(target) != current:
        return ErrorCode.invalid_replica_assignment, (
            f"Every node replicates every partition here: the replicas of {topic}-{partition} "
            f"are {sorted(current)} and cannot be reassigned.")
    return ErrorCode.none, None


def alter_partition_reassignments(request: Any, ctx: RequestContext) -> Any:
    t = types_of(ctx)
    if not _on_cluster(ctx, authz.ALTER):
        refused = ErrorCode.cluster_authorization_failed
        return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=refused,
                    error_message=_CLUSTER_REFUSED, responses=tuple(
                        make(t.ReassignableTopicResponse, name=rt.name, partitions=tuple(
                            make(t.ReassignablePartitionResponse,
                                 partition_index=rp.partition_index, error_code=refused,
                                 error_message=_CLUSTER_REFUSED) for rp in rt.partitions))
                        for rt in request.topics),
                    allow_replication_factor_change=getattr(
                        request, "allow_replication_factor_change", True))
    out = []
    for rt in request.topics:
        parts = []
        for rp in rt.partitions:
            target = None if rp.replicas is None else tuple(rp.replicas)
            code, message = _reassignment_error(ctx, rt.name, rp.partition_index, target)
            parts.append(make(t.ReassignablePartitionResponse, partition_index=rp.partition_index,
                              error_code=code, error_message=message))
        out.append(make(t.ReassignableTopicResponse, name=rt.name, partitions=tuple(parts)))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                error_message=None, responses=tuple(out),
                allow_replication_factor_change=getattr(
                    request, "allow_replication_factor_change", True))


def list_partition_reassignments(request: Any, ctx: RequestContext) -> Any:
    """Nothing is ever being reassigned, for every partition asked about or for all."""
    if not _on_cluster(ctx, authz.DESCRIBE):
        return make(ctx.response_type, throttle_time=NO_THROTTLE,
                    error_code=ErrorCode.cluster_authorization_failed,
                    error_message=_CLUSTER_REFUSED, topics=())
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                error_message=None, topics=())


def alter_replica_log_dirs(request: Any, ctx: RequestContext) -> Any:
    """NONE for a partition named into the data dir it is in (the path DescribeLogDirs gives);
    LOG_DIR_NOT_FOUND for any other dir, as Kafka answers for a dir not in its log.dirs."""
    t = types_of(ctx)
    if not _on_cluster(ctx, authz.ALTER):  # each partition refused, per dir as asked
        return make(ctx.response_type, throttle_time=NO_THROTTLE, results=tuple(
            make(t.AlterReplicaLogDirTopicResult, topic_name=rt.name, partitions=tuple(
                make(t.AlterReplicaLogDirPartitionResult, partition_index=p,
                     error_code=ErrorCode.cluster_authorization_failed)
                for p in rt.partitions))
            for d in request.dirs for rt in d.topics))
    here = ctx.broker.store.data_dir.resolve()
    results: dict[str, list[Any]] = {}
    for d in request.dirs:
        try:
            same = Path(d.path).resolve() == here
        except (OSError, ValueError):
            same = False
        for rt in d.topics:
            for p in rt.partitions:
                if not same:
                    code = ErrorCode.log_dir_not_found
                elif not _has_partition(ctx, rt.name, p):
                    code = ErrorCode.unknown_topic_or_partition
                else:
                    code = ErrorCode.none
                results.setdefault(rt.name, []).append(
                    make(t.AlterReplicaLogDirPartitionResult, partition_index=p, error_code=code))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, results=tuple(
        make(t.AlterReplicaLogDirTopicResult, topic_name=name, partitions=tuple(parts))
        for name, parts in results.items()))


def register(dispatcher: Dispatcher) -> None:
    dispatcher.register(ALTER_REPLICA_LOG_DIRS, alter_replica_log_dirs, 1, 2)
    dispatcher.register(ALTER_PARTITION_REASSIGNMENTS, alter_partition_reassignments, 0, 1)
    dispatcher.register(LIST_PARTITION_REASSIGNMENTS, list_partition_reassignments, 0, 0)
