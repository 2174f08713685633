"""Client quota entities, filters and precedence (``kafka.client_quotas``), pure logic over an
in-memory config family."""
from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode as E

from kmqkafka.kafka.client_quotas import (
    CLIENT_ID, CONSUMER_BYTE_RATE, MATCH_DEFAULT, MATCH_EXACT, MATCH_SPECIFIED,
    PRODUCER_BYTE_RATE, USER, QuotaError, StoredQuotas, matching, validate_entity, validate_ops,
)
from kmqkafka.kafka.quotas import ByteRateQuota
from kmqkafka.kafka.topics import CONFIG_FAMILY

from tests.coordinators.fakes import KeyedStore


class Store(KeyedStore):
    """The fake keyed store with ``keyed_state`` (what ``StoredQuotas`` caches by)."""

    def keyed_state(self, family: str) -> tuple[object, int]:
        return self, self.puts


def refused(call, *args) -> tuple[E, str]:
    with pytest.raises(QuotaError) as info:
        call(*args)
    return info.value.code, info.value.message


def test_entities_are_validated_as_kafka_validates_them() -> None:
    assert validate_entity([(USER, "alice"), (CLIENT_ID, None)]) == (
        (CLIENT_ID, None), (USER, "alice"))
    assert refused(validate_entity, []) == (E.invalid_request,
                                            "Invalid empty client quota entity")
    assert refused(validate_entity, [(USER, "a"), (USER, "b")])[1] == (
        "Invalid client quota entity, duplicate entity entry user")
    assert refused(validate_entity, [("group", "g")])[1] == (
        "Unhandled client quota entity type: group")
    assert refused(validate_entity, [(USER, "")])[1] == "Empty user not supported"
    assert "IP entity should not be combined" in refused(
        validate_entity, [("ip", "1.2.3.4"), (USER, "a")])[1]
    assert "not enforced" in refused(validate_entity, [("ip", "1.2.3.4")])[1]


def test_operations_are_validated_as_kafka_validates_them() -> None:
    entity = ((USER, "alice"),)
    assert validate_ops([(PRODUCER_BYTE_RATE, 1024.0, False), (CONSUMER_BYTE_RATE, 0, True)],
                        entity) == {PRODUCER_BYTE_RATE: 1024.0, CONSUMER_BYTE_RATE: None}
    assert refused(validate_ops, [("bogus", 1.0, False)], entity)[1] == (
        "Invalid configuration key bogus")
    assert refused(validate_ops, [(PRODUCER_BYTE_RATE, 1.5, False)], entity)[1] == (
        "Configuration producer_byte_rate must be a Long value")
    assert refused(validate_ops, [(PRODUCER_BYTE_RATE, 1.0, False),
                                  (PRODUCER_BYTE_RATE, 2.0, False)], entity)[1].startswith(
        "Duplicate quota key producer_byte_rate")
    assert "not enforced" in refused(validate_ops, [("request_percentage", 50.0, False)],
                                     entity)[1]
    assert refused(validate_ops, [(PRODUCER_BYTE_RATE, 0.0, False)], entity)[0] is (
        E.invalid_request)


def test_filters_select_entities_as_kafka_does() -> None:
    alice = ((USER, "alice"),)
    default_user = ((USER, None),)
    alice_app = ((CLIENT_ID, "app"), (USER, "alice"))
    app = ((CLIENT_ID, "app"),)
    every = [alice, default_user, alice_app, app]
    assert matching(every, [(USER, MATCH_EXACT, "alice")], False) == [alice, alice_app]
    assert matching(every, [(USER, MATCH_EXACT, "alice")], True) == [alice]
    assert matching(every, [(USER, MATCH_DEFAULT, None)], False) == [default_user]
    assert matching(every, [(USER, MATCH_SPECIFIED, None)], True) == [alice, default_user]
    assert matching(every, [], False) == every
    assert matching(every, [], True) == []
    assert refused(matching, every, [(USER, MATCH_EXACT, None)], False)[1].startswith(
        "Request specified MATCH_TYPE_EXACT")
    assert refused(matching, every, [(USER, 0, "a"), (USER, 0, "b")], False)[1] == (
        "Entity type user cannot appear more than once in the filter.")
    assert refused(matching, every, [("group", 0, "g")], False)[0] is E.unsupported_version


def test_the_most_specific_entity_that_sets_the_key_holds_the_client() -> None:
    store = Store()
    stored = StoredQuotas(store)
    assert stored.limit(PRODUCER_BYTE_RATE, "alice", "app") is None
    stored.alter([(((CLIENT_ID, None),), {PRODUCER_BYTE_RATE: 100.0})])
    assert stored.limit(PRODUCER_BYTE_RATE, "alice", "app") == (("", "app"), 100.0)
    stored.alter([(((USER, None),), {PRODUCER_BYTE_RATE: 200.0})])
    assert stored.limit(PRODUCER_BYTE_RATE, "bob", "app") == (("bob", ""), 200.0)
    stored.alter([(((CLIENT_ID, "app"), (USER, "alice")), {PRODUCER_BYTE_RATE: 300.0})])
    assert stored.limit(PRODUCER_BYTE_RATE, "alice", "app") == (("alice", "app"), 300.0)
    assert stored.limit(PRODUCER_BYTE_RATE, "alice", "other") == (("alice", ""), 200.0)
    assert stored.limit(CONSUMER_BYTE_RATE, "alice", "app") is None
    # Removing the last key removes the entity.
    stored.alter([(((USER, None),), {PRODUCER_BYTE_RATE: None})])
    assert ((USER, None),) not in stored.entities()
    assert len(store.families[CONFIG_FAMILY]) == 2


def test_clients_under_one_user_quota_share_its_budget() -> None:
    stored = StoredQuotas(Store())
    stored.alter([(((USER, "alice"),), {PRODUCER_BYTE_RATE: 1000.0})])
    q = ByteRateQuota(0, stored, PRODUCER_BYTE_RATE)
    assert q.enabled
    assert q.record("one", 1000, 0.0, "User:alice") == 0.0
    assert q.record("two", 500, 0.0, "User:alice") == pytest.approx(0.5)
    assert q.record("two", 500, 0.0, "User:bob") == 0.0  # no quota for bob
    # A changed rate starts its budget afresh.
    stored.alter([(((USER, "alice"),), {PRODUCER_BYTE_RATE: 2000.0})])
    assert q.record("one", 2000, 1.0, "User:alice") == 0.0
