"""Client quotas: DescribeClientQuotas (48), AlterClientQuotas (49), and which quota holds a
request (``kafka-configs --entity-type users|clients``, KIP-546).

Kafka's byte-rate quotas: ``producer_byte_rate`` and ``consumer_byte_rate`` for a user (the
principal's name: the SASL user, a certificate's distinguished name, or ``ANONYMOUS``), a client
id, or a user's client id, each also as a default (entity name null, ``--entity-default``).
Every entity is one ``quota:<entity JSON>`` key of the replicated config family, its value the
JSON of its keys, so every node holds clients to the same quotas and they survive a restart.

Which quota holds a request (``limit``): the first entity in Kafka's order that sets the key:
user + client id, user + default client, user, default user + client id, default user +
default client, default user, client id, default client. The start-up setting
(``CONNECTORS_KAFKA_PRODUCE_BYTE_RATE`` / ``_FETCH_BYTE_RATE``, per client id) comes last.
Clients under one entity share its budget, as Kafka's quota metrics do: a user's quota is
shared by all of that user's clients, a default user quota is each user's own.

``request_percentage``, ``controller_mutation_rate`` and IP entities
(``connection_creation_rate``) are refused with INVALID_REQUEST: this broker does not enforce
them, and a quota that is stored but never applied would mislead.

Describing needs DESCRIBE_CONFIGS on the cluster, altering ALTER_CONFIGS (else
CLUSTER_AUTHORIZATION_FAILED), as in Kafka. Reactor-thread only.
"""
from __future__ import annotations

import json
import math
from typing import Any, Iterable

from kio.schema.errors import ErrorCode
from kio.static.primitive import f64
from twisted.internet.defer import Deferred, succeed

from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka import authz
from kmqkafka.kafka.topics import CONFIG_FAMILY
from kmqkafka.kafka.wire import NO_THROTTLE, make, types_of

DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS = 48, 49
USER, CLIENT_ID, IP = "user", "client-id", "ip"
PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE = "producer_byte_rate", "consumer_byte_rate"
ENFORCED = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE)  # both LONG in Kafka's QuotaConfigs
NOT_ENFORCED = ("request_percentage", "controller_mutation_rate", "connection_creation_rate")
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2
_KEY_PREFIX = b"quota:"

# An entity: its (type, name) pairs sorted by type; a null name is the type's default.
Entity = tuple[tuple[str, str | None], ...]


class QuotaError(Exception):
    """A refused entity or filter, with Kafka's error code and message."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _key(entity: Entity) -> bytes:
    return _KEY_PREFIX + json.dumps([list(p) for p in entity], separators=(",", ":")).encode()


def _entity(key: bytes) -> Entity:
    return tuple((t, n) for t, n in json.loads(key[len(_KEY_PREFIX):]))


def user_of(principal: str) -> str:
    """The quota user of a principal (``User:alice`` -> ``alice``)."""
    return principal.split(":", 1)[1] if ":" in principal else principal


class StoredQuotas:
    """The quota entities of one node's store, re-read only when the config family changed."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._seen: tuple[object, int] | None = None
        self._quotas: dict[Entity, dict[str, float]] = {}
        self._keys: set[str] = set()

    def entities(self) -> dict[Entity, dict[str, float]]:
        state = self._store.keyed_state(CONFIG_FAMILY)
        seen = self._seen
        if seen is None or seen[0] is not state[0] or seen[1] != state[1]:
            self._quotas = {_entity(k): json.loads(v)
                            for k, v in self._store.keyed_items(CONFIG_FAMILY, _KEY_PREFIX)}
            self._keys = {k for values in self._quotas.values() for k in values}
            self._seen = state
        return self._quotas

    def sets(self, key: str) -> bool:
        """Does any entity set ``key``? (The per-request check when no quota is in force.)"""
        self.entities()
        return key in self._keys

    def limit(self, key: str, user: str, client_id: str
              ) -> tuple[tuple[str, str], float] | None:
        """The quota of ``key`` for this user and client id: ``(budget key, rate)`` of the
        first entity in Kafka's order that sets it, else None."""
        quotas = self.entities()
        if not quotas:
            return None
        for entity, budget in _precedence(user, client_id):
            values = quotas.get(entity)
            if values is not None and key in values:
                return budget, values[key]
        return None

    def alter(self, changes: Iterable[tuple[Entity, dict[str, float | None]]]) -> Deferred:
        """Apply validated changes (None removes a key) in one replicated write."""
        quotas = self.entities()
        pairs = []
        for entity, ops in changes:
            values = dict(quotas.get(entity, {}))
            for k, v in ops.items():
                if v is None:
                    values.pop(k, None)
                else:
                    values[k] = v
            if values != quotas.get(entity, {}):
                pairs.append((_key(entity), json.dumps(values, sort_keys=True).encode()
                              if values else None))
        if not pairs:
            return succeed(None)
        return self._store.keyed_put(CONFIG_FAMILY, tuple(pairs))


