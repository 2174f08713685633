"""Configs: DescribeConfigs (32), AlterConfigs (33), IncrementalAlterConfigs (44).

Topic resources are served in full from the ``TopicCatalog``: an explicitly set
config is a DYNAMIC_TOPIC_CONFIG, anything else is the broker's DEFAULT_CONFIG.
Changes go through ``TopicCatalog.set_configs``, which also rewrites the LogConfig
of every partition's channel (retention, segment size, cleanup policy, max
message size take effect on the store).

Broker resources describe the daemon's settings. The broker configs that supply topic
configs' defaults (``log.retention.ms``, ``log.cleanup.policy``, ``message.max.bytes``, ...)
can be changed at runtime as Kafka's dynamic defaults, cluster-wide (resource name ``""``,
``kafka-configs --entity-type brokers --entity-default``; DYNAMIC_DEFAULT_BROKER_CONFIG) or for
this broker (its id; DYNAMIC_BROKER_CONFIG, which wins): stored and replicated in the topic
catalog (``TopicCatalog.set_cluster_defaults``), they apply at once to every topic that does
not override them. On a cluster every node holds every partition, so a per-broker value could
not differ from the rest: there only the cluster-wide default can be changed. Any other broker
config answers INVALID_REQUEST (set those in the environment, options or the TOML file).
Group resources (Kafka 4's per-group session timeout and heartbeat interval) are described
and altered through ``kafka.group_configs``. Other resource types are INVALID_REQUEST.

With ACLs on (``kafka.authz``) each resource is authorized as Kafka 4 does: describing needs
DESCRIBE_CONFIGS and altering ALTER_CONFIGS, on the topic (else TOPIC_AUTHORIZATION_FAILED), on
the group (else GROUP_AUTHORIZATION_FAILED), or on the cluster for the broker-wide types
(BROKER, BROKER_LOGGER, CLIENT_METRICS: else CLUSTER_AUTHORIZATION_FAILED). A refused resource
is answered alone; the rest of the request goes on.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from kio.schema.errors import ErrorCode
from twisted.internet.defer import Deferred, gatherResults, maybeDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from kmqkafka.coordinators.migration import DEFAULT_POLICY
from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka import authz, identity
from kmqkafka.kafka.context import RequestContext
from kmqkafka.kafka.errors import KafkaError, error_code_for
from kmqkafka.kafka.topics import (OFFSETS_TOPIC_PARTITIONS, TOPIC_CONFIG_DEFAULTS, Topic,
                                   TopicCatalog, validate_topic_name)
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of

log = Logger()

DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 33, 44

# ConfigResource.Type
RESOURCE_TOPIC, RESOURCE_BROKER, RESOURCE_BROKER_LOGGER, RESOURCE_CLIENT_METRICS = 2, 4, 8, 16
RESOURCE_GROUP = 32
# ConfigSource
SOURCE_DYNAMIC_TOPIC, SOURCE_DYNAMIC_BROKER, SOURCE_DYNAMIC_DEFAULT_BROKER = 1, 2, 3
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT, SOURCE_DYNAMIC_GROUP = 5, 8
# ConfigType
UNKNOWN, BOOLEAN, STRING, INT, SHORT, LONG, DOUBLE, LIST = 0, 1, 2, 3, 4, 5, 6, 7
# AlterConfigOp.OpType
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3

_TOPIC_TYPES: dict[str, int] = {
    "cleanup.policy": LIST, "compression.type": STRING, "index.interval.bytes": INT,
    "max.message.bytes": INT, "message.timestamp.type": STRING,
    "min.cleanable.dirty.ratio": DOUBLE, "min.insync.replicas": INT, "preallocate": BOOLEAN,
    "segment.bytes": INT, "segment.index.bytes": INT, "unclean.leader.election.enable": BOOLEAN,
    "message.downconversion.enable": BOOLEAN, "compression.gzip.level": INT,
    "compression.lz4.level": INT, "compression.zstd.level": INT,
    "follower.replication.throttled.replicas": LIST,
    "leader.replication.throttled.replicas": LIST, "remote.storage.enable": BOOLEAN,
    "remote.log.copy.disable": BOOLEAN, "remote.log.delete.on.disable": BOOLEAN,
}  # every other topic config is a LONG

# Topic config -> the broker config that supplies its default (Kafka's synonym).
_BROKER_SYNONYM: dict[str, str] = {
    "cleanup.policy": "log.cleanup.policy",
    "compression.type": "compression.type",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "file.delete.delay.ms": "log.segment.delete.delay.ms",
    "flush.messages": "log.flush.interval.messages",
    "flush.ms": "log.flush.interval.ms",
    "index.interval.bytes": "log.index.interval.bytes",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "max.message.bytes": "message.max.bytes",
    "message.timestamp.type": "log.message.timestamp.type",
    "message.timestamp.before.max.ms": "log.message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms": "log.message.timestamp.after.max.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "min.insync.replicas": "min.insync.replicas",
    "preallocate": "log.preallocate",
    "retention.bytes": "log.retention.bytes",
    "retention.ms": "log.retention.ms",
    "segment.bytes": "log.segment.bytes",
    "segment.index.bytes": "log.index.size.max.bytes",
    "segment.jitter.ms": "log.roll.jitter.ms",
    "segment.ms": "log.roll.ms",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
    "message.downconversion.enable": "log.message.downconversion.enable",
    "compression.gzip.level": "compression.gzip.level",
    "compression.lz4.level": "compression.lz4.level",
    "compression.zstd.level": "compression.zstd.level",
    "local.retention.bytes": "log.local.retention.bytes",
    "local.retention.ms": "log.local.retention.ms",
}
# The broker configs that may change at runtime (dynamic defaults, per broker or cluster-wide),
# and the topic config each is the default of (Kafka's DynamicLogConfig: the first synonym).
_DYNAMIC_DEFAULTS = {broker: topic for topic, broker in _BROKER_SYNONYM.items()}
# Kafka's broker defaults for these are set in hours (the *.ms synonyms default to null,
# and Kafka lists only synonyms that have a value).
_HOURS_SYNONYM = {"retention.ms": "log.retention.hours", "segment.ms": "log.roll.hours",
                  "segment.jitter.ms": "log.roll.jitter.hours"}
# log.flush.interval.ms defaults to null, so Kafka names the scheduler's interval instead.
_NULL_SYNONYM = {"flush.ms": "log.flush.scheduler.interval.ms"}
_HOUR_MS = 3600 * 1000


def _default_synonym(name: str, default: str) -> tuple[str, str] | None:
    """The broker config Kafka reports as supplying topic config ``name``'s default, with its
    value; None where the broker has no such config (tiered storage, throttles)."""
    hours = _HOURS_SYNONYM.get(name)
    if hours is not None and default.lstrip("-").isdigit() and int(default) % _HOUR_MS == 0:
        return hours, str(int(default) // _HOUR_MS)
    if name in _NULL_SYNONYM:
        return _NULL_SYNONYM[name], default
    broker = _BROKER_SYNONYM.get(name)
    return None if broker is None else (broker, default)

_DOCS: dict[str, str] = {
    "cleanup.policy": "delete, compact or both: how old segments of each partition's channel "
                      "are cleaned.",
    "retention.ms": "Longest time a segment is kept (the channel's MaxAge); -1 keeps forever.",
    "retention.bytes": "Largest size of a partition before old segments go (the channel's "
                       "MaxBytes); -1 means no limit.",
    "segment.bytes": "Size at which a partition's channel rolls to a new segment.",
    "segment.ms": "Age at which a partition's channel rolls to a new segment.",
    "max.message.bytes": "Largest record batch a partition accepts.",
    "delete.retention.ms": "How long a tombstone survives after the clean that first kept it.",
    "compression.type": "Codec batches are stored with; 'producer' keeps what the client sent, "
                        "a codec (or 'uncompressed') recompresses batches sent in another.",
    "compression.gzip.level": "gzip level for broker-side recompression.",
    "compression.lz4.level": "lz4 level for broker-side recompression.",
    "compression.zstd.level": "zstd level for broker-side recompression.",
    "file.delete.delay.ms": "Delay before a deleted segment's files go (accepted; deletion is "
                            "immediate here).",
    "flush.messages": "Records between forced flushes; acknowledged batches are fsynced by "
                      "the group commit regardless.",
    "flush.ms": "Time between forced flushes; acknowledged batches are fsynced by the group "
                "commit regardless.",
    "follower.replication.throttled.replicas": "Replicas whose follower traffic is throttled "
                                               "(accepted; Raft replication is not throttled).",
    "leader.replication.throttled.replicas": "Replicas whose leader traffic is throttled "
                                             "(accepted; Raft replication is not throttled).",
    "index.interval.bytes": "Bytes between entries of a segment's sparse offset index.",
    "local.retention.bytes": "Tiered storage: bytes kept locally (accepted; no tiered "
                             "storage here).",
    "local.retention.ms": "Tiered storage: time kept locally (accepted; no tiered storage "
                          "here).",
    "max.compaction.lag.ms": "Longest a record may stay uncompacted: a compacted partition "
                             "rolls, and is cleaned whatever its dirty ratio, once its oldest "
                             "dirty record is this old.",
    "min.compaction.lag.ms": "Shortest time a record stays uncompacted: segments holding "
                             "newer records are not cleaned yet.",
    "min.cleanable.dirty.ratio": "Share of not-yet-cleaned bytes in the closed segments that "
                                 "makes a partition due for compaction.",
    "message.downconversion.enable": "Down-conversion for old fetch versions (accepted; "
                                     "fetch v4 and later need none).",
    "message.timestamp.type": "CreateTime keeps the producer's timestamps; LogAppendTime "
                              "stamps the broker's clock on every batch it stores.",
    "message.timestamp.before.max.ms": "How far before the broker's clock a CreateTime "
                                       "timestamp may be (INVALID_TIMESTAMP beyond).",
    "message.timestamp.after.max.ms": "How far after the broker's clock a CreateTime "
                                      "timestamp may be (INVALID_TIMESTAMP beyond).",
    "min.insync.replicas": "Live replicas (Raft members) an acks=all write needs, else "
                           "NOT_ENOUGH_REPLICAS.",
    "preallocate": "Preallocate segment files (accepted; segments grow as written).",
    "remote.storage.enable": "Tiered storage switch: only false here (no tiered storage; "
                             "true is INVALID_CONFIG, as on a Kafka broker without it).",
    "remote.log.copy.disable": "Tiered storage copy switch (accepted; no tiered storage).",
    "remote.log.delete.on.disable": "Tiered storage clean-up switch (accepted; no tiered "
                                    "storage).",
    "segment.index.bytes": "Largest offset index of a segment (accepted; indexes grow with "
                           "their segment).",
    "segment.jitter.ms": "Random jitter on segment.ms rolls (accepted; rolls are exact).",
    "unclean.leader.election.enable": "Electing an out-of-sync replica (never here: Raft "
                                      "elects only complete logs).",
}

_BROKER_DOCS: dict[str, str] = {
    "advertised.listeners": "Endpoints clients are told to use (CONNECTORS_KAFKA_ADVERTISED_"
                            "HOST/PORT).",
    "auto.create.topics.enable": "Whether Metadata and Produce create unknown topics.",
    "broker.id": "This node's id (KMQKAFKA_NODE_ID).",
    "default.replication.factor": "Replication factor of new topics: every Raft member "
                                  "holds every partition.",
    "group.max.session.timeout.ms": "Longest session timeout a classic group member may ask "
                                    "for.",
    "group.min.session.timeout.ms": "Shortest session timeout a classic group member may ask "
                                    "for.",
    "listeners": "Addresses the Kafka listeners bind.",
    "log.dirs": "The data dir holding every channel (KMQKAFKA_DATA_DIR).",
    "max.connections": "Kafka connections this node accepts at once.",
    "node.id": "This node's id (KMQKAFKA_NODE_ID).",
    "num.partitions": "Partition count of auto-created topics and of CreateTopics without one.",
    "offsets.retention.check.interval.ms": "How often expired offsets and empty groups are "
                                           "removed.",
    "offsets.retention.minutes": "Committed offsets of a group left empty this long (or of "
                                 "topics it no longer reads) are deleted, then the group.",
    "offsets.topic.replication.factor": "Committed offsets live in the replicated store, not "
                                        "in a topic.",
    "offsets.topic.num.partitions": "Partitions __consumer_offsets is shown with (it stays "
                                    "empty: offsets live in the replicated store).",
    "delete.topic.enable": "DeleteTopics deletes topics (always on).",
    "connections.max.idle.ms": "Idle time after which a Kafka connection is closed.",
    "group.initial.rebalance.delay.ms": "How long a new classic group waits for more members "
                                        "before its first rebalance.",
    "group.consumer.session.timeout.ms": "Session timeout of KIP-848 consumer group members.",
    "group.consumer.heartbeat.interval.ms": "Heartbeat interval of KIP-848 consumer group "
                                            "members.",
    "group.consumer.migration.policy": "Both ways (Kafka 4's default): a KIP-848 member "
                                       "joining a classic group converts it to a consumer "
                                       "group that keeps the classic members, and the group "
                                       "turns classic again when its last KIP-848 member "
                                       "leaves.",
    "log.cleaner.backoff.ms": "Pause of the cleaner when no partition is due for compaction.",
    "connections.max.reauth.ms": "How long a SASL session lasts before the client must "
                                 "authenticate again (KIP-368; 0: sessions do not expire).",
    "sasl.enabled.mechanisms": "The SASL mechanisms both Kafka listeners ask for.",
    "sasl.oauthbearer.jwks.endpoint.url": "Where the keys that sign OAUTHBEARER tokens are "
                                          "read from.",
    "sasl.oauthbearer.jwks.endpoint.refresh.ms": "How often that key set is read again.",
    "sasl.oauthbearer.expected.audience": "Audiences an OAUTHBEARER token must name one of "
                                          "(empty: not checked).",
    "sasl.oauthbearer.expected.issuer": "The issuer an OAUTHBEARER token must name (empty: "
                                        "not checked).",
    "log.retention.check.interval.ms": "How often retention is enforced on every partition.",
    "authorizer.class.name": "The authorizer checking ACLs: Kafka's StandardAuthorizer rule "
                             "while CONNECTORS_KAFKA_ACL_ENABLE is on, none (empty) otherwise.",
    "super.users": "Principals every ACL check lets through (CONNECTORS_KAFKA_SUPER_USERS); "
                   "hidden, as Kafka hides a setting its broker config does not define.",
    "allow.everyone.if.no.acl.found": "Whether a resource no ACL names is open to everyone "
                                      "(CONNECTORS_KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND); "
                                      "hidden, as Kafka hides a setting its broker config does "
                                      "not define.",
    "transaction.state.log.replication.factor": "Producer state lives in the replicated "
                                                "store, not in a topic.",
}


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One described config, independent of the wire version."""

    name: str
    value: str | None
    source: int
    read_only: bool
    config_type: int
    synonyms: tuple[tuple[str, str | None, int], ...]
    documentation: str | None
    sensitive: bool = False


