"""ACLs on a 3-node cluster: a binding created through one node authorizes requests at every
node, and a group call a follower relays to the leader is authorized there as the client who
sent it, not as the node that relayed it (which authenticates as the first configured user)."""
from __future__ import annotations

import time
from typing import Iterator

import pytest

from tests.raft.test_kafka_cluster import Cluster, commit_and_fetch

confluent_kafka = pytest.importorskip("confluent_kafka")

from confluent_kafka.admin import (  # noqa: E402
    AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient, NewTopic,
    ResourcePatternType, ResourceType,
)
from kio.schema.errors import ErrorCode as E  # noqa: E402

# The first user is the one nodes relay as; it is no super user, so a relayed call that were
# authorized as the relaying node would be refused, and one authorized as the node's user
# instead of the client's would pass where the client may not.
USERS = "relay:relay-secret,admin:admin-secret,carol:carol-secret"
EVERY = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                         AclOperation.ANY, AclPermissionType.ANY)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("acl-cluster"), env={
        "CONNECTORS_KAFKA_SASL_MECHANISMS": "PLAIN",
        "CONNECTORS_KAFKA_SASL_USERS": USERS,
        "CONNECTORS_KAFKA_ACL_ENABLE": "true",
        "CONNECTORS_KAFKA_SUPER_USERS": "User:admin",
        "CONNECTORS_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0"})
    try:
        c.leader()
        yield c
    finally:
        c.stop()


def admin(cluster: Cluster, node: int) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap(node),
                        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
                        "sasl.username": "admin", "sasl.password": "admin-secret"})


def commit_as_carol(cluster: Cluster, node: int, group: str, topic: str) -> tuple[int, int]:
    """OffsetCommit then OffsetFetch as carol on ``node``: the two partition error codes."""
    committed, fetched = commit_and_fetch(cluster.kafka_ports[node], "PLAIN", "carol",
                                          "carol-secret", group, topic, 3)
    return (committed.topics[0].partitions[0].error_code,
            fetched.error_code or fetched.topics[0].partitions[0].error_code)


def test_relayed_group_calls_are_authorized_as_the_client(cluster: Cluster):
    leader, follower = cluster.leader(), cluster.follower()
    creator = admin(cluster, leader)  # kept: its futures fail once the client is gone
    creator.create_topics([NewTopic("acl-ct", 1)])["acl-ct"].result(30)
    assert commit_as_carol(cluster, follower, "acl-g", "acl-ct") == (
        E.group_authorization_failed, E.group_authorization_failed)
    grants = [AclBinding(ResourceType.GROUP, "acl-", ResourcePatternType.PREFIXED, "User:carol",
                         "*", AclOperation.READ, AclPermissionType.ALLOW),
              AclBinding(ResourceType.TOPIC, "acl-ct", ResourcePatternType.LITERAL, "User:carol",
                         "*", AclOperation.READ, AclPermissionType.ALLOW)]
    a = admin(cluster, follower)  # created through a follower, applied everywhere
    for f in a.create_acls(grants).values():
        f.result(30)
    deadline = time.monotonic() + 20
    while True:
        codes = commit_as_carol(cluster, follower, "acl-g", "acl-ct")
        if codes == (E.none, E.none) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert codes == (E.none, E.none)
    assert commit_as_carol(cluster, leader, "acl-g", "acl-ct") == (E.none, E.none)


def test_bindings_created_on_one_node_are_described_by_every_node(cluster: Cluster):
    binding = AclBinding(ResourceType.TOPIC, "everywhere", ResourcePatternType.LITERAL,
                         "User:carol", "*", AclOperation.WRITE, AclPermissionType.DENY)
    a = admin(cluster, cluster.follower())
    a.create_acls([binding])[binding].result(30)
    for node in cluster.live():
        deadline = time.monotonic() + 20
        other = admin(cluster, node)
        while binding not in other.describe_acls(EVERY).result(30):
            assert time.monotonic() < deadline, f"node {node} never applied the binding"
            time.sleep(0.2)
