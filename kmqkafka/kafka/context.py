"""What a Kafka handler receives besides its decoded request.

``RequestContext`` is built by the connection protocol for each request once the header is decoded
and the version has been checked against the registry; handlers must treat it as read-only.
``Broker`` bundles the broker-wide services the tap wires together; handlers reach the store,
clock and metrics through ``ctx.broker`` and never through globals.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from twisted.internet.interfaces import IReactorTime

from kmqkafka.config import Settings
from kmqkafka.metrics import Metrics

ANONYMOUS = "User:ANONYMOUS"


@dataclass
class Broker:
    """Broker-wide services, built once in ``kmqkafka.tap``.

    ``store`` is the channel store facade (``kmqkafka.store.store.ChannelStore``); ``reactor``
    provides ``IReactorTime`` (the only clock handlers may use); ``extras`` is a place for the
    lead to hang further services (coordinators, raft) without changing this type.
    """

    settings: Settings
    reactor: IReactorTime
    metrics: Metrics
    store: Any = None
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RequestContext:
    """Per-request facts for a handler.

    ``response_type`` is the kio response dataclass for (``api_key``, ``api_version``); a handler
    returns an instance of exactly that class (or ``NO_RESPONSE`` for acks=0 Produce).
    ``peer`` is ``"host:port"`` of the client; ``listener`` is ``"PLAINTEXT"`` or ``"SSL"``.
    ``sasl`` is the connection's ``net.sasl.SaslSession`` when SASL is on, else None.
    """

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    response_type: type
    broker: Broker | None
    principal: str = ANONYMOUS
    peer: str = ""
    listener: str = "PLAINTEXT"
    sasl: Any = None