def broker_topic_defaults(ctx: RequestContext) -> dict[str, str]:
    """Topic-config defaults that come from this broker's settings rather than Kafka's.

    ``max.message.bytes`` defaults to ``CONNECTORS_KAFKA_MAX_MESSAGE_BYTES``, the limit
    Produce enforces when a topic has no override.
    """
    return {"max.message.bytes": str(ctx.broker.settings.kafka_max_message_bytes)}


def topic_config_entries(topic: Topic, names: Iterable[str] | None = None,
                         defaults: Mapping[str, str] | None = None,
                         dynamic: Mapping[str, list[tuple[str, str | None, int]]] | None = None,
                         ) -> list[ConfigEntry]:
    """The topic's configs (all, or those of ``names`` that exist), in name order.

    ``defaults`` overrides entries of ``TOPIC_CONFIG_DEFAULTS`` (see
    ``broker_topic_defaults``); ``dynamic`` are the dynamic broker defaults in force
    (``dynamic_synonyms``). Synonyms list the topic override (if any), the dynamic broker
    values, then the static broker default, as Kafka does.
    """
    wanted = sorted(TOPIC_CONFIG_DEFAULTS) if names is None else list(dict.fromkeys(names))
    out = []
    for name in wanted:
        default = TOPIC_CONFIG_DEFAULTS.get(name)
        if default is not None and defaults and name in defaults:
            default = defaults[name]
        if default is None:
            continue  # Kafka omits names it does not know
        synonyms: list[tuple[str, str | None, int]] = []
        brokers = (dynamic or {}).get(name, [])
        if name in topic.configs:
            value, source = topic.configs[name], SOURCE_DYNAMIC_TOPIC
            synonyms.append((name, value, SOURCE_DYNAMIC_TOPIC))
        elif brokers:
            _n, value, source = brokers[0]
        else:
            value, source = default, SOURCE_DEFAULT
        synonyms += brokers
        broker = _default_synonym(name, default)
        if broker is not None:
            synonyms.append((broker[0], broker[1], SOURCE_DEFAULT))
        out.append(ConfigEntry(name, value, source, False, _TOPIC_TYPES.get(name, LONG),
                               tuple(synonyms), _DOCS.get(name)))
    return out


