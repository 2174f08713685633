"""ListConfigResources (74): the resources DescribeConfigs can be asked about, by type.

v0 was Kafka 4.0's ListClientMetricsResources and lists client-metrics resources only (there
are none here). v1 (KIP-1142) lists topics, the brokers and groups; an empty type list means
every type served, and a type that is not served fails the whole request with
UNSUPPORTED_VERSION, as Kafka does. BROKER_LOGGER is not among them: DescribeConfigs does not
serve that type here. Groups live on the Raft leader, so a follower relays the request.
With ACLs on, listing needs DESCRIBE_CONFIGS on the cluster (else CLUSTER_AUTHORIZATION_FAILED
for the whole request), as Kafka checks it for both versions.
"""
from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka import authz, groups, identity
from kmqkafka.kafka.context import RequestContext
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of

LIST_CONFIG_RESOURCES = 74
TOPIC, BROKER, CLIENT_METRICS, GROUP = 2, 4, 16, 32
SERVED = (TOPIC, BROKER, CLIENT_METRICS, GROUP)


def _names(ctx: RequestContext, kind: int) -> list[str]:
    if kind == TOPIC:
        return [topic.name for topic in ctx.broker.extras["topics"].all()]
    if kind == BROKER:
        return [str(node) for node in identity.replica_ids(ctx.broker)]
    if kind == GROUP:
        return groups.group_ids(ctx.broker)
    return []  # CLIENT_METRICS: none are defined here


def list_config_resources(request: Any, ctx: RequestContext) -> Any:
    t = types_of(ctx)
    if not authz.allowed(ctx, authz.DESCRIBE_CONFIGS, authz.CLUSTER, authz.CLUSTER_NAME):
        return make(ctx.response_type, throttle_time=NO_THROTTLE,
                    error_code=ErrorCode.cluster_authorization_failed, config_resources=())
    if ctx.api_version == 0:
        return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                    config_resources=())
    kinds = list(dict.fromkeys(request.resource_types)) or list(SERVED)
    if any(kind not in SERVED for kind in kinds):
        return make(ctx.response_type, throttle_time=NO_THROTTLE,
                    error_code=ErrorCode.unsupported_version, config_resources=())
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                config_resources=tuple(
                    make(t.ConfigResource, resource_name=name, resource_type=kind)
                    for kind in kinds for name in _names(ctx, kind)))


def register(dispatcher: Dispatcher) -> None:
    dispatcher.register(LIST_CONFIG_RESOURCES, groups.coordinated(list_config_resources), 0, 1)
