"""CreateAcls, DescribeAcls and DeleteAcls with the authorizer on, through real AdminClients
(confluent-kafka, kafka-python): bindings are stored, selected by filters as Kafka selects them,
removed, kept across a restart; only principals with ALTER (change) or DESCRIBE (read) on the
cluster may use them; invalid bindings get INVALID_REQUEST; principals come from SASL or from a
TLS client certificate."""
from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AclBindingFilter
from kio.schema.create_acls.v3.request import AclCreation, CreateAclsRequest
from kio.schema.describe_acls.v3.request import DescribeAclsRequest
from kio.schema.errors import ErrorCode

from acl_support import (  # noqa: F401 -- acl_broker is a fixture
    CLUSTER, WAIT, AclOperation, AclPermissionType, ResourcePatternType, ResourceType, acl_broker,
    admin_client, allow, deny, grant, revoke_all, start_acl_broker,
)
from conftest import HOST, BrokerProcess, make_self_signed, start_broker
from rawkafka import RawClient

EVERY = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                         AclOperation.ANY, AclPermissionType.ANY)


def described(b: BrokerProcess, selector: AclBindingFilter = EVERY, user: str = "admin") -> set:
    admin = admin_client(b, user)
    return set(admin.describe_acls(selector).result(WAIT))


def test_created_acls_are_described_and_filters_select_as_kafka(acl_broker):
    revoke_all(acl_broker)
    orders = allow(ResourceType.TOPIC, "orders", "User:alice", AclOperation.READ)
    prefix = allow(ResourceType.TOPIC, "ord", "User:bob", AclOperation.WRITE,
                   ResourcePatternType.PREFIXED)
    wildcard = deny(ResourceType.TOPIC, "*", "User:bob", AclOperation.DELETE)
    group = allow(ResourceType.GROUP, "g1", "User:alice", AclOperation.READ, host="10.1.1.1")
    grant(acl_broker, orders, prefix, wildcard, group)
    grant(acl_broker, orders)  # a binding created twice is stored once
    assert described(acl_broker) == {orders, prefix, wildcard, group}
    match = AclBindingFilter(ResourceType.TOPIC, "orders", ResourcePatternType.MATCH, None, None,
                             AclOperation.ANY, AclPermissionType.ANY)
    assert described(acl_broker, match) == {orders, prefix, wildcard}
    by_bob = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:bob", None,
                              AclOperation.ANY, AclPermissionType.DENY)
    assert described(acl_broker, by_bob) == {wildcard}
    by_host = AclBindingFilter(ResourceType.GROUP, None, ResourcePatternType.LITERAL, None,
                               "10.1.1.1", AclOperation.READ, AclPermissionType.ALLOW)
    assert described(acl_broker, by_host) == {group}


def test_delete_acls_removes_what_each_filter_selects_and_returns_it(acl_broker):
    revoke_all(acl_broker)
    a = allow(ResourceType.TOPIC, "del-a", "User:alice", AclOperation.READ)
    b = allow(ResourceType.TOPIC, "del-b", "User:alice", AclOperation.WRITE)
    c = allow(ResourceType.GROUP, "del-g", "User:bob", AclOperation.READ)
    grant(acl_broker, a, b, c)
    only_a = AclBindingFilter(ResourceType.TOPIC, "del-a", ResourcePatternType.LITERAL, None,
                              None, AclOperation.ANY, AclPermissionType.ANY)
    groups = AclBindingFilter(ResourceType.GROUP, None, ResourcePatternType.ANY, None, None,
                              AclOperation.ANY, AclPermissionType.ANY)
    admin = admin_client(acl_broker)
    results = admin.delete_acls([only_a, groups])
    assert results[only_a].result(WAIT) == [a]
    assert results[groups].result(WAIT) == [c]
    assert described(acl_broker) == {b}
    nothing = AclBindingFilter(ResourceType.TOPIC, "none", ResourcePatternType.ANY, None, None,
                               AclOperation.ANY, AclPermissionType.ANY)
    assert admin.delete_acls([nothing])[nothing].result(WAIT) == []