# The replication factor settings, with Apache Kafka's default and type of each.
_REPLICATION_FACTORS: dict[str, tuple[str, int]] = {
    "default.replication.factor": ("1", INT),
    "offsets.topic.replication.factor": ("3", SHORT),
    "transaction.state.log.replication.factor": ("3", SHORT),
}


def _replication_factors(ctx: RequestContext) -> dict[str, tuple[str, int, int]]:
    """Value, source and type of each replication factor setting: the member count, since every
    Raft member holds every partition (CreateTopics with -1 and __consumer_offsets get that many
    replicas, and Kafka describes the factor it applies). The source is DEFAULT only when that
    is Kafka's own default: a Kafka cluster giving this many replicas sets it statically."""
    count = str(len(identity.replica_ids(ctx.broker)))
    return {name: (count, SOURCE_DEFAULT if count == default else SOURCE_STATIC_BROKER, kind)
            for name, (default, kind) in _REPLICATION_FACTORS.items()}


def _sasl_configs(s: Any) -> dict[str, tuple[str, int, int]]:
    """The SASL broker configs in force, as Kafka names them (none while SASL is off)."""
    if not s.kafka_sasl_mechanisms:
        return {}
    out = {"sasl.enabled.mechanisms": (",".join(s.kafka_sasl_mechanisms), SOURCE_STATIC_BROKER,
                                       LIST)}
    if "OAUTHBEARER" in s.kafka_sasl_mechanisms:
        out.update({
            "sasl.oauthbearer.jwks.endpoint.url": (s.kafka_sasl_oauthbearer_jwks_url,
                                                   SOURCE_STATIC_BROKER, STRING),
            "sasl.oauthbearer.jwks.endpoint.refresh.ms": (
                str(s.kafka_sasl_oauthbearer_jwks_refresh_ms), SOURCE_STATIC_BROKER, LONG),
            "sasl.oauthbearer.expected.audience": (s.kafka_sasl_oauthbearer_expected_audience,
                                                   SOURCE_STATIC_BROKER, LIST),
            "sasl.oauthbearer.expected.issuer": (s.kafka_sasl_oauthbearer_expected_issuer,
                                                 SOURCE_STATIC_BROKER, STRING),
        })
    return out


STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def _authorizer_configs(s: Any) -> dict[str, tuple[str | None, int, int]]:
    """The authorizer settings, as a Kafka broker with them in its server.properties describes
    them. ``authorizer.class.name`` is a Kafka broker config (empty by default). ``super.users``
    and ``allow.everyone.if.no.acl.found`` are the authorizer's own: Kafka lists such a
    setting when it is set (here: super users named; the authorizer on) but, knowing no type
    for it, as sensitive, with no value and type UNKNOWN."""
    out: dict[str, tuple[str | None, int, int]] = {
        "authorizer.class.name": (STANDARD_AUTHORIZER, SOURCE_STATIC_BROKER, STRING)
        if s.kafka_acl_enable else ("", SOURCE_DEFAULT, STRING)}
    if s.kafka_super_users:
        out["super.users"] = (None, SOURCE_STATIC_BROKER, UNKNOWN)
    if s.kafka_acl_enable or s.kafka_allow_everyone_if_no_acl_found:
        out["allow.everyone.if.no.acl.found"] = (None, SOURCE_STATIC_BROKER, UNKNOWN)
    return out


def broker_config_entries(ctx: RequestContext) -> list[ConfigEntry]:
    """The read-only broker configs this daemon reports, in name order."""
    s = ctx.broker.settings
    host, port = identity.advertised(ctx.broker, "PLAINTEXT")
    me = identity.node_id(ctx.broker)
    sasl = "SASL_" if s.kafka_sasl_mechanisms else ""  # the listeners' security protocols
    listeners = f"{sasl}PLAINTEXT://{s.kafka_bind_host}:{s.kafka_port}"
    advertised = f"{sasl}PLAINTEXT://{host}:{port}"
    if s.kafka_tls_enable:
        listeners += f",{sasl}SSL://{s.kafka_bind_host}:{s.kafka_tls_port}"
        advertised += f",{sasl}SSL://{s.kafka_advertised_host}:{s.kafka_tls_port}"
    topics: TopicCatalog = ctx.broker.extras["topics"]
    values: dict[str, tuple[str | None, int, int]] = {
        "advertised.listeners": (advertised, SOURCE_STATIC_BROKER, LIST),
        "auto.create.topics.enable": (str(s.kafka_auto_create_topics).lower(),
                                      SOURCE_STATIC_BROKER, BOOLEAN),
        "broker.id": (str(me), SOURCE_STATIC_BROKER, INT),
        "listeners": (listeners, SOURCE_STATIC_BROKER, LIST),
        "log.dirs": (str(ctx.broker.settings.data_dir), SOURCE_STATIC_BROKER, STRING),
        "group.max.session.timeout.ms": (str(s.kafka_group_max_session_timeout_ms),
                                         SOURCE_STATIC_BROKER, INT),
        "group.min.session.timeout.ms": (str(s.kafka_group_min_session_timeout_ms),
                                         SOURCE_STATIC_BROKER, INT),
        "max.connections": (str(s.kafka_max_connections), SOURCE_STATIC_BROKER, INT),
        "node.id": (str(me), SOURCE_STATIC_BROKER, INT),
        "num.partitions": (str(topics.default_partitions), SOURCE_STATIC_BROKER, INT),
        "offsets.retention.check.interval.ms": (
            str(s.kafka_offsets_retention_check_interval_ms), SOURCE_STATIC_BROKER, LONG),
        "offsets.retention.minutes": (str(s.kafka_offsets_retention_minutes),
                                      SOURCE_STATIC_BROKER, INT),
        "offsets.topic.num.partitions": (str(OFFSETS_TOPIC_PARTITIONS), SOURCE_DEFAULT, INT),
        "delete.topic.enable": ("true", SOURCE_DEFAULT, BOOLEAN),
        "connections.max.idle.ms": (str(s.kafka_connections_max_idle_ms),
                                    SOURCE_STATIC_BROKER, LONG),
        "group.initial.rebalance.delay.ms": (str(s.kafka_group_initial_rebalance_delay_ms),
                                             SOURCE_STATIC_BROKER, INT),
        # DEFAULT, as a group's config synonyms name them (kafka.group_configs).
        "group.consumer.session.timeout.ms": (str(s.kafka_consumer_session_timeout_ms),
                                              SOURCE_DEFAULT, INT),
        "group.consumer.heartbeat.interval.ms": (str(s.kafka_consumer_heartbeat_interval_ms),
                                                 SOURCE_DEFAULT, INT),
        "group.consumer.migration.policy": (DEFAULT_POLICY, SOURCE_STATIC_BROKER, STRING),
        "log.cleaner.backoff.ms": (str(s.kafka_log_cleaner_backoff_ms), SOURCE_STATIC_BROKER,
                                   LONG),
        "log.retention.check.interval.ms": (
            str(s.kafka_log_retention_check_interval_ms),
            SOURCE_DEFAULT  # the daemon's default is Kafka's
            if s.kafka_log_retention_check_interval_ms
            == type(s).kafka_log_retention_check_interval_ms
            else SOURCE_STATIC_BROKER, LONG),
        "connections.max.reauth.ms": (str(s.kafka_connections_max_reauth_ms),
                                      SOURCE_STATIC_BROKER if s.kafka_connections_max_reauth_ms
                                      else SOURCE_DEFAULT, LONG),
        **_replication_factors(ctx),
        **_sasl_configs(s),
        **_authorizer_configs(s),
    }
    defaults = {**TOPIC_CONFIG_DEFAULTS, **broker_topic_defaults(ctx)}
    topic_of: dict[str, str] = {}
    for topic_name in _BROKER_SYNONYM:
        broker_name, value = _default_synonym(topic_name, defaults[topic_name]) or (None, None)
        if broker_name is not None and broker_name not in values:
            values[broker_name] = (value, SOURCE_DEFAULT, _TOPIC_TYPES.get(topic_name, LONG))
            topic_of[broker_name] = topic_name
    synonyms = {name: ((name, value, source),) for name, (value, source, _k) in values.items()}
    for topic_name, dynamic in dynamic_synonyms(topics).items():
        broker_name, value, source = dynamic[0]
        synonyms[broker_name] = (*dynamic, *synonyms.get(broker_name, ()))
        values[broker_name] = (value, source, _TOPIC_TYPES.get(topic_name, LONG))
        topic_of[broker_name] = topic_name
    return [ConfigEntry(name, value, source, name not in _DYNAMIC_DEFAULTS, kind,
                        synonyms[name],
                        _BROKER_DOCS.get(name) or _DOCS.get(topic_of.get(name, "")),
                        kind == UNKNOWN)  # Kafka hides what it cannot type
            for name, (value, source, kind) in sorted(values.items())]


