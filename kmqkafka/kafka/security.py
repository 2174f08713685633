"""SaslHandshake (17) and SaslAuthenticate (36): a connection proves who it is before anything
else (``net/sasl.py`` holds the mechanisms and the per-connection state).

Registered only when SASL is on (``CONNECTORS_KAFKA_SASL_MECHANISMS``), so ApiVersions
advertises them exactly when they work. After SaslHandshake v1 the exchange travels in
SaslAuthenticate requests; after v0 (older clients) in bare length-prefixed tokens, which the
connection hands to the session itself (``KafkaProtocol._raw_sasl_token``). A refused
mechanism, refused credentials, or a request out of order is answered with its error code and
then the connection closes, as Kafka does. Authenticated sessions never expire
(``session_lifetime_ms`` 0: no KIP-368 re-authentication is asked for).
"""
from __future__ import annotations

import datetime
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i64Timedelta

from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka.context import RequestContext
from kmqkafka.kafka.wire import make
from kmqkafka.net.sasl import (
    SASL_AUTHENTICATE, SASL_HANDSHAKE, AuthenticationFailed, IllegalSaslState, SaslUsers,
)

__all__ = ["register_sasl"]

_NO_EXPIRY = i64Timedelta.parse(datetime.timedelta(0))


def sasl_handshake(request: Any, ctx: RequestContext) -> Any:
    session = ctx.sasl
    mechanisms = tuple(session.enabled)
    try:
        if session.handshake(request.mechanism):
            session.v0 = ctx.api_version == 0
            return make(ctx.response_type, error_code=ErrorCode.none, mechanisms=mechanisms)
        code = ErrorCode.unsupported_sasl_mechanism
    except IllegalSaslState:
        code = ErrorCode.illegal_sasl_state
    session.failed = True
    return make(ctx.response_type, error_code=code, mechanisms=mechanisms)


def sasl_authenticate(request: Any, ctx: RequestContext) -> Any:
    session = ctx.sasl
    try:
        reply = session.authenticate(bytes(request.auth_bytes))
    except AuthenticationFailed as e:
        return _refused(ctx, ErrorCode.sasl_authentication_failed, str(e))
    except IllegalSaslState as e:
        session.failed = True
        return _refused(ctx, ErrorCode.illegal_sasl_state, str(e))
    return make(ctx.response_type, error_code=ErrorCode.none, error_message=None,
                auth_bytes=reply, session_lifetime=_NO_EXPIRY)


def _refused(ctx: RequestContext, code: ErrorCode, message: str) -> Any:
    return make(ctx.response_type, error_code=code, error_message=message, auth_bytes=b"",
                session_lifetime=_NO_EXPIRY)


def register_sasl(dispatcher: Dispatcher, users: SaslUsers | None) -> None:
    """Serve the SASL APIs when ``users`` is set (SASL on), and only then."""
    if users is None:
        return
    dispatcher.register(SASL_HANDSHAKE, sasl_handshake, 0, 1)
    dispatcher.register(SASL_AUTHENTICATE, sasl_authenticate, 0, 2)
