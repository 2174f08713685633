"""The Kafka topic catalog: names, ids, partition counts and configs over the channel store.

A topic ``T`` with N partitions is the channels ``kafka.T``, ``kafka.T~1`` …
``kafka.T~{N-1}`` plus one entry ``topic:T`` in the coordinator family
``config`` holding its id, partition count and explicitly set configs. Each
change is one ``Batch`` command so a topic's channels and its entry move
together. Reads come from the store's applied state, so a node never reports
more partitions than it has applied.

Handlers use this module; it never touches the wire types.
"""

from __future__ import annotations

import json
import re
import resource
import uuid
from decimal import Decimal
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from kio.schema.errors import ErrorCode
from twisted.internet.defer import Deferred, gatherResults, maybeDeferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from kmqkafka.config import MAX_TOPIC_PARTITIONS
from kmqkafka.kafka.errors import KafkaError
from kmqkafka.store import commands as c
from kmqkafka.store.config import LogConfig
from kmqkafka.store.errors import KeyConflict
from kmqkafka.store.names import channel_for

_log = Logger()

MAX_PARTITIONS = MAX_TOPIC_PARTITIONS
MAX_TOPIC_NAME = 249
# Apache Kafka's own internal topics. Here groups, offsets and producer state live in the
# store's coordinator channels, so these names are never user topics: CreateTopics refuses
# them (as Kafka refuses __cluster_metadata), Metadata never auto-creates them, and Produce
# refuses them (INVALID_TOPIC_EXCEPTION, as Kafka). Only ``OFFSETS_TOPIC`` ever exists, and
# only as Kafka makes it: when a group first looks for its coordinator (``ensure_offsets_topic``).
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__cluster_metadata",
                             "__share_group_state"})
OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_TOPIC_PARTITIONS = 50  # Kafka's offsets.topic.num.partitions
OFFSETS_TOPIC_CONFIGS = {"cleanup.policy": "compact", "compression.type": "producer",
                         "segment.bytes": "104857600"}  # what Kafka creates it with
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
_KEY_PREFIX = b"topic:"
# Kafka's dynamic broker defaults of topic configs, JSON by topic config name, in the catalog's
# family: cluster-wide (``kafka-configs --entity-type brokers --entity-default``) under this key,
# one broker's own (``--entity-name N``) under this key + b":N".
_CLUSTER_DEFAULTS_KEY = b"broker-defaults"
CONFIG_FAMILY = "config"

# Kafka topic configs: name -> (default as Kafka reports it, LogConfig field or None).
_DAY_MS = 24 * 3600 * 1000
TOPIC_CONFIG_DEFAULTS: dict[str, str] = {
    "cleanup.policy": "delete",
    "compression.type": "producer",
    "delete.retention.ms": str(_DAY_MS),
    "file.delete.delay.ms": "60000",
    "flush.messages": "9223372036854775807",
    "flush.ms": "9223372036854775807",
    "index.interval.bytes": "4096",
    "max.compaction.lag.ms": "9223372036854775807",
    "max.message.bytes": "1048588",
    "message.timestamp.type": "CreateTime",
    "message.timestamp.before.max.ms": "9223372036854775807",
    "message.timestamp.after.max.ms": "3600000",  # Kafka 4 (KIP-1030): one hour
    "min.cleanable.dirty.ratio": "0.5",
    "min.compaction.lag.ms": "0",
    "min.insync.replicas": "1",
    "preallocate": "false",
    "retention.bytes": "-1",
    "retention.ms": str(7 * _DAY_MS),
    "segment.bytes": str(64 * 1024 * 1024),
    "segment.index.bytes": "10485760",
    "segment.jitter.ms": "0",
    "segment.ms": str(7 * _DAY_MS),
    "unclean.leader.election.enable": "false",
    "message.downconversion.enable": "true",
    # Codec levels apply when a topic's compression.type recompresses a batch. The rest are
    # accepted, stored and described as Kafka does, with no effect on this store: tiered
    # storage, replication throttles, and the message-format settings Kafka 3.x still lists.
    "compression.gzip.level": "-1",
    "compression.lz4.level": "9",
    "compression.zstd.level": "3",
    "follower.replication.throttled.replicas": "",
    "leader.replication.throttled.replicas": "",
    "local.retention.bytes": "-2",
    "local.retention.ms": "-2",
    "remote.storage.enable": "false",
    "remote.log.copy.disable": "false",
    "remote.log.delete.on.disable": "false",
}
# Kafka 4.0 removed message.format.version (KIP-724) and message.timestamp.difference.max.ms
# (KIP-937): like it, CreateTopics and AlterConfigs refuse them as unknown configs.