def dynamic_synonyms(topics: TopicCatalog) -> dict[str, list[tuple[str, str | None, int]]]:
    """Topic config -> its dynamic broker defaults in force, as synonyms in Kafka's order:
    this broker's own value, then the cluster-wide one."""
    out: dict[str, list[tuple[str, str | None, int]]] = {}
    for source, values in ((SOURCE_DYNAMIC_BROKER, topics.cluster_defaults(topics.node_id)),
                           (SOURCE_DYNAMIC_DEFAULT_BROKER, topics.cluster_defaults())):
        for topic_name, value in values.items():
            out.setdefault(topic_name, []).append((_BROKER_SYNONYM[topic_name], value, source))
    return out


def cluster_default_entries(topics: TopicCatalog) -> list[ConfigEntry]:
    """The broker resource ``""``: the dynamic cluster-wide defaults that are set."""
    out = []
    for topic_name, value in sorted(topics.cluster_defaults().items()):
        name = _BROKER_SYNONYM[topic_name]
        out.append(ConfigEntry(name, value, SOURCE_DYNAMIC_DEFAULT_BROKER, False,
                               _TOPIC_TYPES.get(topic_name, LONG),
                               ((name, value, SOURCE_DYNAMIC_DEFAULT_BROKER),),
                               _DOCS.get(topic_name)))
    return sorted(out, key=lambda e: e.name)


