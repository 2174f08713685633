"""SaslHandshake (17) and SaslAuthenticate (36): a connection proves who it is before anything
else (``net/sasl.py`` holds the mechanisms and the per-connection state). Beside them the SCRAM
credential APIs, DescribeUserScramCredentials (50) and AlterUserScramCredentials (51), served
whether SASL is on or not, as Kafka does (``scram_credentials.py`` stores what they change).

The two SASL APIs are registered only when SASL is on (``CONNECTORS_KAFKA_SASL_MECHANISMS``),
so ApiVersions advertises them exactly when they work. After SaslHandshake v1 the exchange travels in
SaslAuthenticate requests; after v0 (older clients) in bare length-prefixed tokens, which the
connection hands to the session itself (``KafkaProtocol._raw_sasl_token``). A refused
mechanism, refused credentials, or a request out of order is answered with its error code and
then the connection closes, as Kafka does. SaslAuthenticate tells the client how long its
session lasts (0 unless ``CONNECTORS_KAFKA_CONNECTIONS_MAX_REAUTH_MS`` is set: KIP-368).

With ACLs on, describing SCRAM credentials needs DESCRIBE on the cluster and altering them ALTER
(else CLUSTER_AUTHORIZATION_FAILED: for every user altered, as Kafka answers; for a describe, see
``_describe_refused``).
"""
from __future__ import annotations

import datetime
from collections import Counter
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i64Timedelta

from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka import authz
from kmqkafka.kafka.context import RequestContext
from kmqkafka.kafka.scram_credentials import ScramCredentials
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of
from kmqkafka.net.sasl import (
    SASL_AUTHENTICATE, SASL_HANDSHAKE, AuthenticationFailed, IllegalSaslState, SaslUsers,
)

__all__ = ["register", "register_sasl"]

DESCRIBE_USER_SCRAM_CREDENTIALS, ALTER_USER_SCRAM_CREDENTIALS = 50, 51

_NO_EXPIRY = i64Timedelta.parse(datetime.timedelta(0))
_CLUSTER_REFUSED = "Cluster authorization failed."


def sasl_handshake(request: Any, ctx: RequestContext) -> Any:
    session = ctx.sasl
    mechanisms = tuple(session.enabled)
    try:
        if session.authenticated and ctx.api_version == 0:
            raise IllegalSaslState("Re-authentication needs SaslHandshake v1 or later")
        if session.handshake(request.mechanism):
            session.v0 = ctx.api_version == 0
            return make(ctx.response_type, error_code=ErrorCode.none, mechanisms=mechanisms)
        code = ErrorCode.unsupported_sasl_mechanism
    except IllegalSaslState:
        code = ErrorCode.illegal_sasl_state
    # Refused before authentication: the connection closes after the answer. A handshake
    # refused after it (re-authentication while sessions do not expire, as Kafka answers it
    # then, or with another mechanism) leaves the session and the connection as they were.
    session.failed = not session.authenticated
    return make(ctx.response_type, error_code=code, mechanisms=mechanisms)


def sasl_authenticate(request: Any, ctx: RequestContext) -> Any:
    session = ctx.sasl
    try:
        reply = session.authenticate(bytes(request.auth_bytes))
    except AuthenticationFailed as e:
        _count(ctx, session.mechanism, "failure")
        return _refused(ctx, ErrorCode.sasl_authentication_failed, str(e))
    except IllegalSaslState as e:
        session.failed = not session.authenticated
        return _refused(ctx, ErrorCode.illegal_sasl_state, str(e))
    lifetime = _NO_EXPIRY
    if not session.exchanging:
        _count(ctx, session.mechanism, "success")
        lifetime = i64Timedelta.parse(datetime.timedelta(milliseconds=session.lifetime_ms))
    return make(ctx.response_type, error_code=ErrorCode.none, error_message=None,
                auth_bytes=reply, session_lifetime=lifetime)


def _count(ctx: RequestContext, mechanism: str | None, result: str) -> None:
    ctx.broker.metrics.kafka_sasl_authentications.labels(mechanism or "", result).inc()


def _refused(ctx: RequestContext, code: ErrorCode, message: str) -> Any:
    return make(ctx.response_type, error_code=code, error_message=message, auth_bytes=b"",
                session_lifetime=_NO_EXPIRY)


