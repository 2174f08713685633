"""Kafka's ACL model and its authorization rule, as pure logic (no store, no clock, no sockets).

An ACL binding says: principal P from host H is allowed (or denied) operation O on resources of
type T whose name matches N (the literal name, ``*`` for every name, or a prefix). The rule is
the one Apache Kafka's StandardAuthorizer applies:

- a super user may do everything;
- among the bindings whose resource pattern matches the name (literal equal, literal ``*``, or a
  prefix of it), those for the principal (or ``User:*``) and the host (or ``*``) decide: any
  DENY for the operation (or ALL) denies; else any ALLOW for it (or ALL) allows, where an ALLOW
  of READ, WRITE, DELETE or ALTER also allows DESCRIBE and an ALLOW of ALTER_CONFIGS allows
  DESCRIBE_CONFIGS (implication never applies to DENY);
- when nothing decides: denied if the resource has any binding at all (for anyone), else what
  ``allow.everyone.if.no.acl.found`` says.

``authorize_by_type`` is Kafka's ``authorizeByResourceType`` (may the principal do O on *some*
resource of type T?), which InitProducerId uses for idempotent producers. Codes are the wire
values of Kafka's ResourceType, PatternType, AclOperation and AclPermissionType.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

__all__ = [
    "ALL", "ALLOW", "ALTER", "ALTER_CONFIGS", "ANY", "AclBinding", "AclFilter", "AclRules",
    "CLUSTER", "CLUSTER_ACTION", "CLUSTER_NAME", "CREATE", "DELETE", "DENY", "DESCRIBE",
    "DESCRIBE_CONFIGS", "GROUP", "IDEMPOTENT_WRITE", "LITERAL", "MATCH", "PREFIXED", "READ",
    "SUPPORTED_OPERATIONS", "TOPIC", "TRANSACTIONAL_ID", "WILDCARD", "WRITE", "parse_principal",
]

# Shared by every enum: 0 UNKNOWN, 1 ANY (filters only).
UNKNOWN, ANY = 0, 1
# ResourceType
TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID, DELEGATION_TOKEN, USER = 2, 3, 4, 5, 6, 7
# PatternType (MATCH: filters only)
MATCH, LITERAL, PREFIXED = 2, 3, 4
# AclOperation
(ALL, READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS,
 ALTER_CONFIGS, IDEMPOTENT_WRITE, CREATE_TOKENS, DESCRIBE_TOKENS) = range(2, 15)
# AclPermissionType
DENY, ALLOW = 2, 3

WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"

RESOURCE_TYPES = (TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID, DELEGATION_TOKEN, USER)
OPERATIONS = tuple(range(ALL, DESCRIBE_TOKENS + 1))

# Kafka's AclEntry.supportedOperations: what "authorized operations" fields report per type.
SUPPORTED_OPERATIONS: dict[int, tuple[int, ...]] = {
    TOPIC: (READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER, DESCRIBE_CONFIGS, ALTER_CONFIGS),
    GROUP: (READ, DESCRIBE, DELETE, DESCRIBE_CONFIGS, ALTER_CONFIGS),
    CLUSTER: (CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALTER,
              DESCRIBE),
    TRANSACTIONAL_ID: (DESCRIBE, WRITE),
    DELEGATION_TOKEN: (DESCRIBE,),
    USER: (CREATE_TOKENS, DESCRIBE_TOKENS),
}

_IMPLIES_DESCRIBE = frozenset((DESCRIBE, READ, WRITE, DELETE, ALTER))
_IMPLIES_DESCRIBE_CONFIGS = frozenset((DESCRIBE_CONFIGS, ALTER_CONFIGS))


def parse_principal(text: str) -> tuple[str, str] | None:
    """``"User:alice"`` -> ("User", "alice"); None unless it is ``Type:name`` with both parts."""
    kind, sep, name = text.partition(":")
    if not sep or not kind or not name:
        return None
    return kind, name


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One stored ACL: a resource pattern and an access control entry."""

    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission: int

    def problem(self) -> str | None:
        """Why Kafka's controller would refuse to create this binding, else None."""
        if self.resource_type not in RESOURCE_TYPES:
            return f"Invalid resourceType {self.resource_type}"
        if self.pattern_type not in (LITERAL, PREFIXED):
            return f"Invalid patternType {self.pattern_type}"
        if self.operation not in OPERATIONS:
            return f"Invalid operation {self.operation}"
        if self.permission not in (DENY, ALLOW):
            return f"Invalid permissionType {self.permission}"
        if not self.resource_name:
            return "Resource name should not be empty"
        if self.resource_type == CLUSTER and self.resource_name != CLUSTER_NAME:
            return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
        if parse_principal(self.principal) is None:
            return (f"Could not parse principal from `{self.principal}` (no colon is "
                    "present separating the principal type from the principal name)")
        if not self.host:
            return "Invalid host: must not be empty"
        return None


