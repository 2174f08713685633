"""Kafka's authorization rule (StandardAuthorizer) on the pure model: patterns, principals,
hosts, DENY over ALLOW, implied DESCRIBE, the no-ACL default, super users, authorizeByResourceType,
and the filters DescribeAcls/DeleteAcls select with."""
from __future__ import annotations

import pytest

from kmqkafka.kafka.authorizer import (
    ALL, ALLOW, ALTER, ALTER_CONFIGS, ANY, CLUSTER, CREATE, DELETE, DENY, DESCRIBE,
    DESCRIBE_CONFIGS, GROUP, IDEMPOTENT_WRITE, LITERAL, MATCH, PREFIXED, READ, TOPIC,
    TRANSACTIONAL_ID, WRITE, AclBinding, AclFilter, AclRules,
)
from kmqkafka.kafka.authz import host_of

ALICE, BOB = "User:alice", "User:bob"
HOST = "10.0.0.1"


def acl(name: str, op: int, permission: int = ALLOW, principal: str = ALICE,
        pattern: int = LITERAL, rtype: int = TOPIC, host: str = "*") -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, host, op, permission)


def may(rules: AclRules, op: int, name: str, principal: str = ALICE, rtype: int = TOPIC,
        host: str = HOST) -> bool:
    return rules.authorize(principal, host, op, rtype, name)


def test_a_literal_allow_grants_that_topic_only():
    rules = AclRules([acl("orders", READ)])
    assert may(rules, READ, "orders")
    assert not may(rules, READ, "orders2")
    assert not may(rules, WRITE, "orders")
    assert not may(rules, READ, "orders", principal=BOB)


def test_prefixed_and_wildcard_patterns():
    rules = AclRules([acl("pay.", WRITE, pattern=PREFIXED), acl("*", DESCRIBE, principal=BOB)])
    assert may(rules, WRITE, "pay.in") and may(rules, WRITE, "pay.")
    assert not may(rules, WRITE, "pay") and not may(rules, WRITE, "x.pay.in")
    assert may(rules, DESCRIBE, "anything", principal=BOB)
    # Only a LITERAL "*" is the wildcard: a PREFIXED "*" covers names starting with "*".
    assert not may(AclRules([acl("*", READ, pattern=PREFIXED)]), READ, "orders")


def test_deny_wins_over_allow_from_any_pattern():
    rules = AclRules([acl("*", READ), acl("secret.", READ, DENY, pattern=PREFIXED)])
    assert may(rules, READ, "public")
    assert not may(rules, READ, "secret.keys")


def test_the_wildcard_principal_and_host_match_everyone():
    rules = AclRules([acl("t", READ, principal="User:*"), acl("t", WRITE, host="10.0.0.9")])
    assert may(rules, READ, "t", principal=BOB)
    assert not may(rules, WRITE, "t")
    assert may(rules, WRITE, "t", host="10.0.0.9")


@pytest.mark.parametrize("granted", [READ, WRITE, DELETE, ALTER, DESCRIBE])
def test_read_write_delete_alter_allow_describe(granted):
    assert may(AclRules([acl("t", granted)]), DESCRIBE, "t")


def test_alter_configs_allows_describe_configs_but_deny_never_implies():
    assert may(AclRules([acl("t", ALTER_CONFIGS)]), DESCRIBE_CONFIGS, "t")
    assert not may(AclRules([acl("t", DESCRIBE_CONFIGS)]), ALTER_CONFIGS, "t")
    # A DENY of READ does not deny DESCRIBE that an ALLOW of WRITE implies.
    rules = AclRules([acl("t", WRITE), acl("t", READ, DENY)])
    assert may(rules, DESCRIBE, "t") and not may(rules, READ, "t")


def test_all_covers_every_operation_both_ways():
    assert may(AclRules([acl("t", ALL)]), ALTER_CONFIGS, "t")
    assert not may(AclRules([acl("t", ALL), acl("t", ALL, DENY)]), READ, "t")
    assert not may(AclRules([acl("t", READ), acl("t", ALL, DENY)]), READ, "t")


def test_no_acl_default_applies_only_where_no_binding_names_the_resource():
    open_rules = AclRules([acl("guarded", READ, principal=BOB)], allow_if_no_acl=True)
    assert may(open_rules, WRITE, "free")  # nothing names "free"
    # "guarded" has a binding (for bob), so alice is denied even with the default open.
    assert not may(open_rules, READ, "guarded")
    closed = AclRules([], allow_if_no_acl=False)
    assert not may(closed, READ, "free")


