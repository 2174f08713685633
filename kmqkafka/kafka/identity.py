"""Who this broker is: node id, cluster id, and the endpoint each listener advertises."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path

from kmqkafka.kafka.context import Broker
from kmqkafka.store.fsutil import write_atomic

_CLUSTER_ID_FILE = "cluster_id"


def cluster_id(broker: Broker) -> str:
    """A stable cluster id (Kafka's 22-char base64 UUID), created once in the data dir."""
    cached = broker.extras.get("cluster_id")
    if cached:
        return cached
    path = Path(broker.settings.data_dir) / _CLUSTER_ID_FILE
    if path.exists():
        value = path.read_text().strip()
    else:
        value = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, value.encode())
    broker.extras["cluster_id"] = value
    return value


def node_id(broker: Broker) -> int:
    return broker.settings.node_id


def advertised(broker: Broker, listener: str) -> tuple[str, int]:
    """(host, port) clients should use on ``listener`` ("PLAINTEXT" or "SSL")."""
    s = broker.settings
    if listener == "SSL":
        return s.kafka_advertised_host, s.kafka_tls_port
    return s.kafka_advertised_host, s.kafka_advertised_port or s.kafka_port