def test_only_alter_on_the_cluster_may_change_acls(acl_broker):
    revoke_all(acl_broker)
    wanted = allow(ResourceType.TOPIC, "mine", "User:alice", AclOperation.ALL)
    alice = admin_client(acl_broker, "alice")
    with pytest.raises(KafkaException) as info:
        alice.create_acls([wanted])[wanted].result(WAIT)
    assert info.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException) as info:
        alice.delete_acls([EVERY])[EVERY].result(WAIT)
    assert info.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert described(acl_broker) == set()
    grant(acl_broker, allow(CLUSTER, "kafka-cluster", "User:alice",
                            AclOperation.ALTER))
    alice.create_acls([wanted])[wanted].result(WAIT)
    # ALTER implies DESCRIBE: alice may now read the bindings too.
    assert wanted in described(acl_broker, user="alice")


def test_describe_acls_without_describe_on_the_cluster_is_refused(acl_broker):
    """librdkafka drops DescribeAcls' top-level error; kafka-python and the raw answer show it."""
    from kafka.admin import (
        ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType, KafkaAdminClient,
        ResourcePatternFilter, ResourceType as KResourceType,
    )
    from kafka.errors import ClusterAuthorizationFailedError

    revoke_all(acl_broker)
    k = KafkaAdminClient(bootstrap_servers=f"{HOST}:{acl_broker.kafka_port}",
                         security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                         sasl_plain_username="bob", sasl_plain_password="bob-secret")
    selector = ACLFilter(principal=None, host=None, operation=ACLOperation.ANY,
                         permission_type=ACLPermissionType.ANY,
                         resource_pattern=ResourcePatternFilter(KResourceType.ANY, None,
                                                                ACLResourcePatternType.ANY))
    try:
        with pytest.raises(ClusterAuthorizationFailedError):
            k.describe_acls(selector)
        grant(acl_broker, allow(CLUSTER, "kafka-cluster", "User:bob",
                                AclOperation.DESCRIBE))
        acls, error = k.describe_acls(selector)
        assert error.errno == 0 and len(acls) == 1 and acls[0].principal == "User:bob"
    finally:
        k.close()


def raw_admin(b: BrokerProcess) -> RawClient:
    client = RawClient(b.kafka_port)
    client.authenticate("PLAIN", "admin", "admin-secret")
    return client


@pytest.mark.parametrize("creation,why", [
    (dict(resource_type=1, resource_name="t", resource_pattern_type=3), "resourceType"),
    (dict(resource_type=2, resource_name="t", resource_pattern_type=2), "patternType"),
    (dict(resource_type=2, resource_name="", resource_pattern_type=3), "empty"),
    (dict(resource_type=4, resource_name="other", resource_pattern_type=3), "kafka-cluster"),
    (dict(resource_type=2, resource_name="t", resource_pattern_type=3, principal="alice"),
     "principal"),
    (dict(resource_type=2, resource_name="t", resource_pattern_type=3, operation=1), "operation"),
])
def test_invalid_bindings_get_invalid_request_alone(acl_broker, creation, why):
    revoke_all(acl_broker)
    fields = dict(principal="User:alice", host="*", operation=3, permission_type=3)
    fields.update(creation)
    good = AclCreation(resource_type=2, resource_name="fine", resource_pattern_type=3,
                       principal="User:alice", host="*", operation=3, permission_type=3)
    with raw_admin(acl_broker) as client:
        response = client.call(CreateAclsRequest(creations=(AclCreation(**fields), good)))
        bad, ok = response.results
        assert bad.error_code == ErrorCode.invalid_request and why in bad.error_message
        assert ok.error_code == ErrorCode.none
        listing = client.call(DescribeAclsRequest(
            resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
            principal_filter=None, host_filter=None, operation=1, permission_type=1))
    assert [r.resource_name for r in listing.resources] == ["fine"]