def test_super_users_pass_every_check_even_a_deny():
    rules = AclRules([acl("t", ALL, DENY, principal="User:admin")], super_users=["User:admin"])
    assert may(rules, DELETE, "t", principal="User:admin")
    assert may(rules, CREATE, "kafka-cluster", principal="User:admin", rtype=CLUSTER)


def test_resource_types_are_separate():
    rules = AclRules([acl("x", READ)])
    assert not may(rules, READ, "x", rtype=GROUP)


def test_operations_bits_for_a_reader():
    rules = AclRules([acl("t", READ)])
    assert rules.operations(ALICE, HOST, TOPIC, "t") == (1 << READ) | (1 << DESCRIBE)
    assert rules.operations(BOB, HOST, TOPIC, "t") == 0


def test_authorize_by_type_as_kafka_does_for_idempotent_producers():
    def by_type(*bindings, **kw):
        return AclRules(bindings, **kw).authorize_by_type(ALICE, HOST, WRITE, TOPIC)

    assert by_type(acl("orders", WRITE))
    assert by_type(acl("pay.", WRITE, pattern=PREFIXED))
    assert not by_type(acl("orders", READ))
    assert not by_type(acl("orders", WRITE), acl("orders", WRITE, DENY))
    # A prefix DENY covers a literal ALLOW below it, and a shorter prefix ALLOW it does not.
    assert not by_type(acl("pay.in", WRITE), acl("pay", WRITE, DENY, pattern=PREFIXED))
    assert by_type(acl("p", WRITE, pattern=PREFIXED), acl("pay", WRITE, DENY, pattern=PREFIXED))
    assert not by_type(acl("*", WRITE), acl("*", WRITE, DENY))
    assert by_type(super_users=[ALICE])
    assert by_type(allow_if_no_acl=True)
    assert not by_type()


def test_filters_select_as_describe_and_delete_do():
    literal, prefixed, wild = acl("orders", READ), acl("ord", WRITE, pattern=PREFIXED), acl("*", READ)
    group = acl("g", READ, rtype=GROUP)
    every = AclFilter(ANY, None, ANY, None, None, ANY, ANY)
    assert all(every.matches(b) for b in (literal, prefixed, wild, group))
    match = AclFilter(TOPIC, "orders", MATCH, None, None, ANY, ANY)
    assert [b for b in (literal, prefixed, wild, group) if match.matches(b)] == [
        literal, prefixed, wild]
    exact = AclFilter(TOPIC, "orders", ANY, None, None, ANY, ANY)
    assert exact.matches(literal) and not exact.matches(prefixed) and not exact.matches(wild)
    only_prefixed = AclFilter(ANY, None, PREFIXED, None, None, WRITE, ALLOW)
    assert [b for b in (literal, prefixed) if only_prefixed.matches(b)] == [prefixed]
    by_principal = AclFilter(ANY, None, ANY, BOB, None, ANY, ANY)
    assert not by_principal.matches(literal)


@pytest.mark.parametrize("binding,why", [
    (AclBinding(ANY, "t", LITERAL, ALICE, "*", READ, ALLOW), "resourceType"),
    (AclBinding(TOPIC, "t", MATCH, ALICE, "*", READ, ALLOW), "patternType"),
    (AclBinding(TOPIC, "t", LITERAL, ALICE, "*", ANY, ALLOW), "operation"),
    (AclBinding(TOPIC, "t", LITERAL, ALICE, "*", READ, ANY), "permissionType"),
    (AclBinding(TOPIC, "", LITERAL, ALICE, "*", READ, ALLOW), "empty"),
    (AclBinding(CLUSTER, "c", LITERAL, ALICE, "*", IDEMPOTENT_WRITE, ALLOW), "kafka-cluster"),
    (AclBinding(TOPIC, "t", LITERAL, "alice", "*", READ, ALLOW), "principal"),
])
def test_bindings_kafka_refuses_to_create(binding, why):
    problem = binding.problem()
    assert problem is not None and why in problem


def test_a_valid_binding_has_no_problem():
    assert AclBinding(TRANSACTIONAL_ID, "tx", PREFIXED, "User:*", "*", WRITE, DENY).problem() is None
    assert AclBinding(CLUSTER, "kafka-cluster", LITERAL, ALICE, "*", ALL, ALLOW).problem() is None


def test_host_of_peer_texts():
    assert host_of("10.0.0.1:5555") == "10.0.0.1"
    assert host_of("[::1]:5555") == "::1"
    assert host_of("::1:5555") == "::1"