# --- Authorization ----------------------------------------------------------------------

# Config resource types authorized on the cluster, and the refusal of each ACL resource type
# (Kafka's messages).
_CLUSTER_WIDE = (RESOURCE_BROKER, RESOURCE_BROKER_LOGGER, RESOURCE_CLIENT_METRICS)
_REFUSALS: dict[int, tuple[ErrorCode, str]] = {
    authz.TOPIC: (ErrorCode.topic_authorization_failed, "Topic authorization failed."),
    authz.GROUP: (ErrorCode.group_authorization_failed, "Group authorization failed."),
    authz.CLUSTER: (ErrorCode.cluster_authorization_failed, "Cluster authorization failed."),
}


def _refusal(ctx: RequestContext, operation: int, res: Any) -> KafkaError | None:
    """The error for a resource the principal may not do ``operation`` (DESCRIBE_CONFIGS or
    ALTER_CONFIGS) on, else None. Types with no ACL resource are left to the handlers."""
    if res.resource_type == RESOURCE_TOPIC:
        kind, name = authz.TOPIC, res.resource_name
    elif res.resource_type == RESOURCE_GROUP:
        kind, name = authz.GROUP, res.resource_name
    elif res.resource_type in _CLUSTER_WIDE:
        kind, name = authz.CLUSTER, authz.CLUSTER_NAME
    else:
        return None
    if authz.allowed(ctx, operation, kind, name):
        return None
    return KafkaError(*_REFUSALS[kind])



# --- DescribeConfigs --------------------------------------------------------------------


def describe_configs(request: Any, ctx: RequestContext) -> Any:
    """Describe topic or broker resources; ``configuration_keys`` null or empty means all (as
    Apache Kafka reads it; kafka-python sends an empty list)."""
    t = types_of(ctx)
    topics: TopicCatalog = ctx.broker.extras["topics"]
    synonyms = getattr(request, "include_synonyms", False)
    docs = getattr(request, "include_documentation", False)
    results = []
    for res in request.resources:
        try:
            refused = _refusal(ctx, authz.DESCRIBE_CONFIGS, res)
            if refused is not None:
                raise refused
            entries = _describe_resource(ctx, topics, res)
        except KafkaError as exc:
            results.append(make(t.DescribeConfigsResult, error_code=exc.code,
                                error_message=exc.message, resource_type=res.resource_type,
                                resource_name=res.resource_name, configs=()))
            continue
        configs = tuple(
            make(t.DescribeConfigsResourceResult, name=e.name, value=e.value,
                 read_only=e.read_only, config_source=e.source, is_sensitive=e.sensitive,
                 synonyms=tuple(make(t.DescribeConfigsSynonym, name=n, value=v, source=src)
                                for n, v, src in e.synonyms) if synonyms else (),
                 config_type=e.config_type, documentation=e.documentation if docs else None)
            for e in entries
        )
        results.append(make(t.DescribeConfigsResult, error_code=ErrorCode.none,
                            error_message=None, resource_type=res.resource_type,
                            resource_name=res.resource_name, configs=configs))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, results=tuple(results))


def _describe_resource(ctx: RequestContext, topics: TopicCatalog, res: Any) -> list[ConfigEntry]:
    keys = res.configuration_keys or None
    if res.resource_type == RESOURCE_TOPIC:
        validate_topic_name(res.resource_name)
        topic = topics.get(res.resource_name)
        if topic is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition,
                             f"The topic '{res.resource_name}' does not exist.")
        return topic_config_entries(topic, keys, broker_topic_defaults(ctx),
                                    dynamic_synonyms(topics))
    if res.resource_type == RESOURCE_GROUP:
        return _group_configs(ctx).entries(res.resource_name, keys)
    if res.resource_type == RESOURCE_BROKER:
        if res.resource_name == "":
            entries = cluster_default_entries(topics)
            return [e for e in entries if keys is None or e.name in set(keys)]
        _check_broker(ctx, res.resource_name)
        entries = broker_config_entries(ctx)
        if keys is not None:
            entries = [e for e in entries if e.name in set(keys)]
        return entries
    raise KafkaError(ErrorCode.invalid_request,
                     f"Unsupported resource type: {res.resource_type}")