def test_an_invalid_filter_gets_invalid_request(acl_broker):
    with raw_admin(acl_broker) as client:
        response = client.call(DescribeAclsRequest(
            resource_type_filter=0, resource_name_filter=None, pattern_type_filter=1,
            principal_filter=None, host_filter=None, operation=1, permission_type=1))
    assert response.error_code == ErrorCode.invalid_request


def test_acls_survive_a_restart(tmp_path):
    b = start_acl_broker(tmp_path)
    kept = allow(ResourceType.TOPIC, "kept", "User:alice", AclOperation.WRITE,
                 ResourcePatternType.PREFIXED)
    try:
        grant(b, kept)
    finally:
        b.stop()
    b = start_broker(tmp_path, env=b.env)
    try:
        assert described(b) == {kept}
    finally:
        b.stop()


def test_without_the_authorizer_the_acl_settings_are_refused_nowhere_but_apis_are_disabled(
        tmp_path):
    """ACL settings without CONNECTORS_KAFKA_ACL_ENABLE change nothing: SECURITY_DISABLED."""
    b = start_broker(tmp_path, env={"CONNECTORS_KAFKA_SUPER_USERS": "User:admin"})
    try:
        admin = admin_client_plain(b)
        wanted = allow(ResourceType.TOPIC, "t", "User:alice", AclOperation.READ)
        with pytest.raises(KafkaException) as info:
            admin.create_acls([wanted])[wanted].result(WAIT)
        assert info.value.args[0].code() == KafkaError.SECURITY_DISABLED
    finally:
        b.stop()


def admin_client_plain(b: BrokerProcess):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": b.bootstrap})


def test_a_tls_client_certificate_names_the_principal(tmp_path):
    """Without SASL, a client certificate's distinguished name is the principal (Kafka's
    default SSL principal); a client without one is User:ANONYMOUS."""
    cert, key = make_self_signed(tmp_path)  # self-signed: it is its own CA too
    b = start_broker(tmp_path, env={
        "KMQKAFKA_TLS_CERT": str(cert), "KMQKAFKA_TLS_KEY": str(key),
        "KMQKAFKA_TLS_CA": str(cert), "CONNECTORS_KAFKA_ACL_ENABLE": "true",
        "CONNECTORS_KAFKA_SUPER_USERS": "User:CN=kmqkafka-test"})
    try:
        with_cert = {"bootstrap.servers": f"{HOST}:{b.tls_port}", "security.protocol": "SSL",
                     "ssl.ca.location": str(cert), "ssl.certificate.location": str(cert),
                     "ssl.key.location": str(key)}
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(with_cert)
        wanted = allow(ResourceType.TOPIC, "*", "User:ANONYMOUS", AclOperation.DESCRIBE)
        admin.create_acls([wanted])[wanted].result(WAIT)  # only a super user may
        anonymous = AdminClient({"bootstrap.servers": f"{HOST}:{b.tls_port}",
                                 "security.protocol": "SSL", "ssl.ca.location": str(cert)})
        with pytest.raises(KafkaException) as info:
            anonymous.create_acls([wanted])[wanted].result(WAIT)
        assert info.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
        assert described_plain(admin) == {wanted}
    finally:
        b.stop()


def described_plain(admin) -> set:
    return set(admin.describe_acls(EVERY).result(WAIT))


@pytest.mark.parametrize("value", ["alice", "User:", "User:admin;:bob"])
def test_bad_super_users_stop_start_up_with_one_line(tmp_path, value):
    b = start_broker(tmp_path, env={"CONNECTORS_KAFKA_SUPER_USERS": value}, wait=False)
    assert b.proc.wait(30) != 0
    lines = [line for line in b.log().splitlines() if "invalid setting" in line]
    assert len(lines) == 1 and "CONNECTORS_KAFKA_SUPER_USERS" in lines[0], b.log()
    assert "not a principal" in lines[0]
