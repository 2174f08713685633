"""Channel names: the Kafka topic/partition mapping, reservation, and on-disk encoding."""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

from kmqkafka.store.errors import InvalidChannelName, ReservedChannel

KAFKA_PREFIX = "kafka."
RESERVED_PREFIX = "_kafka."
PARTITION_SEPARATOR = "~"
MAX_CHANNEL_NAME = 512

_PARTITION_CHANNEL = re.compile(r"^kafka\.(?P<topic>[^~]+?)(?:~(?P<p>[1-9][0-9]*))?$")


def channel_for(topic: str, partition: int) -> str:
    """Kafka (topic, partition) -> Events Store channel: ``kafka.T`` or ``kafka.T~p``."""
    if partition == 0:
        return f"{KAFKA_PREFIX}{topic}"
    return f"{KAFKA_PREFIX}{topic}{PARTITION_SEPARATOR}{partition}"


def partition_of(channel: str) -> tuple[str, int] | None:
    """Inverse of ``channel_for``; None for a channel that is not a Kafka partition."""
    m = _PARTITION_CHANNEL.match(channel)
    if m is None:
        return None
    return m.group("topic"), int(m.group("p") or 0)


def is_reserved(name: str) -> bool:
    return name.startswith(RESERVED_PREFIX)


def check_client_channel(name: str) -> None:
    """Raise unless a client surface may create, read or write ``name``."""
    check_channel_name(name)
    if is_reserved(name):
        raise ReservedChannel(name)


def check_channel_name(name: str) -> None:
    if not name or len(name) > MAX_CHANNEL_NAME or "\x00" in name:
        raise InvalidChannelName(f"invalid channel name {name!r}")
    if name in (".", "..") or "/" in name:
        raise InvalidChannelName(f"invalid channel name {name!r}")


def dir_name(name: str) -> str:
    """File-system-safe directory name for a channel (reversible)."""
    return quote(name, safe="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._~-")


def from_dir_name(encoded: str) -> str:
    return unquote(encoded)
