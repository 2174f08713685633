"""Per-channel log settings: segment rolling, retention and compaction."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

CLEANUP_DELETE = "delete"
CLEANUP_COMPACT = "compact"


@dataclass(frozen=True, slots=True)
class LogConfig:
    """How one channel's log rolls, ages out and compacts.

    ``None`` for a retention limit means unlimited (Kafka's -1). Persisted as
    JSON next to the channel's segments.
    """

    segment_bytes: int = 64 * 1024 * 1024
    segment_ms: int = 7 * 24 * 3600 * 1000
    index_interval_bytes: int = 4096
    retention_ms: int | None = 7 * 24 * 3600 * 1000  # MaxAge
    retention_bytes: int | None = None  # MaxBytes
    retention_messages: int | None = None  # MaxMsgs
    cleanup_policy: str = CLEANUP_DELETE  # "delete", "compact" or "compact,delete"
    delete_retention_ms: int = 24 * 3600 * 1000  # how long tombstones survive compaction
    min_compaction_lag_ms: int = 0  # a segment newer than this is not compacted yet
    max_compaction_lag_ms: int = (1 << 63) - 1  # compact (and roll) once dirt is this old
    min_cleanable_dirty_ratio: float = 0.5  # clean once dirty / (clean + dirty) exceeds this
    max_message_bytes: int = 1024 * 1024

    @property
    def compact(self) -> bool:
        return CLEANUP_COMPACT in self.cleanup_policy.split(",")

    @property
    def roll_ms(self) -> int:
        """Longest a segment stays active: Kafka's ``maxSegmentMs`` (a compacted topic also
        rolls by ``max.compaction.lag.ms``, or its newest records could never be cleaned)."""
        return min(self.segment_ms, self.max_compaction_lag_ms) if self.compact else self.segment_ms

    @property
    def delete(self) -> bool:
        return CLEANUP_DELETE in self.cleanup_policy.split(",")

    def with_changes(self, **changes: object) -> "LogConfig":
        return replace(self, **changes)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "LogConfig":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in json.loads(data).items() if k in known})