_INT_CONFIGS = {
    "delete.retention.ms", "file.delete.delay.ms", "flush.messages", "flush.ms",
    "index.interval.bytes", "max.compaction.lag.ms", "max.message.bytes",
    "message.timestamp.before.max.ms", "message.timestamp.after.max.ms",
    "min.compaction.lag.ms", "min.insync.replicas", "retention.bytes", "retention.ms",
    "segment.bytes", "segment.index.bytes", "segment.jitter.ms", "segment.ms",
    "compression.gzip.level", "compression.lz4.level", "compression.zstd.level",
    "local.retention.bytes", "local.retention.ms",
}

# Lower bounds as Kafka's LogConfig states them (0 unless listed; None: no bound, as
# retention.bytes, where any negative value means no limit).
_MINIMUMS: dict[str, int | None] = {
    # segment.bytes: 1 MiB since Kafka 4.0 (KIP-1030; it was 14 bytes).
    "retention.ms": -1, "retention.bytes": None, "segment.bytes": 1 << 20, "segment.ms": 1,
    "segment.index.bytes": 4, "min.insync.replicas": 1, "flush.messages": 1,
    "max.compaction.lag.ms": 1, "local.retention.bytes": -2, "local.retention.ms": -2,
    "compression.lz4.level": 1, "compression.zstd.level": -131072,
}
# Upper bounds below the type's own maximum.
_MAXIMUMS = {"compression.lz4.level": 17, "compression.zstd.level": 22}
# gzip's level is 1..9 or -1 (zlib's default), never 0 (Kafka's GZIP level validator).
_GZIP_LEVELS = range(1, 10)
_INT32_CONFIGS = {"index.interval.bytes", "max.message.bytes", "min.insync.replicas",
                  "segment.bytes", "segment.index.bytes", "compression.gzip.level",
                  "compression.lz4.level", "compression.zstd.level"}
_BOOLEAN_CONFIGS = {"preallocate", "unclean.leader.election.enable",
                    "message.downconversion.enable", "remote.storage.enable",
                    "remote.log.copy.disable", "remote.log.delete.on.disable"}
# Java's Long.parseLong after ConfigDef trims: an optional sign and ASCII digits, nothing else
# (Python's int() would also take "1_000" or non-ASCII digits).
_JAVA_INTEGER = re.compile(r"[+-]?[0-9]+")
_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1

# Valid strings in the order Kafka lists them in its "String must be one of" messages.
_CHOICES = {
    "compression.type": ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
    "message.timestamp.type": ("CreateTime", "LogAppendTime"),
}
_CLEANUP_POLICIES = ("compact", "delete")
_THROTTLED_REPLICAS = {"leader.replication.throttled.replicas",
                       "follower.replication.throttled.replicas"}
_THROTTLED_ENTRY = re.compile(r"([0-9]+:[0-9]+)?")
# Java's Double.parseDouble after ConfigDef trims (NaN is left out: no ratio can use it).
_JAVA_DOUBLE = re.compile(r"[+-]?(Infinity|([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[fFdD]?)")


@dataclass(frozen=True, slots=True)
class Topic:
    """One topic as the catalog knows it."""

    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: Mapping[str, str] = field(default_factory=dict)
    # The cluster-wide dynamic defaults in force (not part of the topic's own record).
    defaults: Mapping[str, str] = field(default_factory=dict, compare=False)

    def channels(self) -> list[str]:
        return [channel_for(self.name, p) for p in range(self.partitions)]

    def config_value(self, name: str) -> str | None:
        """The topic's override, else the cluster's dynamic default, else Kafka's."""
        if name in self.configs:
            return self.configs[name]
        if name in self.defaults:
            return self.defaults[name]
        return TOPIC_CONFIG_DEFAULTS.get(name)


def validate_topic_name(name: str | None) -> None:
    """Kafka's topic-name rules with Kafka 3.x/4.x's wording (``Topic.validate``: "Topic name
    is invalid: <reason>"). ``~``, which the channel grammar reserves as the partition
    separator, is no legal Kafka character either."""
    reason = _invalid_name_reason(name or "")
    if reason is not None:
        raise KafkaError(ErrorCode.invalid_topic_exception, f"Topic name is invalid: {reason}")


def _invalid_name_reason(name: str) -> str | None:
    if not name:
        return "the empty string is not allowed"
    if name in (".", ".."):
        return f"'{name}' is not allowed"
    if len(name) > MAX_TOPIC_NAME:
        return f"the length of '{name}' is longer than the max allowed length {MAX_TOPIC_NAME}"
    if not _LEGAL_TOPIC.fullmatch(name):  # match() would let a trailing newline through
        return (f"'{name}' contains one or more characters other than ASCII alphanumerics, "
                "'.', '_' and '-'")
    return None