def _precedence(user: str, client: str) -> list[tuple[Entity, tuple[str, str]]]:
    """Kafka's quota entities for a request, most specific first, each with the budget its
    clients share (user and client id tags, "" where the entity does not name that type)."""
    return [
        (((CLIENT_ID, client), (USER, user)), (user, client)),
        (((CLIENT_ID, None), (USER, user)), (user, client)),
        (((USER, user),), (user, "")),
        (((CLIENT_ID, client), (USER, None)), (user, client)),
        (((CLIENT_ID, None), (USER, None)), (user, client)),
        (((USER, None),), (user, "")),
        (((CLIENT_ID, client),), ("", client)),
        (((CLIENT_ID, None),), ("", client)),
    ]


# --- validation (Kafka's ClientQuotaControlManager) ----------------------------------------


def validate_entity(pairs: Iterable[tuple[str, str | None]]) -> Entity:
    """The entity of an AlterClientQuotas entry; raises ``QuotaError``."""
    seen: dict[str, str | None] = {}
    for entity_type, name in pairs:
        if entity_type in seen:
            raise QuotaError(ErrorCode.invalid_request,
                             f"Invalid client quota entity, duplicate entity entry {entity_type}")
        if entity_type not in (USER, CLIENT_ID, IP):
            raise QuotaError(ErrorCode.invalid_request,
                             f"Unhandled client quota entity type: {entity_type}")
        if name is not None and name == "":
            raise QuotaError(ErrorCode.invalid_request, f"Empty {entity_type} not supported")
        seen[entity_type] = name
    if not seen:
        raise QuotaError(ErrorCode.invalid_request, "Invalid empty client quota entity")
    if IP in seen:
        if len(seen) > 1:
            raise QuotaError(ErrorCode.invalid_request,
                             "Invalid quota entity combination, IP entity should not be "
                             "combined with User or ClientId")
        raise QuotaError(ErrorCode.invalid_request,
                         "IP quotas (connection_creation_rate) are not enforced by this broker")
    return tuple(sorted(seen.items()))


def validate_ops(ops: Iterable[tuple[str, float, bool]], entity: Entity
                 ) -> dict[str, float | None]:
    """Key -> new value (None: remove) of an entry's operations; raises ``QuotaError``."""
    out: dict[str, float | None] = {}
    for key, value, remove in ops:
        if key in out:
            raise QuotaError(ErrorCode.invalid_request,
                             f"Duplicate quota key {key} not updating quota for this entity "
                             f"{_describe(entity)}")
        if remove:
            out[key] = None
            continue
        if key in NOT_ENFORCED:
            raise QuotaError(ErrorCode.invalid_request,
                             f"Configuration {key} is not enforced by this broker (only "
                             f"{' and '.join(ENFORCED)} are)")
        if key not in ENFORCED:
            raise QuotaError(ErrorCode.invalid_request, f"Invalid configuration key {key}")
        if not math.isfinite(value) or abs(round(value) - value) > 1e-6:
            raise QuotaError(ErrorCode.invalid_request,
                             f"Configuration {key} must be a Long value")
        if value <= 0:
            raise QuotaError(ErrorCode.invalid_request,
                             f"Configuration {key} must be a positive rate")
        out[key] = float(round(value))
    return out


def _describe(entity: Entity) -> str:
    return "ClientQuotaEntity(entries={" + ", ".join(
        f"{t}={n}" for t, n in entity) + "})"


def matching(entities: Iterable[Entity], components: Iterable[tuple[str, int, str | None]],
             strict: bool) -> list[Entity]:
    """The entities a DescribeClientQuotas filter selects (Kafka's ``ClientQuotasImage``);
    raises ``QuotaError`` for a malformed filter."""
    exact: dict[str, str | None] = {}
    typed: set[str] = set()
    for entity_type, match_type, match in components:
        if not entity_type:
            raise QuotaError(ErrorCode.invalid_request, "Invalid empty entity type.")
        if entity_type in exact or entity_type in typed:
            raise QuotaError(ErrorCode.invalid_request, f"Entity type {entity_type} cannot "
                             "appear more than once in the filter.")
        if entity_type not in (USER, CLIENT_ID, IP):
            raise QuotaError(ErrorCode.unsupported_version,
                             f"Unsupported entity type {entity_type}")
        if match_type == MATCH_EXACT:
            if match is None:
                raise QuotaError(ErrorCode.invalid_request, "Request specified "
                                 "MATCH_TYPE_EXACT, but set match string to null.")
            exact[entity_type] = match
        elif match_type == MATCH_DEFAULT:
            if match is not None:
                raise QuotaError(ErrorCode.invalid_request, "Request specified "
                                 "MATCH_TYPE_DEFAULT, but also specified a match string.")
            exact[entity_type] = None
        elif match_type == MATCH_SPECIFIED:
            if match is not None:
                raise QuotaError(ErrorCode.invalid_request, "Request specified "
                                 "MATCH_TYPE_SPECIFIED, but also specified a match string.")
            typed.add(entity_type)
        else:
            raise QuotaError(ErrorCode.invalid_request, f"Unknown match type {match_type}")
    if (IP in exact or IP in typed) and ({USER, CLIENT_ID} & (set(exact) | typed)):
        raise QuotaError(ErrorCode.invalid_request, "Invalid entity filter component "
                         "combination. IP filter component should not be used with user or "
                         "clientId filter component.")
    out = []
    for entity in entities:
        names = dict(entity)
        if strict and len(names) != len(exact) + len(typed):
            continue
        if all(t in names and names[t] == n for t, n in exact.items()) and all(
                t in names for t in typed):
            out.append(entity)
    return out


