"""Channel names: the Kafka topic/partition mapping, reservation, and on-disk encoding."""

from __future__ import annotations

import hashlib
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


DIR_NAME_MAX = 200
"""Longest channel directory name, in bytes: NAME_MAX (255) less room for the suffixes a
directory takes on its way in or out (``.deleted-<index>``). A channel name may be 512
characters and a Kafka partition's ``kafka.T~p`` 260, so longer names are shortened."""

_SAFE = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._~-"
_HASHED = "#"  # never in a quoted name (quote turns it into %23)


def dir_name(name: str) -> str:
    """File-system-safe directory name for a channel: the quoted name (reversible, see
    ``from_dir_name``), or, when that exceeds ``DIR_NAME_MAX``, its head, ``#`` and a digest
    of the whole name; such a directory records the name in its ``name`` file."""
    encoded = quote(name, safe=_SAFE)
    if len(encoded) <= DIR_NAME_MAX:
        return encoded
    digest = hashlib.sha256(name.encode()).hexdigest()[:32]
    return f"{encoded[:DIR_NAME_MAX - len(digest) - 1]}{_HASHED}{digest}"


def is_shortened(encoded: str) -> bool:
    """True for a ``dir_name`` that cannot be reversed (the channel name is in its ``name``
    file)."""
    return _HASHED in encoded


def from_dir_name(encoded: str) -> str:
    """The channel name of a directory that is not ``is_shortened``."""
    return unquote(encoded)