def _group_configs(ctx: RequestContext) -> Any:
    from kmqkafka.kafka import consumer_groups  # the coordinator creates them
    consumer_groups.install(ctx.broker)
    return ctx.broker.extras["group_configs"]


def _check_broker(ctx: RequestContext, name: str) -> None:
    me = identity.node_id(ctx.broker)
    if name != str(me):
        raise KafkaError(ErrorCode.invalid_request,
                         f"Unexpected broker id, expected {me} or empty string, but received "
                         f"{name}")


# --- AlterConfigs and IncrementalAlterConfigs -------------------------------------------


def _alter_group(ctx: RequestContext, res: Any, incremental: bool,
                 validate_only: bool) -> Deferred:
    """SET / DELETE on a group's overrides (Kafka accepts GROUP only incrementally)."""
    if not incremental:
        raise KafkaError(ErrorCode.invalid_request,
                         "AlterConfigs does not support the GROUP resource; use "
                         "IncrementalAlterConfigs")
    changes: dict[str, str | None] = {}
    for cfg in res.configs:
        plain, value = _set_or_delete(cfg)
        if not plain:
            verb = "APPEND" if cfg.config_operation == OP_APPEND else "SUBTRACT"
            raise KafkaError(ErrorCode.invalid_config,
                             f"Can't {verb} to key {cfg.name} because its type is not LIST.")
        changes[cfg.name] = value
    return _group_configs(ctx).alter(res.resource_name, changes, validate_only=validate_only)


def _alter_cluster_defaults(ctx: RequestContext, topics: TopicCatalog, res: Any,
                            incremental: bool, validate_only: bool) -> Deferred:
    """Kafka's dynamic cluster-wide defaults of the log configs (see the module docstring)."""
    if res.resource_name != "":
        _check_broker(ctx, res.resource_name)
    fixed = sorted(c.name for c in res.configs if c.name not in _DYNAMIC_DEFAULTS)
    if fixed:
        raise KafkaError(ErrorCode.invalid_request,
                         f"Cannot update these configs dynamically: {', '.join(fixed)} (set "
                         "them at start-up: environment, options or the TOML file)")
    broker_id = None if res.resource_name == "" else int(res.resource_name)
    if broker_id is not None and identity.clustered(ctx.broker) and res.configs:
        raise KafkaError(ErrorCode.invalid_request,
                         f"Cannot update these configs for broker {res.resource_name} alone: "
                         f"{', '.join(sorted(c.name for c in res.configs))} (every node holds "
                         "every partition, so they are cluster-wide: set them on the default "
                         "broker resource, kafka-configs --entity-type brokers --entity-default)")
    current = {**topics.cluster_defaults(), **topics.cluster_defaults(broker_id)} if (
        broker_id is not None) else topics.cluster_defaults()
    changes: dict[str, str | None] = {}
    for cfg in res.configs:
        name = _DYNAMIC_DEFAULTS[cfg.name]
        if not incremental:
            if cfg.value is None:
                raise KafkaError(ErrorCode.invalid_request,
                                 f"Null value not supported for : {cfg.name}")
            changes[name] = cfg.value
            continue
        plain, value = _set_or_delete(cfg)
        if plain:
            changes[name] = value
        elif cfg.config_operation in (OP_APPEND, OP_SUBTRACT):
            if _TOPIC_TYPES.get(name, LONG) != LIST:
                verb = "APPEND" if cfg.config_operation == OP_APPEND else "SUBTRACT"
                raise KafkaError(ErrorCode.invalid_config,
                                 f"Can't {verb} to key {cfg.name} because its type is not LIST.")
            parts = _parts(current.get(name, TOPIC_CONFIG_DEFAULTS[name]))
            given = _parts(cfg.value)
            if cfg.config_operation == OP_APPEND:
                parts += [p for p in given if p not in parts]
            else:
                parts = [p for p in parts if p not in given]
            changes[name] = ",".join(parts)
        else:
            raise KafkaError(ErrorCode.invalid_request,
                             f"Unknown operation type {cfg.config_operation}")
    return topics.set_cluster_defaults(changes, replace=not incremental,
                                       validate_only=validate_only, broker_id=broker_id)


def _set_or_delete(cfg: Any) -> tuple[bool, str | None]:
    """One incremental change: (True, value) for SET, (True, None) for DELETE, (False, None)
    for the list operations (APPEND, SUBTRACT) the caller handles."""
    if cfg.config_operation == OP_SET:
        if cfg.value is None:
            raise KafkaError(ErrorCode.invalid_request,
                             f"Null value not supported for : {cfg.name}")
        return True, cfg.value
    return cfg.config_operation == OP_DELETE, None


def alter_configs(request: Any, ctx: RequestContext) -> Deferred:
    """Replace a topic's whole set of explicit configs (unnamed ones revert to defaults)."""
    return _alter(request, ctx, incremental=False)


def incremental_alter_configs(request: Any, ctx: RequestContext) -> Deferred:
    """SET / DELETE / APPEND / SUBTRACT (the last two only for list configs) per topic."""
    return _alter(request, ctx, incremental=True)