def validate_configs(configs: Mapping[str, str | None]) -> dict[str, Any]:
    """Check Kafka topic configs; return the LogConfig changes they imply.

    Raises KafkaError(INVALID_CONFIG) naming the first bad entry, worded as Kafka's
    ConfigDef words it: "Invalid value V for configuration N: why".
    """
    changes: dict[str, Any] = {}
    for name, value in configs.items():
        if name not in TOPIC_CONFIG_DEFAULTS:
            raise KafkaError(ErrorCode.invalid_config, f"Unknown topic config name: {name}")
        if value is None:
            value = TOPIC_CONFIG_DEFAULTS[name]
        if name in _INT_CONFIGS:
            number = _check_integer(name, value)
            field_name = _LOG_FIELDS.get(name)
            if field_name is not None:
                # Kafka: a negative retention.bytes (and retention.ms -1) means no limit.
                changes[field_name] = None if number < 0 else number
        elif name == "cleanup.policy":
            parts = _java_list(value)
            for part in parts:
                if part not in _CLEANUP_POLICIES:
                    raise _invalid(name, part, "String must be one of: "
                                   + ", ".join(_CLEANUP_POLICIES))
            # An empty list is valid in Kafka: segments are neither deleted nor compacted.
            changes["cleanup_policy"] = ",".join(sorted(set(parts)))
        elif name in _CHOICES:
            if value not in _CHOICES[name]:
                raise _invalid(name, value, "String must be one of: " + ", ".join(_CHOICES[name]))
        elif name == "min.cleanable.dirty.ratio":
            changes["min_cleanable_dirty_ratio"] = _check_ratio(name, value)
        elif name in _BOOLEAN_CONFIGS:
            if value.strip().lower() not in ("true", "false"):
                raise _invalid(name, value, "Expected value to be either true or false")
        elif name in _THROTTLED_REPLICAS:
            parts = _java_list(value)
            if not (all(_THROTTLED_ENTRY.fullmatch(p) for p in parts) or "".join(parts) == "*"):
                raise _invalid(name, "[" + ", ".join(parts) + "]",
                               f"{name} must be the literal '*' or a list of replicas in the "
                               "following format: [partitionId]:[brokerId],[partitionId]:"
                               "[brokerId],...")
    return changes


def _invalid(name: str, value: object, why: str) -> KafkaError:
    """Kafka's ConfigException wording (the value is the parsed one where Kafka had parsed it)."""
    return KafkaError(ErrorCode.invalid_config,
                      f"Invalid value {value} for configuration {name}: {why}")


def _java_list(value: str) -> list[str]:
    """ConfigDef's LIST parsing: trimmed, split on commas with the spaces around them; an empty
    string is the empty list and an empty element stays (and fails validation)."""
    trimmed = value.strip()
    return re.split(r"\s*,\s*", trimmed) if trimmed else []


def _check_integer(name: str, value: str) -> int:
    """Parse an INT or LONG config as Java does and apply its range validator."""
    int32 = name in _INT32_CONFIGS
    top = _INT32_MAX if int32 else _INT64_MAX
    text = value.strip()
    number = int(text) if _JAVA_INTEGER.fullmatch(text) else None
    if number is None or not -top - 1 <= number <= top:
        raise _invalid(name, value, f"Not a number of type {'INT' if int32 else 'LONG'}")
    if name == "compression.gzip.level":
        if number != -1 and number not in _GZIP_LEVELS:
            raise _invalid(name, number, "Value must be between 1 and 9 or equal to -1")
        return number
    lowest = _MINIMUMS.get(name, 0)
    if lowest is not None and number < lowest:
        raise _invalid(name, number, f"Value must be at least {lowest}")
    highest = _MAXIMUMS.get(name)
    if highest is not None and number > highest:
        raise _invalid(name, number, f"Value must be no more than {highest}")
    return number


def _check_ratio(name: str, value: str) -> float:
    """A DOUBLE between 0 and 1, parsed and reported as Java does (2 is "2.0")."""
    text = value.strip()
    if not _JAVA_DOUBLE.fullmatch(text):
        raise _invalid(name, value, "Not a number of type DOUBLE")
    ratio = float(text.rstrip("fFdD"))
    if ratio < 0.0:
        raise _invalid(name, _java_double(ratio), "Value must be at least 0")
    if ratio > 1.0:
        raise _invalid(name, _java_double(ratio), "Value must be no more than 1")
    return ratio


def _java_double(x: float) -> str:
    """Java's Double.toString: plain between 1e-3 and 1e7, else "d.dddE±n"."""
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0 or 1e-3 <= abs(x) < 1e7:
        return repr(x)  # Python writes these plainly too, with the same shortest digits
    sign, digits, exponent = Decimal(repr(x)).normalize().as_tuple()
    text = "".join(map(str, digits))
    return (f"{'-' if sign else ''}{text[0]}.{text[1:] or '0'}"
            f"E{len(text) - 1 + int(exponent)}")


_LOG_FIELDS = {
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "max.message.bytes": "max_message_bytes",
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "delete.retention.ms": "delete_retention_ms",
    "min.compaction.lag.ms": "min_compaction_lag_ms",
    "max.compaction.lag.ms": "max_compaction_lag_ms",
    "index.interval.bytes": "index_interval_bytes",
}


