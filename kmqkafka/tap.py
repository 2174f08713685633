"""``twistd kmqkafka``: Options and makeService, the only place the object graph is built.

Bad settings print one line to stderr and exit with status 2 before anything is opened.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.python import usage

from kmqkafka.config import ConfigError, Settings, load_settings, option_parameters
from kmqkafka.dispatch import Dispatcher
from kmqkafka.http import build_site
from kmqkafka.kafka import (
    admin, api_versions, cluster, configs, consumer_groups, fetch, groups, metadata, offsets,
    positions, produce, producers,
)
from kmqkafka.kafka.context import Broker
from kmqkafka.kafka.topics import TopicCatalog
from kmqkafka.metrics import Metrics
from kmqkafka.net.protocol import ConnectionLimiter, KafkaFactory
from kmqkafka.service import BrokerService, Listener, exit_cleanly_on_sigterm, exit_with


class Options(usage.Options):
    """Every setting as an option (see ``kmqkafka.config.SETTINGS``); unset options defer to
    the environment, then the ``--config`` TOML file, then the defaults."""

    optFlags = [["kafka", None, "enable the Kafka connector [env CONNECTORS_KAFKA_ENABLE]"]]
    optParameters = [["config", "c", None, "TOML settings file (see etc/kmqkafka.toml)"]] + (
        option_parameters()
    )


HANDLER_AREAS = (
    api_versions, metadata, produce, fetch, positions, producers, admin, configs, cluster, groups,
    offsets, consumer_groups,
)


def register_handlers(dispatcher: Dispatcher) -> None:
    """Register every Kafka API handler: each area module has ``register(dispatcher)``."""
    for area in HANDLER_AREAS:
        area.register(dispatcher)


def build_service(settings: Settings, reactor: Any, store: Any = None) -> BrokerService:
    """Wire settings, metrics, store, dispatcher and listeners into the top service.

    ``store`` defaults to a ``ChannelStore`` in ``settings.data_dir``. Raises ``ConfigError``
    for TLS material that cannot be loaded.
    """
    registry = CollectorRegistry(auto_describe=True)
    metrics = Metrics(registry)
    if store is None:
        from kmqkafka.store.store import ChannelStore

        store = ChannelStore(settings.data_dir, reactor, registry=registry)
    broker = Broker(settings=settings, reactor=reactor, metrics=metrics, store=store)
    dispatcher = Dispatcher()
    broker.extras["dispatcher"] = dispatcher
    broker.extras["topics"] = TopicCatalog(store)
    groups.install(broker)  # broker.extras["groups"]; loads its state on first use
    consumer_groups.install(broker)  # broker.extras["consumer_groups"] (KIP-848)
    register_handlers(dispatcher)

    listeners: list[Listener] = []
    if settings.kafka_enable:
        limiter = ConnectionLimiter(settings.kafka_max_connections)

        def factory(name: str) -> KafkaFactory:
            return KafkaFactory(dispatcher, metrics, reactor, settings.max_frame_bytes, limiter,
                                listener=name, broker=broker)

        listeners.append(
            Listener("PLAINTEXT", settings.kafka_bind_host, settings.kafka_port, factory("PLAINTEXT"))
        )
        if settings.kafka_tls_enable:
            from kmqkafka.net.tls import server_context

            assert settings.tls_cert is not None and settings.tls_key is not None
            tls = server_context(settings.tls_cert, settings.tls_key, settings.tls_ca)
            listeners.append(
                Listener("SSL", settings.kafka_bind_host, settings.kafka_tls_port, factory("SSL"),
                         tls=tls)
            )
    service = BrokerService(reactor, store, None, listeners)
    service.http = Listener("HTTP", settings.http_host, settings.http_port,
                            build_site(registry, service.is_ready))
    service.broker = broker  # type: ignore[attr-defined]
    return service


def makeService(options: Options) -> BrokerService:
    """twistd entry point: validate settings (one line and exit 2 on error), then wire."""
    from twisted.internet import reactor

    try:
        settings = load_settings(options, os.environ, options["config"])
        service = build_service(settings, reactor)
    except ConfigError as e:
        sys.stderr.write(f"kmqkafka: {e}\n")
        sys.stderr.flush()
        raise SystemExit(2) from None
    reactor.callWhenRunning(exit_cleanly_on_sigterm, reactor)
    reactor.addSystemEventTrigger("after", "shutdown", exit_with, service)
    return service
