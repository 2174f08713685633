"""The authorization check handlers call: may this request's principal do an operation on a
resource?

With ``CONNECTORS_KAFKA_ACL_ENABLE`` off there is no ``authorizer`` among the broker's extras and
every check passes (Kafka without an authorizer). With it on, ``Authorizer`` answers from the
stored bindings (``acl_store``) by Kafka's rule (``authorizer``), for the request's principal and
client address. Decisions are cached until the bindings change, so the hot paths (Produce, Fetch)
pay one dictionary lookup per topic.

Handlers use ``allowed``, ``allowed_by_type`` and ``operations``; the resource and operation codes
are re-exported from ``authorizer`` so handlers import one module.
"""
from __future__ import annotations

from typing import Any

from kmqkafka.kafka.acl_store import StoredAcls
from kmqkafka.kafka.authorizer import (  # re-exported for handlers
    ALL, ALTER, ALTER_CONFIGS, CLUSTER, CLUSTER_ACTION, CLUSTER_NAME, CREATE, DELETE, DESCRIBE,
    DESCRIBE_CONFIGS, GROUP, IDEMPOTENT_WRITE, READ, SUPPORTED_OPERATIONS, TOPIC,
    TRANSACTIONAL_ID, WRITE, AclRules)
from kmqkafka.kafka.context import RequestContext

__all__ = ["ALL", "ALTER", "ALTER_CONFIGS", "CLUSTER", "CLUSTER_ACTION", "CLUSTER_NAME", "CREATE",
           "DELETE", "DESCRIBE", "DESCRIBE_CONFIGS", "GROUP", "IDEMPOTENT_WRITE", "READ",
           "TOPIC", "TRANSACTIONAL_ID", "WRITE", "Authorizer", "filtered", "allowed", "allowed_by_type", "enabled", "host_of", "operations"]

_CACHE_LIMIT = 65536


def host_of(peer: str) -> str:
    """The client address of a ``host:port`` (or ``[v6]:port``) peer text."""
    if peer.startswith("["):
        return peer[1:].partition("]")[0]
    return peer.rpartition(":")[0] or peer


class Authorizer:
    """Kafka's StandardAuthorizer over the stored bindings, with a decision cache."""

    def __init__(self, acls: StoredAcls) -> None:
        self.acls = acls
        self._rules: AclRules | None = None
        self._decisions: dict[tuple, bool] = {}

    def rules(self) -> AclRules:
        rules = self.acls.rules()
        if rules is not self._rules:
            self._rules = rules
            self._decisions = {}
        return rules

    def authorize(self, principal: str, host: str, operation: int, resource_type: int,
                  name: str) -> bool:
        rules = self.rules()
        key = (principal, host, operation, resource_type, name)
        decision = self._decisions.get(key)
        if decision is None:
            if len(self._decisions) >= _CACHE_LIMIT:
                self._decisions = {}
            decision = self._decisions[key] = rules.authorize(*key)
        return decision


def _authorizer(ctx: RequestContext) -> Authorizer | None:
    broker = ctx.broker
    return None if broker is None else broker.extras.get("authorizer")


def enabled(ctx: RequestContext) -> bool:
    """Is an authorizer configured (ACL APIs served, checks made)?"""
    return _authorizer(ctx) is not None


def allowed(ctx: RequestContext, operation: int, resource_type: int, name: str) -> bool:
    """May the request's principal do ``operation`` on the named resource? (Always, without an
    authorizer.) A CLUSTER resource is named ``CLUSTER_NAME``."""
    auth = _authorizer(ctx)
    if auth is None:
        return True
    return auth.authorize(ctx.principal, host_of(ctx.peer), operation, resource_type, name)


def allowed_by_type(ctx: RequestContext, operation: int, resource_type: int) -> bool:
    """May the principal do ``operation`` on some resource of the type (Kafka's
    ``authorizeByResourceType``)?"""
    auth = _authorizer(ctx)
    if auth is None:
        return True
    return auth.rules().authorize_by_type(ctx.principal, host_of(ctx.peer), operation,
                                          resource_type)


def operations(ctx: RequestContext, resource_type: int, name: str) -> int:
    """The authorized-operations bit set of one resource for this principal: every supported
    operation without an authorizer, as Kafka reports."""
    auth = _authorizer(ctx)
    if auth is None:
        return sum(1 << op for op in SUPPORTED_OPERATIONS[resource_type])
    return auth.rules().operations(ctx.principal, host_of(ctx.peer), resource_type, name)


def filtered(ctx: RequestContext, operation: int, resource_type: int, names: Any) -> list:
    """The names among ``names`` the principal may do ``operation`` on, in order."""
    auth = _authorizer(ctx)
    if auth is None:
        return list(names)
    return [n for n in names if allowed(ctx, operation, resource_type, n)]