def _all_log_changes(configs: Mapping[str, str],
                     defaults: Mapping[str, str] | None = None) -> dict[str, Any]:
    """LogConfig for a topic's full config set (the cluster's dynamic ``defaults``, then
    Kafka's, filled in).

    The explicit set is validated on its own first: merging over the known names
    alone would silently drop an unknown one.
    """
    validate_configs(configs)
    base = {**TOPIC_CONFIG_DEFAULTS, **(defaults or {})}
    merged = {name: configs.get(name, default) for name, default in base.items()}
    changes = validate_configs(merged)
    _check_compaction_lags(merged)
    _check_remote_storage(merged)
    return changes


def _check_compaction_lags(merged: Mapping[str, str | None]) -> None:
    """Kafka's one cross-config rule (LogConfig.validateValues), on the full set."""
    least = int(str(merged["min.compaction.lag.ms"]).strip())
    most = int(str(merged["max.compaction.lag.ms"]).strip())
    if least > most:
        raise KafkaError(ErrorCode.invalid_config,
                         f"conflict topic config setting min.compaction.lag.ms ({least}) > "
                         f"max.compaction.lag.ms ({most})")


def _check_remote_storage(merged: Mapping[str, str | None]) -> None:
    """Kafka refuses remote.storage.enable=true unless the broker runs tiered storage
    (remote.log.storage.system.enable, false by default); this broker has none, so the
    switch is accepted only off (LogConfig.validateRemoteStorageOnlyIfSystemEnabled)."""
    if str(merged["remote.storage.enable"]).strip().lower() == "true":
        raise KafkaError(ErrorCode.invalid_config,
                         "Tiered Storage functionality is disabled in the broker. Topic cannot be "
                         "configured with remote log storage.")


# Descriptors a partition holds: its active segment's writer and reader, and one more for the
# first closed segment's reader (its two index mappings hold one each too; Kafka needs as many,
# hence LimitNOFILE in the unit file).
FDS_PER_PARTITION = 3


FD_RESERVE = 512  # descriptors kept for the Raft log, snapshots, checkpoints and HTTP


def connections_that_fit(max_connections: int) -> int:
    """``max_connections``, or fewer when the open-file limit could not hold that many
    sockets beside the store's reserve and a minimal partition budget: connections that took
    the last descriptors made the next checkpoint write fail, which stops a node's writes."""
    soft = _open_file_limit()
    if soft == resource.RLIM_INFINITY:
        return max_connections
    fits = max(1, soft - FD_RESERVE - 16 * FDS_PER_PARTITION)
    if max_connections > fits:
        _log.warn("CONNECTORS_KAFKA_MAX_CONNECTIONS={wanted} does not fit the open-file limit "
                  "({soft}); allowing {fits} connections", wanted=max_connections, soft=soft,
                  fits=fits)
        return fits
    return max_connections


