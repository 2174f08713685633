"""A broker without an authorizer: the answers Apache Kafka gives when none is configured.

Every client may do everything, so the authorized-operations fields (Metadata, DescribeCluster,
DescribeGroups, ConsumerGroupDescribe) carry every operation of the resource type when asked;
the ACL APIs DescribeAcls (29), CreateAcls (30) and DeleteAcls (31) answer SECURITY_DISABLED
(the SCRAM credential APIs live in ``security.py``). ElectLeaders (43) lives here too: with one
leader for every partition there is never an election to run, so each named partition answers
ELECTION_NOT_NEEDED, as Kafka does when the preferred replica already leads (the leader
is listed first, as the preferred replica: ``identity.replicas``).
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka.context import RequestContext
from kmqkafka.kafka.topics import TopicCatalog
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of

DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31
ELECT_LEADERS = 43

NOT_REQUESTED = -2147483648  # the authorized-operations value when a client did not ask


def _ops(*codes: int) -> int:
    return sum(1 << c for c in codes)


# AclOperation codes: READ 3, WRITE 4, CREATE 5, DELETE 6, ALTER 7, DESCRIBE 8,
# CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11, IDEMPOTENT_WRITE 12.
# Each set is Kafka's AclEntry.supportedOperations for the resource type, what it reports with
# no authorizer: the token operations (CREATE_TOKENS, DESCRIBE_TOKENS) belong to USER, not
# CLUSTER, and a group has config operations since Kafka 4's group configs.
TOPIC_OPERATIONS = _ops(3, 4, 5, 6, 7, 8, 10, 11)
CLUSTER_OPERATIONS = _ops(5, 7, 8, 9, 10, 11, 12)
GROUP_OPERATIONS = _ops(3, 6, 8, 10, 11)

_NO_AUTHORIZER = "No Authorizer is configured."


def operations(requested: bool, ops: int) -> int:
    """``ops`` if the client asked for authorized operations, else Kafka's "not requested"."""
    return ops if requested else NOT_REQUESTED


def describe_acls(request: Any, ctx: RequestContext) -> Any:
    return make(ctx.response_type, throttle_time=NO_THROTTLE,
                error_code=ErrorCode.security_disabled, error_message=_NO_AUTHORIZER,
                resources=())


def create_acls(request: Any, ctx: RequestContext) -> Any:
    t = types_of(ctx)
    return make(ctx.response_type, throttle_time=NO_THROTTLE, results=tuple(
        make(t.AclCreationResult, error_code=ErrorCode.security_disabled,
             error_message=_NO_AUTHORIZER)
        for _ in request.creations))


def delete_acls(request: Any, ctx: RequestContext) -> Any:
    t = types_of(ctx)
    return make(ctx.response_type, throttle_time=NO_THROTTLE, filter_results=tuple(
        make(t.DeleteAclsFilterResult, error_code=ErrorCode.security_disabled,
             error_message=_NO_AUTHORIZER, matching_acls=())
        for _ in request.filters))


def elect_leaders(request: Any, ctx: RequestContext) -> Any:
    """Named partitions: ELECTION_NOT_NEEDED, or UNKNOWN_TOPIC_OR_PARTITION. All partitions
    (null): nothing to report, since Kafka lists only the elections it ran."""
    t = types_of(ctx)
    topics: TopicCatalog = ctx.broker.extras["topics"]
    out = []
    for tp in request.topic_partitions or ():
        topic = topics.get(tp.topic)
        results = []
        for p in tp.partitions:
            if topic is None or not 0 <= p < topic.partitions:
                code, message = (ErrorCode.unknown_topic_or_partition,
                                 "This server does not host this topic-partition.")
            else:
                code, message = (ErrorCode.election_not_needed,
                                 "Leader election not needed for topic partition.")
            results.append(make(t.PartitionResult, partition_id=p, error_code=code,
                                error_message=message))
        out.append(make(t.ReplicaElectionResult, topic=tp.topic,
                        partition_result=tuple(results)))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                replica_election_results=tuple(out))


def register(dispatcher: Dispatcher) -> None:
    dispatcher.register(DESCRIBE_ACLS, describe_acls, 1, 3)
    dispatcher.register(CREATE_ACLS, create_acls, 1, 3)
    dispatcher.register(DELETE_ACLS, delete_acls, 1, 3)
    dispatcher.register(ELECT_LEADERS, elect_leaders, 0, 2)