def _known_credentials(ctx: RequestContext) -> dict[str, tuple[tuple[int, int], ...]]:
    """user -> ((mechanism code, iterations), ...): the configured users for each enabled SCRAM
    mechanism, with what an admin stored in their place or beside them."""
    extras = ctx.broker.extras
    sasl: SaslUsers | None = extras.get("sasl")
    known = dict(sasl.scram_credentials()) if sasl is not None else {}
    for user, stored in extras["scram"].described().items():
        merged = dict(known.get(user, ()))
        merged.update(stored)
        known[user] = tuple(sorted(merged.items()))
    return known


def describe_user_scram_credentials(request: Any, ctx: RequestContext) -> Any:
    """All users (null or empty) lists every user with a credential; a named user without
    one is RESOURCE_NOT_FOUND, as in Kafka, and a user named twice is one DUPLICATE_RESOURCE
    row."""
    t = types_of(ctx)
    if not authz.allowed(ctx, authz.DESCRIBE, authz.CLUSTER, authz.CLUSTER_NAME):
        return _describe_refused(request, ctx)
    known = _known_credentials(ctx)

    def row(name: str, count: int) -> Any:
        if count > 1:
            return make(t.DescribeUserScramCredentialsResult, user=name,
                        error_code=ErrorCode.duplicate_resource, credential_infos=(),
                        error_message=f"Cannot describe SCRAM credentials for the same user "
                                      f"twice in a single request: {name}")
        if name not in known:
            return make(t.DescribeUserScramCredentialsResult, user=name,
                        error_code=ErrorCode.resource_not_found, credential_infos=(),
                        error_message=f"Attempt to describe a user credential that does not "
                                      f"exist: {name}")
        return make(t.DescribeUserScramCredentialsResult, user=name, error_code=ErrorCode.none,
                    error_message=None, credential_infos=tuple(
                        make(t.CredentialInfo, mechanism=m, iterations=i)
                        for m, i in known[name]))

    named = Counter(u.name for u in request.users or ())
    asked = named.items() if named else ((name, 1) for name in sorted(known))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                error_message=None, results=tuple(row(name, n) for name, n in asked))


def _describe_refused(request: Any, ctx: RequestContext) -> Any:
    """CLUSTER_AUTHORIZATION_FAILED for a principal without DESCRIBE on the cluster. Kafka puts
    it at the top of the response (and in one unnamed row per user asked about), which
    crashes the process of a confluent-kafka 2.16 client (librdkafka 2.16; with or without
    the rows). Users asked about by name therefore get it in their own rows, which clients
    report the same way (Kafka's Java client fails each user's future with it either way);
    describing every user keeps it at the top, the only place it can be said."""
    t = types_of(ctx)
    refused = ErrorCode.cluster_authorization_failed
    names = list(dict.fromkeys(u.name for u in request.users or ()))
    if not names:
        return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=refused,
                    error_message=_CLUSTER_REFUSED, results=())
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                error_message=None, results=tuple(
                    make(t.DescribeUserScramCredentialsResult, user=name, error_code=refused,
                         error_message=_CLUSTER_REFUSED, credential_infos=())
                    for name in names))


def alter_user_scram_credentials(request: Any, ctx: RequestContext) -> Any:
    t = types_of(ctx)
    scram: ScramCredentials = ctx.broker.extras["scram"]

    def answer(results: list) -> Any:
        return make(ctx.response_type, throttle_time=NO_THROTTLE, results=tuple(
            make(t.AlterUserScramCredentialsResult, user=user, error_code=code,
                 error_message=message)
            for user, code, message in results))

    if not authz.allowed(ctx, authz.ALTER, authz.CLUSTER, authz.CLUSTER_NAME):
        users = {u.name for u in request.deletions} | {u.name for u in request.upsertions}
        return answer([(user, ErrorCode.cluster_authorization_failed, _CLUSTER_REFUSED)
                       for user in sorted(users)])
    return scram.alter(request.deletions, request.upsertions).addCallback(answer)


def register(dispatcher: Dispatcher) -> None:
    dispatcher.register(DESCRIBE_USER_SCRAM_CREDENTIALS, describe_user_scram_credentials, 0, 0)
    dispatcher.register(ALTER_USER_SCRAM_CREDENTIALS, alter_user_scram_credentials, 0, 0)


def register_sasl(dispatcher: Dispatcher, users: SaslUsers | None) -> None:
    """Serve the SASL APIs when ``users`` is set (SASL on), and only then."""
    if users is None:
        return
    dispatcher.register(SASL_HANDSHAKE, sasl_handshake, 0, 1)
    dispatcher.register(SASL_AUTHENTICATE, sasl_authenticate, 0, 2)