def _open_file_limit() -> int:
    """The soft open-file limit, raised to the hard one first."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def partition_budget(max_connections: int) -> int:
    """Channels this process can keep open: its open-file limit (the soft limit is raised to
    the hard one first) less the Kafka connections allowed and a reserve for everything else
    (the Raft log, snapshots, HTTP), over ``FDS_PER_PARTITION``."""
    soft = _open_file_limit()
    if soft == resource.RLIM_INFINITY:
        return 1 << 30
    return max(16, (soft - max_connections - FD_RESERVE) // FDS_PER_PARTITION)


RACE_TRIES = 16  # catalog writes in a row one change may lose to others (``retrying``)


class TopicCatalog:
    """Create, grow, reconfigure, delete and look up topics. Reactor thread only."""

    def __init__(self, store: Any, *, default_partitions: int = 1,
                 max_partitions: int | None = None, node_id: int = 1) -> None:
        """``max_partitions``: the most channels this node may hold (see
        ``partition_budget``); creates beyond it are POLICY_VIOLATION. ``node_id``: whose
        per-broker dynamic defaults apply here."""
        self._store = store
        self.node_id = node_id
        self._broker_key = _defaults_key(node_id)
        self.max_partitions = max_partitions
        self._reserved = 0  # partitions of creates and growths proposed but not yet answered
        self._cache: dict[str, tuple[bytes, bytes | None, Topic]] = {}
        # Every topic, sorted, and by id, as of one state of the catalog family (see
        # ``listing``): Metadata and any lookup by topic id would otherwise decode the whole
        # catalog on every request (40 ms of the reactor per full Metadata at 2,000 topics).
        self._listed: tuple[object, int, tuple[Topic, ...], dict[uuid.UUID, Topic]] | None = None
        self.default_partitions = default_partitions
        self._grown_listeners: list[Callable[[Topic], Any]] = []
        self._deleted_listeners: list[Callable[[Topic], Deferred | None]] = []
        self._creating_offsets = False

    def on_partitions_added(self, listener: Callable[[Topic], Any]) -> None:
        """Call ``listener(topic)`` after a durable partition-count increase.

        For the group coordinator: the seed wants every group subscribed to the topic
        rebalanced. Listener exceptions are logged and do not fail the request.
        """
        self._grown_listeners.append(listener)

    def on_deleted(self, listener: Callable[[Topic], Deferred | None]) -> None:
        """Call ``listener(topic)`` after a durable delete; the delete answers once a
        returned Deferred fires (for the group coordinator: the topic's committed offsets go
        too). Listener failures are logged and do not fail the request."""
        self._deleted_listeners.append(listener)

    @staticmethod
    def _notify(listeners: list[Callable[[Topic], Any]], topic: Topic, what: str) -> Deferred:
        """Call each listener; fires with ``topic`` once the Deferreds they return have.
        A listener's failure is logged and never fails the request."""
        waits = []
        for listener in listeners:
            try:
                d = listener(topic)
            except Exception:
                _log.failure("{what} listener failed for {topic}", what=what, topic=topic.name)
                continue
            if isinstance(d, Deferred):
                waits.append(d.addErrback(lambda f: _log.failure(
                    "{what} listener failed for {topic}", f, what=what, topic=topic.name)))
        return gatherResults(waits).addCallback(lambda _r: topic)

    # --- lookups ----------------------------------------------------------------------

    def get(self, name: str) -> Topic | None:
        raw = self._store.keyed_get(CONFIG_FAMILY, _KEY_PREFIX + name.encode())
        if raw is None:
            self._cache.pop(name, None)
            return None
        defaults_raw = (self._store.keyed_get(CONFIG_FAMILY, _CLUSTER_DEFAULTS_KEY),
                        self._store.keyed_get(CONFIG_FAMILY, self._broker_key))
        cached = self._cache.get(name)
        if cached is not None and cached[0] == raw and cached[1] == defaults_raw:
            return cached[2]
        topic = _decode(name, raw, self.dynamic_defaults())
        self._cache[name] = (raw, defaults_raw, topic)
        return topic

    def cluster_defaults(self, broker_id: int | None = None) -> dict[str, str]:
        """The dynamic defaults of topic configs set cluster-wide, or for broker
        ``broker_id`` alone, by topic config name."""
        key = _defaults_key(broker_id)
        raw = self._store.keyed_get(CONFIG_FAMILY, key)
        return json.loads(raw) if raw else {}

    def dynamic_defaults(self) -> dict[str, str]:
        """What applies on this node: its own per-broker values over the cluster-wide ones."""
        merged = self.cluster_defaults()
        raw = self._store.keyed_get(CONFIG_FAMILY, self._broker_key)
        if raw:
            merged.update(json.loads(raw))
        return merged

    def require(self, name: str) -> Topic:
        topic = self.get(name)
        if topic is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition,
                             "This server does not host this topic-partition.")
        return topic

    def stamp(self) -> tuple[object, int]:
        """A cheap token of the catalog's state: two equal stamps (``is`` on the first part,
        ``==`` on the second) mean no topic was created, changed or deleted in between."""
        return self._store.keyed_state(CONFIG_FAMILY)

    def by_id(self, topic_id: uuid.UUID) -> Topic | None:
        return self._listing()[3].get(topic_id)

    def all(self) -> list[Topic]:
        return list(self._listing()[2])

    def listing(self) -> tuple[Topic, ...]:
        """Every topic sorted by name: the same tuple object for as long as the catalog is
        unchanged, so a caller may cache what it derives from it by identity."""
        return self._listing()[2]

    def _listing(self) -> tuple[object, int, tuple[Topic, ...], dict[uuid.UUID, Topic]]:
        keyed, version = self._store.keyed_state(CONFIG_FAMILY)
        listed = self._listed
        if listed is not None and listed[0] is keyed and listed[1] == version:
            return listed
        out = []
        for key, raw in self._store.keyed_items(CONFIG_FAMILY, _KEY_PREFIX):
            name = key[len(_KEY_PREFIX):].decode()
            out.append(self.get(name) or _decode(name, raw))
        topics = tuple(sorted(out, key=lambda t: t.name))
        self._listed = (keyed, version, topics, {t.topic_id: t for t in topics})
        return self._listed

    def names(self) -> list[str]:
        return [t.name for t in self.all()]

    # --- changes ----------------------------------------------------------------------

    def create(
        self,
        name: str,
        partitions: int = -1,
        configs: Mapping[str, str | None] | None = None,
        *,
        validate_only: bool = False,
        internal: bool = False,
    ) -> Deferred:
        """Create a topic; fires with the Topic. Raises KafkaError synchronously on bad input.
        An internal name is refused unless ``internal`` (the broker's own creation)."""
        validate_topic_name(name)
        if name in INTERNAL_TOPICS and not internal:
            raise KafkaError(ErrorCode.invalid_request,
                             f"Creation of internal topic {name} is prohibited.")
        if partitions is None or partitions < 1:
            partitions = self.default_partitions
        if partitions > MAX_PARTITIONS:
            raise KafkaError(ErrorCode.invalid_partitions,
                             f"Count exceeds the maximum of {MAX_PARTITIONS}")
        # Kafka's order: an existing topic is reported before its configs are looked at.
        if self.get(name) is not None:
            raise KafkaError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")
        self._check_collision(name)
        self._check_budget(partitions)
        explicit = {k: v for k, v in (configs or {}).items() if v is not None}
        seen = self._defaults_state()
        defaults = self.dynamic_defaults()
        log_changes = _all_log_changes(explicit, defaults)
        topic = Topic(name, uuid.uuid4(), partitions, explicit, defaults)
        if validate_only:
            return _done(topic)
        # The catalog entry, with "must be absent", goes last: the batch checks it before
        # anything is applied (another node created the topic meanwhile: nothing of this
        # request is), and a full disk failing a channel leaves no catalog entry behind.
        cmds: list[c.Command] = [
            c.CreateChannel(channel_for(name, p), "events", log_changes, exist_ok=True)
            for p in range(partitions)]
        cmds.append(self._put(topic, expect=None))
        d = self._reserving(partitions, c.Batch(tuple(cmds)))
        d.addErrback(_conflict_as, KafkaError(ErrorCode.topic_already_exists,
                                              f"Topic '{name}' already exists."))
        d.addCallback(lambda _r: self._follow_defaults(seen, [name]))
        return d.addCallback(lambda _r: topic)

    def ensure_offsets_topic(self) -> Deferred | None:
        """Create ``__consumer_offsets`` if it does not exist yet, as Kafka does when a group
        first looks for its coordinator, so clients see Kafka's topic list (aiokafka and
        kafka-python list it with ``exclude_internal_topics=False``). Committed offsets live
        in the store's coordinator channels: its partitions stay empty. Returns the create's
        Deferred, or None when there is nothing to do (or no room for 50 partitions)."""
        if self.get(OFFSETS_TOPIC) is not None or self._creating_offsets:
            return None
        try:
            d = self.create(OFFSETS_TOPIC, OFFSETS_TOPIC_PARTITIONS, OFFSETS_TOPIC_CONFIGS,
                            internal=True)
        except KafkaError as exc:
            _log.info("not creating {topic}: {why}", topic=OFFSETS_TOPIC, why=exc.message)
            return None
        self._creating_offsets = True

        def done(result: Any) -> Any:
            self._creating_offsets = False
            if isinstance(result, Failure) and not result.check(KafkaError):
                _log.warn("creating {topic} failed: {why}", topic=OFFSETS_TOPIC,
                         why=result.getErrorMessage())
            return None  # a lost race (another node created it) is no error either

        return d.addBoth(done)

    def _check_budget(self, more: int) -> None:
        """Each partition keeps a segment file open: past the budget the process would run out
        of file descriptors, fail its fsyncs and refuse every write, even after a restart."""
        if self.max_partitions is None:
            return
        held = self._store.channel_count() + self._reserved
        if held + more > self.max_partitions:
            raise KafkaError(
                ErrorCode.policy_violation,
                f"{more} more partition(s) would take this broker past {self.max_partitions}, "
                f"the most its open-file limit allows (it holds {held}, counting creates "
                f"under way); raise LimitNOFILE")

    def _reserving(self, more: int, command: c.Command) -> Deferred:
        """Propose ``command``, which adds ``more`` partitions, holding them against the
        budget until it is answered: the topics of one CreateTopics request (and of requests
        running at once) are checked against each other, not each against the channels
        applied so far (30 topics of 256 partitions in one request went 1,500 past it)."""
        self._reserved += more

        def release(result: Any) -> Any:
            self._reserved -= more
            return result

        return self._store.propose(command).addBoth(release)

    def _check_collision(self, name: str) -> None:
        """Kafka refuses names equal to an existing one once '.' and '_' are identified."""
        if "." not in name and "_" not in name:
            return
        folded = name.replace(".", "_")
        for other in self.names():
            if other != name and other.replace(".", "_") == folded:
                raise KafkaError(ErrorCode.invalid_topic_exception,
                                 f"Topic '{name}' collides with existing topic: {other}")

    def retrying(self, attempt: Callable[[], Any], tries: int = RACE_TRIES) -> Deferred:
        """``attempt()``, run again on the catalog as it now is while its write loses the
        race to another change of the same topic (the write's ``expect`` no longer holds):
        Kafka's controller applies such changes one after the other, so both succeed there,
        or the later one fails on the state the first left. ``attempt``'s own errors pass
        through; after ``tries`` lost races the answer is UNKNOWN_SERVER_ERROR."""
        def lost(failure: Failure) -> Any:
            failure.trap(KeyConflict)
            if tries <= 1:
                raise _CHANGED
            return self.retrying(attempt, tries - 1)

        return maybeDeferred(attempt).addErrback(lost)

    def add_partitions(self, name: str, count: int, *, validate_only: bool = False) -> Deferred:
        """Grow a topic to ``count`` partitions under the seed's increase-only rules. Its write
        fails with ``KeyConflict`` if the topic changed meanwhile: run it under ``retrying``."""
        topic = self.require(name)
        if count > MAX_PARTITIONS:
            raise KafkaError(ErrorCode.invalid_partitions,
                             f"Count exceeds the maximum of {MAX_PARTITIONS}")
        if count == topic.partitions:
            raise KafkaError(ErrorCode.invalid_partitions,
                             f"topic already has {topic.partitions} partition(s)")
        if count < topic.partitions:
            raise KafkaError(ErrorCode.invalid_partitions, "partition count must be >= current")
        self._check_budget(count - topic.partitions)
        grown = Topic(topic.name, topic.topic_id, count, topic.configs, topic.defaults)
        if validate_only:
            return _done(grown)
        seen = self._defaults_state()
        log_changes = _all_log_changes(topic.configs, topic.defaults)
        cmds: list[c.Command] = [
            c.CreateChannel(channel_for(name, p), "events", log_changes, exist_ok=True)
            for p in range(topic.partitions, count)]
        cmds.append(self._put(grown, expect=self._raw(name)))  # last, as in ``create``
        d = self._reserving(count - topic.partitions, c.Batch(tuple(cmds)))
        d.addCallback(lambda _r: self._follow_defaults(seen, [name]))
        return d.addCallback(lambda _r: self._notify(self._grown_listeners, grown,
                                                   "partitions-added"))

    def set_configs(
        self, name: str, configs: Mapping[str, str | None], *, replace: bool,
        validate_only: bool = False,
    ) -> Deferred:
        """AlterConfigs (``replace=True``: unspecified go back to defaults) or incremental.
        ``KeyConflict`` if the topic changed meanwhile: run it under ``retrying``."""
        topic = self.require(name)
        if replace:
            merged = {k: v for k, v in configs.items() if v is not None}
        else:
            merged = dict(topic.configs)
            for k, v in configs.items():
                if v is None:
                    merged.pop(k, None)
                else:
                    merged[k] = v
        validate_configs(configs)
        seen = self._defaults_state()
        log_changes = _all_log_changes(merged, topic.defaults)
        updated = Topic(topic.name, topic.topic_id, topic.partitions, merged, topic.defaults)
        if validate_only:
            return _done(updated)
        cmds: list[c.Command] = [self._put(updated, expect=self._raw(name))]
        cmds += [c.SetChannelConfig(ch, log_changes) for ch in topic.channels()]
        d = self._store.propose(c.Batch(tuple(cmds)))
        d.addCallback(lambda _r: self._follow_defaults(seen, [name]))
        return d.addCallback(lambda _r: updated)

    def set_cluster_defaults(self, changes: Mapping[str, str | None], *, replace: bool,
                             validate_only: bool = False, broker_id: int | None = None
                             ) -> Deferred:
        """Change the dynamic defaults of topic configs set cluster-wide, or for broker
        ``broker_id`` (``changes`` by topic config name; None deletes; ``replace``:
        unspecified ones go). In the same replicated batch every topic's channels get their
        log config anew, so topics without an override follow at once. Fires with the new
        defaults. ``KeyConflict`` if they changed meanwhile: run it under ``retrying``."""
        key = _defaults_key(broker_id)
        raw = self._store.keyed_get(CONFIG_FAMILY, key)
        merged = {} if replace else (json.loads(raw) if raw else {})
        for name, value in changes.items():
            if value is None:
                merged.pop(name, None)
            else:
                merged[name] = value
        validate_configs({k: v for k, v in changes.items() if v is not None})
        if broker_id is None:
            effective = {**merged, **self.cluster_defaults(self.node_id)}
        else:
            effective = {**self.cluster_defaults(), **merged}
        per_topic = [(topic, _all_log_changes(dict(topic.configs), effective))
                     for topic in self.all()]  # INVALID_CONFIG if any topic would be invalid
        _all_log_changes({}, effective)
        if validate_only:
            return _done(merged)
        value = json.dumps(merged, sort_keys=True).encode() if merged else None
        cmds: list[c.Command] = [c.KeyedPut(
            CONFIG_FAMILY, ((key, value),), self._store.now_ms(), expect=((key, raw),))]
        for topic, log_changes in per_topic:
            cmds += [c.SetChannelConfig(ch, log_changes) for ch in topic.channels()]
        d = self._store.propose(c.Batch(tuple(cmds)))
        known = {topic.name for topic, _changes in per_topic}
        # Topics created meanwhile were given the defaults as they were: give them these.
        d.addCallback(lambda _r: self._refresh([n for n in self.names() if n not in known]))
        return d.addCallback(lambda _r: merged)

    def _defaults_state(self) -> tuple[bytes | None, bytes | None]:
        return (self._store.keyed_get(CONFIG_FAMILY, _CLUSTER_DEFAULTS_KEY),
                self._store.keyed_get(CONFIG_FAMILY, self._broker_key))

    def _follow_defaults(self, seen: tuple[bytes | None, bytes | None],
                         names: list[str]) -> Deferred:
        """A change proposed under the dynamic defaults ``seen`` may have been applied after
        the defaults changed (another request): then its topics' channels get their log
        config under the defaults in force now. Nothing when they stayed the same."""
        if self._defaults_state() == seen:
            return succeed(None)
        return self._refresh(names)

    def _refresh(self, names: list[str]) -> Deferred:
        """Give the named topics' channels their log config under today's defaults (one
        replicated command). A topic the defaults no longer fit is left as it is, and logged."""
        cmds: list[c.Command] = []
        for name in names:
            topic = self.get(name)
            if topic is None:
                continue
            try:
                changes = _all_log_changes(dict(topic.configs), topic.defaults)
            except KafkaError as exc:
                _log.warn("topic {topic} keeps its log config: {why}", topic=name,
                          why=exc.message)
                continue
            cmds += [c.SetChannelConfig(ch, changes) for ch in topic.channels()]
        if not cmds:
            return succeed(None)
        return self._store.propose(c.Batch(tuple(cmds)))

    def delete(self, name: str) -> Deferred:
        """Delete a topic. ``KeyConflict`` if it changed meanwhile: run it under ``retrying``."""
        topic = self.require(name)
        key = _KEY_PREFIX + name.encode()
        cmds: list[c.Command] = [c.KeyedPut(CONFIG_FAMILY, ((key, None),), self._store.now_ms(),
                                            expect=((key, self._raw(name)),))]
        cmds += [c.DeleteChannel(ch, missing_ok=True) for ch in topic.channels()]
        self._cache.pop(name, None)
        d = self._store.propose(c.Batch(tuple(cmds)))
        return d.addCallback(lambda _r: self._notify(self._deleted_listeners, topic,
                                                   "topic-deleted"))

    def _raw(self, name: str) -> bytes | None:
        return self._store.keyed_get(CONFIG_FAMILY, _KEY_PREFIX + name.encode())

    def _put(self, topic: Topic, *, expect: bytes | None) -> c.KeyedPut:
        """The catalog write for ``topic``, applied only if the entry still is ``expect``."""
        key = _KEY_PREFIX + topic.name.encode()
        return c.KeyedPut(CONFIG_FAMILY, ((key, _encode(topic)),), self._store.now_ms(),
                          expect=((key, expect),))


