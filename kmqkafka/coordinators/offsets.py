"""Committed offsets of consumer groups, kept in the ``offsets`` coordinator family.

On-disk format (one keyed record per committed partition)::

    key   = group_id "\\x00" topic "\\x00" decimal(partition)     (UTF-8)
    value = JSON {"o": offset, "e": leader_epoch, "m": metadata or null, "t": commit_ms}
    value = null                                                 (offset deleted)

``OffsetStore`` follows the coordinator habit: an operation returns the records to write and
state changes only through ``replay(key, value)``, which is also how the family is loaded at
start-up. The in-memory map is the decoded mirror of the family. Reactor thread only.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily

from kmqkafka.store.names import channel_for

FAMILY = "offsets"
MAX_METADATA_BYTES = 4096  # Kafka's offset.metadata.max.bytes default

TopicPartition = tuple[str, int]
Record = tuple[bytes, "bytes | None"]


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """One committed position: the next offset to consume, as the client committed it."""

    offset: int
    leader_epoch: int = -1
    metadata: str | None = ""
    commit_ms: int = 0


def offset_key(group_id: str, topic: str, partition: int) -> bytes:
    return f"{group_id}\x00{topic}\x00{partition}".encode()


def _parse_key(key: bytes) -> tuple[str, str, int]:
    group_id, topic, partition = key.decode().rsplit("\x00", 2)
    return group_id, topic, int(partition)


class OffsetStore:
    """Decoded view of the ``offsets`` family: group -> (topic, partition) -> CommittedOffset."""

    def __init__(self) -> None:
        self._by_group: dict[str, dict[TopicPartition, CommittedOffset]] = {}

    # --- loading and replay -----------------------------------------------------------

    def load(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        """Replay every live ``(key, value)`` of the family (start-up)."""
        for key, value in items:
            self.replay(key, value)

    def replay(self, key: bytes, value: bytes | None) -> None:
        """Apply one record: the only way state changes."""
        group_id, topic, partition = _parse_key(key)
        if value is None:
            offsets = self._by_group.get(group_id)
            if offsets is not None:
                offsets.pop((topic, partition), None)
                if not offsets:
                    del self._by_group[group_id]
            return
        d = json.loads(value)
        self._by_group.setdefault(group_id, {})[(topic, partition)] = CommittedOffset(
            offset=d["o"], leader_epoch=d.get("e", -1), metadata=d.get("m", ""),
            commit_ms=d.get("t", 0))

    # --- operations: each returns records; the caller writes them and replays them -----

    @staticmethod
    def commit_records(group_id: str, commits: Iterable[tuple[str, int, CommittedOffset]]
                       ) -> list[Record]:
        """Records committing ``(topic, partition, CommittedOffset)`` for ``group_id``."""
        return [
            (offset_key(group_id, topic, partition),
             json.dumps({"o": c.offset, "e": c.leader_epoch, "m": c.metadata,
                         "t": c.commit_ms}, separators=(",", ":")).encode())
            for topic, partition, c in commits
        ]

    def delete_records(self, group_id: str, partitions: Iterable[TopicPartition] | None = None
                       ) -> list[Record]:
        """Records deleting the given committed partitions (all of the group's when None)."""
        have = self._by_group.get(group_id, {})
        wanted = list(have) if partitions is None else [tp for tp in partitions if tp in have]
        return [(offset_key(group_id, t, p), None) for t, p in wanted]

    # --- queries ----------------------------------------------------------------------

    def get(self, group_id: str, topic: str, partition: int) -> CommittedOffset | None:
        return self._by_group.get(group_id, {}).get((topic, partition))

    def of_group(self, group_id: str) -> dict[TopicPartition, CommittedOffset]:
        """A copy of every committed partition of ``group_id``."""
        return dict(self._by_group.get(group_id, {}))

    def has_group(self, group_id: str) -> bool:
        return group_id in self._by_group

    def groups(self) -> list[str]:
        return list(self._by_group)

    def items(self) -> Iterator[tuple[str, str, int, CommittedOffset]]:
        for group_id, offsets in list(self._by_group.items()):
            for (topic, partition), c in list(offsets.items()):
                yield group_id, topic, partition, c


class LagCollector:
    """Prometheus collector: ``kmqkafka_consumer_group_lag{group,topic,partition}``.

    Computed at scrape time as high watermark − committed offset, where the high watermark is
    the partition channel's next durable Sequence − 1 (Kafka offset = Sequence − 1). Partitions
    whose channel no longer exists are skipped. ``ready()`` gates scraping until the store has
    recovered and the coordinator has loaded.
    """

    def __init__(self, offsets: OffsetStore, store: Any, ready: Any) -> None:
        self._offsets = offsets
        self._store = store
        self._ready = ready

    def describe(self) -> list[GaugeMetricFamily]:
        return [self._family()]

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "kmqkafka_consumer_group_lag",
            "High watermark minus committed offset, per consumer group and partition",
            labels=["group", "topic", "partition"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = self._family()
        if self._ready():
            for group_id, topic, partition, c in self._offsets.items():
                channel = channel_for(topic, partition)
                if not self._store.exists(channel):
                    continue
                hwm = self._store.bounds(channel).high_watermark - 1
                family.add_metric([group_id, topic, str(partition)], hwm - c.offset)
        yield family
