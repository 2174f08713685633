"""Every Prometheus metric of the daemon, defined in one place on an injected registry.

Names follow ``kmqkafka_<area>_<what>_<unit>``. The tap builds one ``CollectorRegistry`` and one
``Metrics``; everything else receives them. Handlers increment the per-topic byte counters. Store
size and per-partition log start/end are exported by the store's own collector, which
``ChannelStore`` registers on the same registry (``kmqkafka_store_size_bytes``,
``kmqkafka_partition_log_end_offset``, ``kmqkafka_partition_log_start_offset``). A cluster node
also exports its Raft state (``kmqkafka_raft_*``, ``kmqkafka.raft.metrics``).
"""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)


class Metrics:
    """The metric objects, registered on ``registry`` at construction."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.kafka_requests = Counter(
            "kmqkafka_kafka_requests_total",
            "Kafka requests answered, by API name and version",
            ["api", "version"],
            registry=registry,
        )
        self.kafka_request_latency = Histogram(
            "kmqkafka_kafka_request_latency_seconds",
            "Time from a Kafka request being decoded to its response being queued",
            ["api", "version"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.kafka_request_errors = Counter(
            "kmqkafka_kafka_request_errors_total",
            "Kafka requests that failed in the handler (answered with UNKNOWN_SERVER_ERROR or"
            " closed)",
            ["api", "version"],
            registry=registry,
        )
        self.kafka_protocol_errors = Counter(
            "kmqkafka_kafka_protocol_errors_total",
            "Kafka connections closed for a protocol violation, by reason",
            ["reason"],
            registry=registry,
        )
        self.kafka_connections = Gauge(
            "kmqkafka_kafka_connections_open",
            "Open Kafka connections, by listener",
            ["listener"],
            registry=registry,
        )
        self.kafka_sasl_authentications = Counter(
            "kmqkafka_kafka_sasl_authentications_total",
            "SASL exchanges finished on Kafka connections, by mechanism and result "
            "(success, failure)",
            ["mechanism", "result"],
            registry=registry,
        )
        self.kafka_connections_refused = Counter(
            "kmqkafka_kafka_connections_refused_total",
            "Kafka connections closed at accept because the connection cap was reached",
            registry=registry,
        )
        self.kafka_bytes_in = Counter(
            "kmqkafka_kafka_topic_bytes_in_total",
            "Record-batch bytes produced to a topic",
            ["topic"],
            registry=registry,
        )
        self.kafka_bytes_out = Counter(
            "kmqkafka_kafka_topic_bytes_out_total",
            "Record-batch bytes fetched from a topic",
            ["topic"],
            registry=registry,
        )

        # Labelled children by label values: ``labels()`` costs microseconds on every call,
        # and the produce path asked for three per request.
        self._request_series: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._bytes_in: dict[str, Any] = {}
        self._bytes_out: dict[str, Any] = {}

    def request_series(self, api: str, version: str) -> tuple[Any, Any]:
        """(requests counter, latency histogram) of one API and version."""
        found = self._request_series.get((api, version))
        if found is None:
            found = self._request_series[api, version] = (
                self.kafka_requests.labels(api, version),
                self.kafka_request_latency.labels(api, version))
        return found

    def bytes_in(self, topic: str) -> Any:
        """The produced-bytes counter of ``topic``."""
        found = self._bytes_in.get(topic)
        if found is None:
            found = self._bytes_in[topic] = self.kafka_bytes_in.labels(topic)
        return found

    def bytes_out(self, topic: str) -> Any:
        """The fetched-bytes counter of ``topic``."""
        found = self._bytes_out.get(topic)
        if found is None:
            found = self._bytes_out[topic] = self.kafka_bytes_out.labels(topic)
        return found

    def forget_topic(self, topic: str) -> None:
        """Drop a deleted topic's series (as Kafka's BrokerTopicStats.removeMetrics): a
        topic created again under the name counts from zero."""
        self._bytes_in.pop(topic, None)
        self._bytes_out.pop(topic, None)
        for counter in (self.kafka_bytes_in, self.kafka_bytes_out):
            try:
                counter.remove(topic)
            except KeyError:
                pass
