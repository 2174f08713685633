"""The ACL APIs, and the authorized-operations values handlers report.

DescribeAcls (29), CreateAcls (30) and DeleteAcls (31) read and change the stored bindings
(``acl_store``) when the authorizer is on (``CONNECTORS_KAFKA_ACL_ENABLE``): describing needs
DESCRIBE on the cluster, changing needs ALTER, as in Kafka. Without an authorizer they answer
SECURITY_DISABLED, Kafka's answer when none is configured. The SCRAM credential APIs live in
``security.py``. ElectLeaders (43) lives here too: with one leader for every partition there is
never an election to run, so each named partition answers ELECTION_NOT_NEEDED, as Kafka does when
the preferred replica already leads (the leader is listed first, as the preferred replica:
``identity.replicas``).
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka import authz
from kmqkafka.kafka.acl_store import StoredAcls
from kmqkafka.kafka.authorizer import AclBinding, AclFilter
from kmqkafka.kafka.context import RequestContext
from kmqkafka.kafka.topics import TopicCatalog
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of

DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31
ELECT_LEADERS = 43

NOT_REQUESTED = -2147483648  # the authorized-operations value when a client did not ask


_NO_AUTHORIZER = "No Authorizer is configured."


def operations(requested: bool, ops: int) -> int:
    """``ops`` if the client asked for authorized operations, else Kafka's "not requested"."""
    return ops if requested else NOT_REQUESTED


def authorized_operations(ctx: RequestContext, requested: bool, resource_type: int,
                          name: str) -> int:
    """An authorized-operations field: the principal's operations on the resource if the
    client asked (every supported one without an authorizer), else "not requested"."""
    return authz.operations(ctx, resource_type, name) if requested else NOT_REQUESTED


def _filter(f: Any) -> AclFilter:
    return AclFilter(f.resource_type_filter, f.resource_name_filter, f.pattern_type_filter,
                     f.principal_filter, f.host_filter, f.operation, f.permission_type)


def _refused(ctx: RequestContext, operation: int) -> tuple[ErrorCode, str] | None:
    """SECURITY_DISABLED without an authorizer; CLUSTER_AUTHORIZATION_FAILED when the
    principal may not do ``operation`` on the cluster; else None."""
    if not authz.enabled(ctx):
        return ErrorCode.security_disabled, _NO_AUTHORIZER
    if not authz.allowed(ctx, operation, authz.CLUSTER, authz.CLUSTER_NAME):
        return ErrorCode.cluster_authorization_failed, "Cluster authorization failed."
    return None


def _stored(ctx: RequestContext) -> StoredAcls:
    return ctx.broker.extras["authorizer"].acls


def describe_acls(request: Any, ctx: RequestContext) -> Any:
    """The bindings a filter selects, grouped by resource pattern (DESCRIBE on the cluster)."""
    t = types_of(ctx)
    refused = _refused(ctx, authz.DESCRIBE)
    if refused is None:
        selector = _filter(request)
        problem = selector.problem()
        if problem is not None:
            refused = ErrorCode.invalid_request, problem
    if refused is not None:
        return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=refused[0],
                    error_message=refused[1], resources=())
    grouped: dict[tuple[int, str, int], list[AclBinding]] = {}
    for b in _stored(ctx).rules().bindings:
        if selector.matches(b):
            grouped.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(b)
    resources = tuple(
        make(t.DescribeAclsResource, resource_type=rt, resource_name=name, pattern_type=pt,
             acls=tuple(make(t.AclDescription, principal=b.principal, host=b.host,
                             operation=b.operation, permission_type=b.permission)
                        for b in bindings))
        for (rt, name, pt), bindings in grouped.items())
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                error_message=None, resources=resources)


def create_acls(request: Any, ctx: RequestContext) -> Any:
    """Store every valid binding in one command (ALTER on the cluster); an invalid one gets
    INVALID_REQUEST alone, as Kafka's controller answers."""
    t = types_of(ctx)

    def respond(results: list[tuple[ErrorCode, str | None]]) -> Any:
        return make(ctx.response_type, throttle_time=NO_THROTTLE, results=tuple(
            make(t.AclCreationResult, error_code=code, error_message=message)
            for code, message in results))

    refused = _refused(ctx, authz.ALTER)
    if refused is not None:
        return respond([refused] * len(request.creations))
    results: list[tuple[ErrorCode, str | None]] = []
    accepted: list[AclBinding] = []
    for c in request.creations:
        b = AclBinding(c.resource_type, c.resource_name, c.resource_pattern_type, c.principal,
                       c.host, c.operation, c.permission_type)
        problem = b.problem()
        results.append((ErrorCode.none, None) if problem is None
                       else (ErrorCode.invalid_request, problem))
        if problem is None:
            accepted.append(b)

    def failed(failure: Any) -> Any:
        message = failure.getErrorMessage()
        return respond([(ErrorCode.unknown_server_error, message) if code == ErrorCode.none
                        else (code, why) for code, why in results])

    return _stored(ctx).create(accepted).addCallbacks(lambda _: respond(results), failed)


def delete_acls(request: Any, ctx: RequestContext) -> Any:
    """Remove what each filter selects (ALTER on the cluster), in one command; each filter's
    result lists the bindings it removed."""
    t = types_of(ctx)

    def result(code: ErrorCode, message: str | None, removed: Any = ()) -> Any:
        return make(t.DeleteAclsFilterResult, error_code=code, error_message=message,
                    matching_acls=tuple(
                        make(t.DeleteAclsMatchingAcl, error_code=ErrorCode.none,
                             error_message=None, resource_type=b.resource_type,
                             resource_name=b.resource_name, pattern_type=b.pattern_type,
                             principal=b.principal, host=b.host, operation=b.operation,
                             permission_type=b.permission) for b in removed))

    def respond(results: list[Any]) -> Any:
        return make(ctx.response_type, throttle_time=NO_THROTTLE, filter_results=tuple(results))

    refused = _refused(ctx, authz.ALTER)
    if refused is not None:
        return respond([result(*refused) for _ in request.filters])
    bindings = _stored(ctx).rules().bindings
    per_filter: list[tuple[str | None, list[AclBinding]]] = []
    for f in request.filters:
        selector = _filter(f)
        problem = selector.problem()
        per_filter.append((problem, [] if problem else [b for b in bindings
                                                        if selector.matches(b)]))
    doomed = [b for problem, matched in per_filter for b in matched]

    def done(_: Any) -> Any:
        return respond([result(ErrorCode.none, None, matched) if problem is None
                        else result(ErrorCode.invalid_request, problem)
                        for problem, matched in per_filter])

    def failed(failure: Any) -> Any:
        return respond([result(ErrorCode.unknown_server_error, failure.getErrorMessage())
                        if problem is None else result(ErrorCode.invalid_request, problem)
                        for problem, _matched in per_filter])

    return _stored(ctx).delete(doomed).addCallbacks(done, failed)


def elect_leaders(request: Any, ctx: RequestContext) -> Any:
    """Named partitions: ELECTION_NOT_NEEDED, or UNKNOWN_TOPIC_OR_PARTITION. All partitions
    (null): nothing to report, since Kafka lists only the elections it ran."""
    t = types_of(ctx)
    if not authz.allowed(ctx, authz.ALTER, authz.CLUSTER, authz.CLUSTER_NAME):
        return make(ctx.response_type, throttle_time=NO_THROTTLE,
                    error_code=ErrorCode.cluster_authorization_failed,
                    replica_election_results=())
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
