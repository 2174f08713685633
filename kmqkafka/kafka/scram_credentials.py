"""SCRAM credentials an admin sets through AlterUserScramCredentials (KIP-554), stored and
replicated like the topic catalog: a ``scram:<user>`` entry of the store's config family whose
value is JSON, one object per mechanism (salt, stored key, server key, iterations; never the
password, which the client already turned into a salted password).

A stored credential is what SCRAM authentication checks first (``net/sasl.py``); a user with
none falls back to the configured users (``CONNECTORS_KAFKA_SASL_USERS``). Validation follows
Kafka's controller: an unknown mechanism is UNSUPPORTED_SASL_MECHANISM, iterations outside
4096..16384, an empty name, salt or salted password UNACCEPTABLE_CREDENTIAL, a user and
mechanism named twice in one request DUPLICATE_RESOURCE, and deleting a credential that does
not exist RESOURCE_NOT_FOUND. Each user's changes are written as one compare-and-set, so a concurrent
change to the same user is retried on the new state rather than lost.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections import Counter
from typing import Any

from kio.schema.errors import ErrorCode
from twisted.internet.defer import Deferred, gatherResults, succeed

from kmqkafka.kafka.topics import CONFIG_FAMILY
from kmqkafka.store import commands as c
from kmqkafka.store.errors import KeyConflict

__all__ = ["MECHANISMS", "ScramCredentials"]

MECHANISMS = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}  # Kafka's ScramMechanism type codes
CODES = {name: code for code, name in MECHANISMS.items()}
_HASH = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MIN_ITERATIONS, MAX_ITERATIONS = 4096, 16384
_KEY_PREFIX = b"scram:"
_RETRIES = 3

Result = tuple[str, ErrorCode, str | None]  # (user, error code, error message)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def derive(mechanism: str, salt: bytes, salted_password: bytes, iterations: int) -> dict:
    """The stored form of a credential (RFC 5802's StoredKey and ServerKey)."""
    name = _HASH[mechanism]
    client_key = hmac.new(salted_password, b"Client Key", name).digest()
    return {"salt": _b64(salt), "stored_key": _b64(hashlib.new(name, client_key).digest()),
            "server_key": _b64(hmac.new(salted_password, b"Server Key", name).digest()),
            "iterations": iterations}


class ScramCredentials:
    """The stored SCRAM credentials of one node's store."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def _raw(self, user: str) -> bytes | None:
        return self._store.keyed_get(CONFIG_FAMILY, _KEY_PREFIX + user.encode())

    def of(self, user: str) -> dict[str, dict]:
        """mechanism -> stored credential, for one user."""
        raw = self._raw(user)
        return json.loads(raw) if raw else {}

    def auth_info(self, mechanism: str, user: str) -> tuple[bytes, bytes, bytes, int] | None:
        """scramp's (salt, stored key, server key, iterations), or None."""
        cred = self.of(user).get(mechanism)
        if cred is None:
            return None
        return (base64.b64decode(cred["salt"]), base64.b64decode(cred["stored_key"]),
                base64.b64decode(cred["server_key"]), cred["iterations"])

    def described(self) -> dict[str, tuple[tuple[int, int], ...]]:
        """user -> ((mechanism code, iterations), ...) of every stored credential."""
        out = {}
        for key, raw in self._store.keyed_items(CONFIG_FAMILY, _KEY_PREFIX):
            creds = json.loads(raw)
            out[key[len(_KEY_PREFIX):].decode()] = tuple(
                (CODES[m], creds[m]["iterations"]) for m in sorted(creds, key=CODES.get))
        return out

    def alter(self, deletions: Any, upsertions: Any) -> Deferred:
        """Apply a request's deletions and upsertions; fires with one ``Result`` per user, in
        the order the users first appear. A user with any refused change gets that error and
        none of its changes."""
        items = (*deletions, *upsertions)
        pairs = Counter((i.name, i.mechanism) for i in items)
        refused: dict[str, Result] = {}
        changes: dict[str, list[tuple[str, dict | None]]] = {}
        for item in items:
            problem = self._problem(item, pairs[(item.name, item.mechanism)])
            if problem is not None:
                refused.setdefault(item.name, (item.name, *problem))
                continue
            cred = None if not hasattr(item, "salt") else derive(
                MECHANISMS[item.mechanism], bytes(item.salt), bytes(item.salted_password),
                item.iterations)
            changes.setdefault(item.name, []).append((MECHANISMS[item.mechanism], cred))
        order = list(dict.fromkeys(i.name for i in items))
        users = [u for u in changes if u not in refused]
        writes = [self._write(u, changes[u]) for u in users]

        def collect(written: list[Result]) -> list[Result]:
            results = {**refused, **{r[0]: r for r in written}}
            return [results[u] for u in order]

        return gatherResults(writes).addCallback(collect)

    @staticmethod
    def _problem(item: Any, times: int) -> tuple[ErrorCode, str] | None:
        if times > 1:
            return (ErrorCode.duplicate_resource,
                    "A user credential cannot be altered twice in the same request")
        if not item.name:
            return ErrorCode.unacceptable_credential, "Username must not be empty"
        if item.mechanism not in MECHANISMS:
            return ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
        if hasattr(item, "salt"):
            if not MIN_ITERATIONS <= item.iterations <= MAX_ITERATIONS:
                few = item.iterations < MIN_ITERATIONS
                return (ErrorCode.unacceptable_credential,
                        f"Too {'few' if few else 'many'} iterations")
            if not item.salt or not item.salted_password:
                return (ErrorCode.unacceptable_credential,
                        "Salt and salted password must not be empty")
        return None

    def _write(self, user: str, edits: list[tuple[str, dict | None]],
               attempt: int = 1) -> Deferred:
        key = _KEY_PREFIX + user.encode()
        raw = self._raw(user)
        creds = json.loads(raw) if raw else {}
        for mechanism, cred in edits:
            if cred is None:
                if mechanism not in creds:
                    return succeed((user, ErrorCode.resource_not_found,
                                    "Attempt to delete a user credential that does not exist"))
                del creds[mechanism]
            else:
                creds[mechanism] = cred
        value = json.dumps(creds, sort_keys=True).encode() if creds else None
        d = self._store.propose(c.KeyedPut(CONFIG_FAMILY, ((key, value),), self._store.now_ms(),
                                           expect=((key, raw),)))

        def failed(failure: Any) -> Any:
            if failure.check(KeyConflict) and attempt < _RETRIES:
                return self._write(user, edits, attempt + 1)
            return (user, ErrorCode.unknown_server_error, failure.getErrorMessage())

        return d.addCallbacks(lambda _: (user, ErrorCode.none, None), failed)