def _alter(request: Any, ctx: RequestContext, *, incremental: bool) -> Deferred:
    topics: TopicCatalog = ctx.broker.extras["topics"]
    seen = Counter((res.resource_type, res.resource_name) for res in request.resources)
    work = []
    for res in request.resources:
        if seen[(res.resource_type, res.resource_name)] > 1:
            work.append(_outcome(lambda: _refuse(KafkaError(
                ErrorCode.invalid_request, "Each resource must appear at most once."))))
        elif (refused := _refusal(ctx, authz.ALTER_CONFIGS, res)) is not None:
            work.append(_outcome(lambda refused=refused: _refuse(refused)))
        else:
            work.append(_outcome(lambda res=res: topics.retrying(
                lambda: _alter_resource(ctx, topics, res, incremental, request.validate_only))))
    d = gatherResults(work, consumeErrors=True)
    return d.addCallback(lambda outcomes: _alter_response(ctx, request.resources, outcomes))


def _refuse(error: KafkaError) -> None:
    raise error


def _outcome(work: Any) -> Deferred:
    d = maybeDeferred(work)
    d.addCallbacks(lambda _v: (ErrorCode.none, None), _as_outcome)
    return d


def _as_outcome(failure: Failure) -> tuple[ErrorCode, str | None]:
    code = error_code_for(failure.value)
    if code is ErrorCode.unknown_server_error:
        log.failure("config change failed", failure)
        return code, "Unexpected error; see the broker log"
    exc = failure.value
    return code, exc.message if isinstance(exc, KafkaError) else str(exc)


def _alter_resource(ctx: RequestContext, topics: TopicCatalog, res: Any, incremental: bool,
                    validate_only: bool) -> Deferred:
    names = [c.name for c in res.configs]
    if len(set(names)) != len(names):
        raise KafkaError(ErrorCode.invalid_request, "Error due to duplicate config keys")
    if res.resource_type == RESOURCE_BROKER:
        return _alter_cluster_defaults(ctx, topics, res, incremental, validate_only)
    if res.resource_type == RESOURCE_GROUP:
        return _alter_group(ctx, res, incremental, validate_only)
    if res.resource_type != RESOURCE_TOPIC:
        raise KafkaError(ErrorCode.invalid_request,
                         f"Unsupported resource type: {res.resource_type}")
    validate_topic_name(res.resource_name)
    topic = topics.get(res.resource_name)
    if topic is None:
        raise KafkaError(ErrorCode.unknown_topic_or_partition,
                         f"The topic '{res.resource_name}' does not exist.")
    if not incremental:
        nulls = [c.name for c in res.configs if c.value is None]
        if nulls:  # AlterConfigs replaces the whole set: a null would quietly drop it
            raise KafkaError(ErrorCode.invalid_request,
                             f"Null value not supported for : {', '.join(nulls)}")
        wanted = {c.name: c.value for c in res.configs}
        return topics.set_configs(topic.name, wanted, replace=True, validate_only=validate_only)
    changes: dict[str, str | None] = {}
    for c in res.configs:
        op = c.config_operation
        plain, value = _set_or_delete(c)
        if plain:
            if value is None and c.name not in TOPIC_CONFIG_DEFAULTS:
                continue  # Kafka: deleting a config that is not set changes nothing
            changes[c.name] = value
        elif op in (OP_APPEND, OP_SUBTRACT):
            if c.name not in TOPIC_CONFIG_DEFAULTS or _TOPIC_TYPES.get(c.name, LONG) != LIST:
                verb = "APPEND" if op == OP_APPEND else "SUBTRACT"
                raise KafkaError(ErrorCode.invalid_config,
                                 f"Can't {verb} to key {c.name} because its type is not LIST.")
            current = _parts(topic.config_value(c.name))
            given = _parts(c.value)
            if op == OP_APPEND:
                current += [p for p in given if p not in current]
            else:
                current = [p for p in current if p not in given]
            changes[c.name] = ",".join(current)
        else:
            raise KafkaError(ErrorCode.invalid_request, f"Unknown operation type {op}")
    return topics.set_configs(topic.name, changes, replace=False, validate_only=validate_only)


def _parts(value: str | None) -> list[str]:
    return [p.strip() for p in (value or "").split(",") if p.strip()]


def _alter_response(ctx: RequestContext, resources: Any,
                    outcomes: list[tuple[ErrorCode, str | None]]) -> Any:
    t = types_of(ctx)
    out = tuple(
        make(t.AlterConfigsResourceResponse, error_code=code, error_message=message,
             resource_type=res.resource_type, resource_name=res.resource_name)
        for res, (code, message) in zip(resources, outcomes)
    )
    return make(ctx.response_type, throttle_time=NO_THROTTLE, responses=out)


def register(dispatcher: Dispatcher) -> None:
    """Register DescribeConfigs, AlterConfigs and IncrementalAlterConfigs."""
    dispatcher.register(DESCRIBE_CONFIGS, identity.settled_first(describe_configs), 1, 4)
    dispatcher.register(ALTER_CONFIGS, alter_configs, 0, 2)
    dispatcher.register(INCREMENTAL_ALTER_CONFIGS, incremental_alter_configs, 0, 1)


__all__ = ["ConfigEntry", "broker_config_entries", "broker_topic_defaults",
           "cluster_default_entries", "dynamic_synonyms", "register",
           "topic_config_entries"]