@dataclass(frozen=True, slots=True)
class AclFilter:
    """What DescribeAcls and DeleteAcls select: ANY (code) or None (text) matches every value;
    pattern MATCH selects what would apply to the named resource (literal name, ``*``, and
    prefixes of it)."""

    resource_type: int
    resource_name: str | None
    pattern_type: int
    principal: str | None
    host: str | None
    operation: int
    permission: int

    def problem(self) -> str | None:
        if self.resource_type not in (ANY, *RESOURCE_TYPES):
            return f"Invalid resourceType {self.resource_type}"
        if self.pattern_type not in (ANY, MATCH, LITERAL, PREFIXED):
            return f"Invalid patternType {self.pattern_type}"
        if self.operation not in (ANY, *OPERATIONS):
            return f"Invalid operation {self.operation}"
        if self.permission not in (ANY, DENY, ALLOW):
            return f"Invalid permissionType {self.permission}"
        return None

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type != ANY and b.resource_type != self.resource_type:
            return False
        if not self._pattern_matches(b):
            return False
        if self.principal is not None and b.principal != self.principal:
            return False
        if self.host is not None and b.host != self.host:
            return False
        if self.operation != ANY and b.operation != self.operation:
            return False
        return self.permission == ANY or b.permission == self.permission

    def _pattern_matches(self, b: AclBinding) -> bool:
        name, kind = self.resource_name, self.pattern_type
        if kind in (LITERAL, PREFIXED):
            return b.pattern_type == kind and (name is None or b.resource_name == name)
        if name is None:
            return True  # ANY, and MATCH without a name
        if kind == ANY:
            return b.resource_name == name
        # MATCH: every binding that would apply to the resource called ``name``.
        if b.pattern_type == LITERAL:
            return b.resource_name in (name, WILDCARD)
        return name.startswith(b.resource_name)


class AclRules:
    """An immutable view of the bindings, indexed by resource type, with the authorization
    rule. Build a new one when the bindings change."""

    def __init__(self, bindings: Iterable[AclBinding], super_users: Iterable[str] = (),
                 allow_if_no_acl: bool = False) -> None:
        self.bindings = tuple(bindings)
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_if_no_acl
        self._literal: dict[tuple[int, str], list[AclBinding]] = {}
        self._prefixed: dict[int, list[AclBinding]] = {}
        for b in self.bindings:
            if b.pattern_type == LITERAL:
                self._literal.setdefault((b.resource_type, b.resource_name), []).append(b)
            else:
                self._prefixed.setdefault(b.resource_type, []).append(b)

    def _applying(self, resource_type: int, name: str) -> list[AclBinding]:
        """Bindings whose resource pattern covers ``name`` (for any principal)."""
        out = list(self._literal.get((resource_type, name), ()))
        if name != WILDCARD:
            out += self._literal.get((resource_type, WILDCARD), ())
        out += [b for b in self._prefixed.get(resource_type, ()) if name.startswith(b.resource_name)]
        return out

    def authorize(self, principal: str, host: str, operation: int, resource_type: int,
                  name: str) -> bool:
        if principal in self.super_users:
            return True
        applying = self._applying(resource_type, name)
        allowed = False
        for b in applying:
            verdict = _verdict(b, principal, host, operation)
            if verdict == DENY:
                return False
            if verdict == ALLOW:
                allowed = True
        if allowed:
            return True
        return not applying and self.allow_if_no_acl

    def authorize_by_type(self, principal: str, host: str, operation: int,
                          resource_type: int) -> bool:
        """May ``principal`` do ``operation`` on at least one resource of the type? Kafka's
        rule: yes for a super user or by the no-ACL default of an unnamed resource; else yes
        if some ALLOW pattern for it (literal or prefix) is not covered by a DENY (a literal
        ``*`` DENY covers all, a literal DENY its own name, a prefix DENY everything under it)."""
        if self.authorize(principal, host, operation, resource_type, "\x00"):
            return True
        deny_literal: set[str] = set()
        deny_prefixed: set[str] = set()
        allows: list[AclBinding] = []
        for b in self.bindings:
            if b.resource_type != resource_type or b.host not in (WILDCARD, host):
                continue
            if b.principal not in (principal, WILDCARD_PRINCIPAL):
                continue
            if b.operation not in (operation, ALL):
                continue
            if b.permission == DENY:
                if b.pattern_type == LITERAL and b.resource_name == WILDCARD:
                    return False
                (deny_literal if b.pattern_type == LITERAL else deny_prefixed).add(
                    b.resource_name)
            else:
                allows.append(b)
        for b in allows:
            if b.pattern_type == LITERAL and b.resource_name == WILDCARD:
                return True
        for b in allows:
            if b.pattern_type == LITERAL and b.resource_name in deny_literal:
                continue
            name = b.resource_name
            if not any(name[:i] in deny_prefixed for i in range(1, len(name) + 1)):
                return True
        return False

    def operations(self, principal: str, host: str, resource_type: int, name: str) -> int:
        """The authorized-operations bit set (bit = AclOperation code) for one resource."""
        bits = 0
        for op in SUPPORTED_OPERATIONS.get(resource_type, ()):
            if self.authorize(principal, host, op, resource_type, name):
                bits |= 1 << op
        return bits


def _verdict(b: AclBinding, principal: str, host: str, operation: int) -> int | None:
    """DENY or ALLOW if binding ``b`` (whose pattern already matched) decides, else None."""
    if b.principal != principal and b.principal != WILDCARD_PRINCIPAL:
        return None
    if b.host != WILDCARD and b.host != host:
        return None
    if b.operation != ALL and b.operation != operation:
        if b.permission != ALLOW:
            return None
        if operation == DESCRIBE and b.operation in _IMPLIES_DESCRIBE:
            return ALLOW
        if operation == DESCRIBE_CONFIGS and b.operation in _IMPLIES_DESCRIBE_CONFIGS:
            return ALLOW
        return None
    return b.permission
