"""A daemon with SASL PLAIN users and the authorizer on, and helpers to grant ACLs through a
real AdminClient, for the ACL tests of each area (test_acl_*.py).

Users: ``admin`` (a super user), ``alice`` and ``bob`` (no rights until granted); the password
of each is ``<name>-secret``. ``allow.everyone.if.no.acl.found`` is off, as in Kafka's default.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
from confluent_kafka.admin import (
    AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
    ResourcePatternType, ResourceType,
)

from conftest import HOST, BrokerProcess, start_broker

USERS = ("admin", "alice", "bob")
CLUSTER = ResourceType.BROKER  # librdkafka's name for Kafka's CLUSTER resource type (code 4)
CLUSTER_NAME = "kafka-cluster"
WAIT = 15.0

__all__ = ["CLUSTER", "CLUSTER_NAME", "AclOperation", "AclPermissionType", "ResourcePatternType", "ResourceType",
           "acl_env", "admin_client", "allow", "deny", "grant", "revoke_all", "sasl",
           "start_acl_broker"]


def acl_env(**extra: str) -> dict[str, str]:
    env = {
        "CONNECTORS_KAFKA_SASL_MECHANISMS": "PLAIN",
        "CONNECTORS_KAFKA_SASL_USERS": ",".join(f"{u}:{u}-secret" for u in USERS),
        "CONNECTORS_KAFKA_ACL_ENABLE": "true",
        "CONNECTORS_KAFKA_SUPER_USERS": "User:admin",
        "CONNECTORS_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
    }
    env.update(extra)
    return env


def start_acl_broker(tmp: Path, **extra: str) -> BrokerProcess:
    return start_broker(tmp, env=acl_env(**extra))


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = start_acl_broker(tmp_path_factory.mktemp("acl"))
    try:
        yield b
    finally:
        b.stop()


def sasl(b: BrokerProcess, user: str) -> dict[str, Any]:
    """confluent-kafka settings that authenticate as ``user`` by PLAIN."""
    return {"bootstrap.servers": f"{HOST}:{b.kafka_port}", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN", "sasl.username": user,
            "sasl.password": f"{user}-secret"}


def admin_client(b: BrokerProcess, user: str = "admin") -> AdminClient:
    return AdminClient(sasl(b, user))


def allow(resource_type: ResourceType, name: str, principal: str, operation: AclOperation,
          pattern: ResourcePatternType = ResourcePatternType.LITERAL,
          host: str = "*") -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, host, operation,
                      AclPermissionType.ALLOW)


def deny(resource_type: ResourceType, name: str, principal: str, operation: AclOperation,
         pattern: ResourcePatternType = ResourcePatternType.LITERAL,
         host: str = "*") -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, host, operation,
                      AclPermissionType.DENY)


def grant(b: BrokerProcess, *bindings: AclBinding) -> None:
    """Create ``bindings`` as the super user; raises if any is refused."""
    admin = admin_client(b)  # kept: the futures fail once their client is gone
    for f in admin.create_acls(list(bindings)).values():
        f.result(WAIT)


def revoke_all(b: BrokerProcess) -> None:
    """Delete every binding, as the super user."""
    match_all = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                 AclOperation.ANY, AclPermissionType.ANY)
    admin = admin_client(b)
    admin.delete_acls([match_all])[match_all].result(WAIT)