# --- handlers ---------------------------------------------------------------------------


def _stored(ctx: Any) -> StoredQuotas:
    return ctx.broker.extras["client_quotas"]


def describe_client_quotas(request: Any, ctx: Any) -> Any:
    t = types_of(ctx)

    def refused(code: ErrorCode, message: str | None) -> Any:
        return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=code,
                    error_message=message, entries=None)

    if not authz.allowed(ctx, authz.DESCRIBE_CONFIGS, authz.CLUSTER, authz.CLUSTER_NAME):
        return refused(ErrorCode.cluster_authorization_failed, None)
    quotas = _stored(ctx).entities()
    try:
        selected = matching(quotas, ((c.entity_type, int(c.match_type), c.match)
                                     for c in request.components), bool(request.strict))
    except QuotaError as exc:
        return refused(exc.code, exc.message)
    entries = tuple(
        make(t.EntryData,
             entity=tuple(make(t.EntityData, entity_type=et, entity_name=n) for et, n in e),
             values=tuple(make(t.ValueData, key=k, value=f64(v))
                          for k, v in sorted(quotas[e].items())))
        for e in sorted(selected, key=lambda e: json.dumps(e)))
    return make(ctx.response_type, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                error_message=None, entries=entries)


def alter_client_quotas(request: Any, ctx: Any) -> Deferred:
    t = types_of(ctx)
    results: list[tuple[Any, ErrorCode, str | None]] = []
    changes: list[tuple[Entity, dict[str, float | None]]] = []
    allowed = authz.allowed(ctx, authz.ALTER_CONFIGS, authz.CLUSTER, authz.CLUSTER_NAME)
    seen: set[Entity] = set()
    for entry in request.entries:
        pairs = tuple((e.entity_type, e.entity_name) for e in entry.entity)
        if not allowed:
            results.append((entry.entity, ErrorCode.cluster_authorization_failed, None))
            continue
        try:
            entity = validate_entity(pairs)
            if entity in seen:
                raise QuotaError(ErrorCode.invalid_request,
                                 f"Ignoring duplicate entity {_describe(entity)}")
            seen.add(entity)
            ops = validate_ops(((o.key, float(o.value), bool(o.remove)) for o in entry.ops),
                               entity)
        except QuotaError as exc:
            results.append((entry.entity, exc.code, exc.message))
            continue
        changes.append((entity, ops))
        results.append((entry.entity, ErrorCode.none, None))

    def respond(outcome: Any = None) -> Any:
        failed = outcome is not None
        return make(ctx.response_type, throttle_time=NO_THROTTLE, entries=tuple(
            make(t.EntryData,
                 error_code=ErrorCode.unknown_server_error if failed and code is ErrorCode.none
                 else code,
                 error_message="the quota could not be stored" if failed and (
                     code is ErrorCode.none) else message,
                 entity=tuple(make(t.EntityData, entity_type=e.entity_type,
                                   entity_name=e.entity_name) for e in raw_entity))
            for raw_entity, code, message in results))

    if request.validate_only or not changes:
        return succeed(respond())
    d = _stored(ctx).alter(changes)
    return d.addCallbacks(lambda _: respond(), lambda f: respond(f))


def install(broker: Any) -> StoredQuotas:
    """``broker.extras["client_quotas"]``: the stored quotas the throttles read."""
    stored = broker.extras.get("client_quotas")
    if stored is None:
        stored = broker.extras["client_quotas"] = StoredQuotas(broker.store)
    return stored


def register(dispatcher: Dispatcher) -> None:
    dispatcher.register(DESCRIBE_CLIENT_QUOTAS, describe_client_quotas, 0, 1)
    dispatcher.register(ALTER_CLIENT_QUOTAS, alter_client_quotas, 0, 1)


__all__ = ["ENFORCED", "Entity", "QuotaError", "StoredQuotas", "install", "matching",
           "register", "user_of", "validate_entity", "validate_ops"]
