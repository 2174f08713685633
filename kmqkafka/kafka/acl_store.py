"""ACL bindings created through CreateAcls, stored and replicated like the topic catalog.

Each binding is one ``acl:<json>`` key of the store's config family (the JSON array of its seven
fields; the value is a marker), so a binding created twice is stored once, and a deletion is a
write of the same key with no value. Every node applies the same commands, so every node
authorizes by the same bindings. ``rules()`` rebuilds the indexed ``AclRules`` only when the
config family changed since the last call (``store.keyed_state``), which keeps the per-request
cost of an unchanged set at one comparison.

Reactor-thread only.
"""
from __future__ import annotations

import json
from typing import Any, Iterable

from twisted.internet.defer import Deferred, succeed

from kmqkafka.kafka.authorizer import AclBinding, AclRules
from kmqkafka.kafka.topics import CONFIG_FAMILY

__all__ = ["StoredAcls"]

_KEY_PREFIX = b"acl:"
_PRESENT = b"1"


def _key(b: AclBinding) -> bytes:
    fields = [b.resource_type, b.resource_name, b.pattern_type, b.principal, b.host,
              b.operation, b.permission]
    return _KEY_PREFIX + json.dumps(fields, separators=(",", ":")).encode()


def _binding(key: bytes) -> AclBinding:
    return AclBinding(*json.loads(key[len(_KEY_PREFIX):]))


class StoredAcls:
    """The bindings of one node's store, and the rules they make with the configured defaults
    (super users, ``allow.everyone.if.no.acl.found``)."""

    def __init__(self, store: Any, super_users: Iterable[str] = (),
                 allow_if_no_acl: bool = False) -> None:
        self._store = store
        self._super_users = tuple(super_users)
        self._allow_if_no_acl = allow_if_no_acl
        self._seen: tuple[object, int] | None = None
        self._rules = AclRules((), self._super_users, allow_if_no_acl)

    def rules(self) -> AclRules:
        state = self._store.keyed_state(CONFIG_FAMILY)
        seen = self._seen
        if seen is None or seen[0] is not state[0] or seen[1] != state[1]:
            bindings = [_binding(k) for k, _v in self._store.keyed_items(CONFIG_FAMILY,
                                                                          _KEY_PREFIX)]
            self._rules = AclRules(bindings, self._super_users, self._allow_if_no_acl)
            self._seen = state
        return self._rules

    def create(self, bindings: Iterable[AclBinding]) -> Deferred:
        """Store the bindings (one command); fires once it is applied."""
        pairs = tuple((_key(b), _PRESENT) for b in dict.fromkeys(bindings))
        if not pairs:
            return succeed(None)
        return self._store.keyed_put(CONFIG_FAMILY, pairs)

    def delete(self, bindings: Iterable[AclBinding]) -> Deferred:
        """Remove the bindings (one command); fires once it is applied."""
        pairs = tuple((_key(b), None) for b in dict.fromkeys(bindings))
        if not pairs:
            return succeed(None)
        return self._store.keyed_put(CONFIG_FAMILY, pairs)
