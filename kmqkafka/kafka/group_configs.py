"""Group configs (KIP-848): the GROUP config resource (type 32) of DescribeConfigs and
IncrementalAlterConfigs.

Kafka 4 lets an admin override, per group, the session timeout and heartbeat interval the
broker gives members of a consumer group (and the share-group settings). An override is a
``group-config:<group>`` entry of the store's config family, replicated like the topic
catalog; the consumer-group coordinator reads it on every heartbeat, so a change reaches the
members at their next one. Describing a group that has none gives the broker defaults, as
Kafka does (whether the group exists or not).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from kio.schema.errors import ErrorCode
from twisted.internet.defer import Deferred, succeed

from kmqkafka.coordinators.share_group import duration_ms
from kmqkafka.kafka.configs import (
    INT, SOURCE_DEFAULT, SOURCE_DYNAMIC_GROUP, STRING, ConfigEntry,
)
from kmqkafka.kafka.errors import KafkaError
from kmqkafka.kafka.topics import CONFIG_FAMILY
from kmqkafka.store import commands as c

__all__ = ["GroupConfigs"]

SESSION_TIMEOUT = "consumer.session.timeout.ms"
HEARTBEAT_INTERVAL = "consumer.heartbeat.interval.ms"
_KEY_PREFIX = b"group-config:"

# name -> (Kafka's default, the broker config that supplies it, allowed range or choices)
_SHARE_DEFAULTS: dict[str, tuple[str, str, Any]] = {
    "share.session.timeout.ms": ("45000", "group.share.session.timeout.ms", (45000, 60000)),
    "share.heartbeat.interval.ms": ("5000", "group.share.heartbeat.interval.ms", (5000, 15000)),
    "share.record.lock.duration.ms": ("30000", "group.share.record.lock.duration.ms",
                                      (15000, 60000)),
    "share.delivery.count.limit": ("5", "group.share.delivery.count.limit", (2, 10)),
    "share.partition.max.record.locks": ("2000", "group.share.partition.max.record.locks",
                                         (100, 10000)),
    "share.auto.offset.reset": ("latest", "", ("latest", "earliest", "by_duration:")),
    "share.isolation.level": ("read_uncommitted", "", ("read_committed", "read_uncommitted")),
}
_STRINGS = frozenset({"share.auto.offset.reset", "share.isolation.level"})
_DOCS = {
    SESSION_TIMEOUT: "How long a consumer-group member may go without a heartbeat before the "
                     "coordinator removes it.",
    HEARTBEAT_INTERVAL: "How often consumer-group members heartbeat to the coordinator.",
    "share.session.timeout.ms": "How long a share-group member may go without a heartbeat "
                                "before the coordinator removes it.",
    "share.heartbeat.interval.ms": "How often share-group members heartbeat to the "
                                   "coordinator.",
    "share.record.lock.duration.ms": "How long a record a share consumer acquired stays "
                                     "locked to it before it is offered again.",
    "share.delivery.count.limit": "How many times a record is delivered before it is "
                                  "archived instead of offered again.",
    "share.partition.max.record.locks": "How many records of one partition the group may have "
                                        "in flight at once.",
    "share.auto.offset.reset": "Where a share group starts reading a partition it has no "
                               "state for: earliest, latest, or by_duration:<ISO-8601 "
                               "duration> (the first record at most that old).",
    "share.isolation.level": "read_committed: deliver only records of committed transactions "
                             "(up to the last stable offset); read_uncommitted: every record.",
}


class GroupConfigs:
    """Reads and writes per-group overrides; reactor thread only."""

    def __init__(self, store: Any, *, session_timeout_ms: int, heartbeat_interval_ms: int) -> None:
        self._store = store
        self._session = session_timeout_ms
        self._heartbeat = heartbeat_interval_ms
        # Kafka's group.consumer.{min,max}.{session.timeout,heartbeat.interval}.ms bounds,
        # widened to take in this broker's own defaults (they are settings here).
        self._ranges: dict[str, tuple[int, int]] = {
            SESSION_TIMEOUT: (min(45000, session_timeout_ms), max(60000, session_timeout_ms)),
            HEARTBEAT_INTERVAL: (min(5000, heartbeat_interval_ms),
                                 max(15000, heartbeat_interval_ms)),
        }

    # --- lookups ---------------------------------------------------------------------

    def defaults(self) -> dict[str, tuple[str, str]]:
        """name -> (default value, broker config that supplies it)."""
        out = {SESSION_TIMEOUT: (str(self._session), "group.consumer.session.timeout.ms"),
               HEARTBEAT_INTERVAL: (str(self._heartbeat), "group.consumer.heartbeat.interval.ms")}
        out.update({name: (d, broker) for name, (d, broker, _r) in _SHARE_DEFAULTS.items()})
        return out

    def overrides(self, group_id: str) -> dict[str, str]:
        raw = self._store.keyed_get(CONFIG_FAMILY, _KEY_PREFIX + group_id.encode())
        return {} if raw is None else json.loads(raw)

    def session_timeout_ms(self, group_id: str) -> int:
        return int(self.overrides(group_id).get(SESSION_TIMEOUT, self._session))

    def heartbeat_interval_ms(self, group_id: str) -> int:
        return int(self.overrides(group_id).get(HEARTBEAT_INTERVAL, self._heartbeat))

    def entries(self, group_id: str, names: list[str] | None) -> list[ConfigEntry]:
        """The group's configs (all, or those of ``names``), in name order."""
        if not group_id:
            raise KafkaError(ErrorCode.invalid_request, "Group name must not be empty")
        set_here = self.overrides(group_id)
        out = []
        for name, (default, broker) in sorted(self.defaults().items()):
            if names is not None and name not in names:
                continue
            synonyms: list[tuple[str, str, int]] = []
            if name in set_here:
                value, source = set_here[name], SOURCE_DYNAMIC_GROUP
                synonyms.append((name, value, SOURCE_DYNAMIC_GROUP))
            else:
                value, source = default, SOURCE_DEFAULT
            if broker:
                synonyms.append((broker, default, SOURCE_DEFAULT))
            kind = STRING if name in _STRINGS else INT
            out.append(ConfigEntry(name, value, source, False, kind, tuple(synonyms),
                                   _DOCS[name]))
        return out

    # --- changes ---------------------------------------------------------------------

    def alter(self, group_id: str, changes: Mapping[str, str | None], *,
              validate_only: bool) -> Deferred:
        """Apply SET (value) / DELETE (None) ``changes`` to one group's overrides."""
        if not group_id:
            raise KafkaError(ErrorCode.invalid_request, "Group name must not be empty")
        merged = self.overrides(group_id)
        for name, value in changes.items():
            self._check(name, value)
            if value is None:
                merged.pop(name, None)
            else:
                merged[name] = value.strip()
        if validate_only:
            return succeed(None)
        key = _KEY_PREFIX + group_id.encode()
        raw = self._store.keyed_get(CONFIG_FAMILY, key)
        value = json.dumps(merged, sort_keys=True).encode() if merged else None
        cmd = c.KeyedPut(CONFIG_FAMILY, ((key, value),), self._store.now_ms(),
                         expect=((key, raw),))
        return self._store.propose(cmd)

    def _check(self, name: str, value: str | None) -> None:
        limits = self._ranges.get(name) or (_SHARE_DEFAULTS[name][2] if name in _SHARE_DEFAULTS
                                            else None)
        if limits is None:
            raise KafkaError(ErrorCode.invalid_config, f"Unknown group config name: {name}")
        if value is None:
            return
        if isinstance(limits[0], str):
            text = value.strip()
            if text.lower().startswith("by_duration:") and "by_duration:" in limits:
                if duration_ms(text[len("by_duration:"):]) is None:
                    raise KafkaError(ErrorCode.invalid_config,
                                     f"Invalid value {value} for configuration {name}: "
                                     "by_duration must be a non-negative ISO-8601 duration")
                return
            if text not in limits or text.endswith(":"):
                raise KafkaError(ErrorCode.invalid_config,
                                 f"Invalid value {value} for configuration {name}: String must "
                                 f"be one of: {', '.join(limits)}")
            return
        text = value.strip()
        if not text.lstrip("-").isdigit() or not -(1 << 31) <= int(text) < (1 << 31):
            raise KafkaError(ErrorCode.invalid_config,
                             f"Invalid value {value} for configuration {name}: "
                             "Not a number of type INT")
        low, high = limits
        if not low <= int(text) <= high:
            raise KafkaError(ErrorCode.invalid_config,
                             f"Invalid value {value} for configuration {name}: "
                             f"Value must be at least {low} and no more than {high}")