_CHANGED = KafkaError(ErrorCode.unknown_server_error,
                      f"the topic was changed concurrently by other requests {RACE_TRIES} "
                      "times; retry")


def _conflict_as(failure: Any, error: KafkaError) -> Any:
    """Turn an apply-time KeyConflict into the Kafka error the caller should see."""
    failure.trap(KeyConflict)
    raise error


def _encode(topic: Topic) -> bytes:
    return json.dumps({"id": str(topic.topic_id), "partitions": topic.partitions,
                       "configs": dict(topic.configs)}, sort_keys=True).encode()


def _defaults_key(broker_id: int | None) -> bytes:
    """The key of the dynamic defaults set cluster-wide (None) or for one broker."""
    return _CLUSTER_DEFAULTS_KEY if broker_id is None else (
        _CLUSTER_DEFAULTS_KEY + b":" + str(broker_id).encode())


def _decode(name: str, raw: bytes, defaults: Mapping[str, str] | None = None) -> Topic:
    data = json.loads(raw)
    return Topic(name, uuid.UUID(data["id"]), int(data["partitions"]), data.get("configs", {}),
                 defaults or {})


def _done(value: Any) -> Deferred:
    d: Deferred = Deferred()
    d.callback(value)
    return d


def describe_configs(topic: Topic, names: Iterable[str] | None = None) -> list[tuple[str, str, bool]]:
    """(name, value, is_default) for DescribeConfigs, in name order."""
    wanted = sorted(TOPIC_CONFIG_DEFAULTS) if names is None else list(names)
    out = []
    for name in wanted:
        if name not in TOPIC_CONFIG_DEFAULTS:
            continue
        explicit = name in topic.configs
        out.append((name, topic.config_value(name) or "", not explicit))
    return out


def log_config_for(configs: Mapping[str, str]) -> LogConfig:
    return LogConfig().with_changes(**_all_log_changes(configs))
