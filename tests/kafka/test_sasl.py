"""SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) on both Kafka listeners, with real clients:
confluent-kafka, kafka-python, aiokafka and kcat authenticate and then produce and consume;
wrong passwords, unknown users and unauthenticated requests are refused, and the daemon keeps
serving everyone else."""

import asyncio
import shutil
import socket
import struct
import subprocess
import time
import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from conftest import (
    HOST, BrokerProcess, auth_errors, authenticates, kafka_python_round_trip,
    make_self_signed, round_trip, start_broker,
)
from rawkafka import RawClient

USERS = "alice:alice-secret,bob:b0b:with:colons"
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory) -> BrokerProcess:
    tmp = tmp_path_factory.mktemp("sasl")
    cert, key = make_self_signed(tmp)
    b = start_broker(tmp, env={
        "CONNECTORS_KAFKA_SASL_MECHANISMS": ",".join(MECHANISMS),
        "CONNECTORS_KAFKA_SASL_USERS": USERS,
        "KMQKAFKA_TLS_CERT": str(cert), "KMQKAFKA_TLS_KEY": str(key),
        "CONNECTORS_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0"})
    b.cert = cert  # type: ignore[attr-defined]
    try:
        yield b
    finally:
        b.stop()


def settings(b: BrokerProcess, mechanism: str, user: str = "alice",
             password: str = "alice-secret", tls: bool = False) -> dict:
    out = {"bootstrap.servers": f"{HOST}:{b.tls_port if tls else b.kafka_port}",
           "security.protocol": "SASL_SSL" if tls else "SASL_PLAINTEXT",
           "sasl.mechanisms": mechanism, "sasl.username": user, "sasl.password": password}
    if tls:
        out["ssl.ca.location"] = str(b.cert)
    return out


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("tls", [False, True], ids=["sasl_plaintext", "sasl_ssl"])
def test_confluent_kafka_authenticates_then_produces_and_consumes(sasl_broker, mechanism, tls):
    topic = f"sasl-{mechanism.lower()}-{'ssl' if tls else 'plain'}"
    got = round_trip(settings(sasl_broker, mechanism, tls=tls), topic)
    assert got == [b"v%d" % i for i in range(20)]


def test_a_password_with_colons_and_every_user_work(sasl_broker):
    common = settings(sasl_broker, "SCRAM-SHA-256", "bob", "b0b:with:colons")
    assert round_trip(common, "sasl-bob", 3) == [b"v0", b"v1", b"v2"]


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("user,password", [("alice", "wrong"), ("mallory", "alice-secret")])
def test_wrong_credentials_fail_with_an_authentication_error(sasl_broker, mechanism, user,
                                                             password):
    errors = auth_errors(settings(sasl_broker, mechanism, user, password))
    assert errors and errors[0].code() == KafkaError._AUTHENTICATION, errors
    assert "Authentication failed" in errors[0].str()
    # The daemon goes on serving a client that knows its password.
    ok = AdminClient(settings(sasl_broker, mechanism))
    assert ok.list_topics(timeout=10).brokers


def test_a_mechanism_not_enabled_is_refused(tmp_path):
    b = start_broker(tmp_path, env={"CONNECTORS_KAFKA_SASL_MECHANISMS": "SCRAM-SHA-512",
                                    "CONNECTORS_KAFKA_SASL_USERS": USERS})
    try:
        errors = auth_errors(settings(b, "PLAIN"))
        assert errors and "SCRAM-SHA-512" in errors[0].str(), errors
        assert AdminClient(settings(b, "SCRAM-SHA-512")).list_topics(timeout=10).brokers
    finally:
        b.stop()


def _frame(api_key: int, version: int, body: bytes, correlation: int = 1) -> bytes:
    head = struct.pack(">hhih", api_key, version, correlation, 4) + b"test"
    if version >= 2 and api_key == 18:
        head += b"\x00"  # flexible header: no tagged fields
    return struct.pack(">i", len(head + body)) + head + body


def _read_frame(sock: socket.socket) -> bytes:
    size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
    return sock.recv(size, socket.MSG_WAITALL)


def closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(4) == b""
    except ConnectionResetError:
        return True


def test_requests_before_authentication_close_the_connection(sasl_broker):
    """ApiVersions is answered (and lists the SASL APIs); Metadata before SASL closes the
    connection; so does a large frame; plain clients fail while SASL clients still work."""
    with socket.create_connection((HOST, sasl_broker.kafka_port), timeout=5) as s:
        s.sendall(_frame(18, 0, b""))
        body = _read_frame(s)
        _correlation, error, count = struct.unpack_from(">ihi", body, 0)
        assert error == 0
        keys = {struct.unpack_from(">hhh", body, 10 + 6 * i)[0] for i in range(count)}
        assert {17, 36} <= keys
        s.sendall(_frame(3, 1, struct.pack(">i", -1)))  # Metadata v1, all topics
        assert closed(s)
    with socket.create_connection((HOST, sasl_broker.kafka_port), timeout=5) as s:
        s.sendall(struct.pack(">i", 10 << 20) + b"\x00" * 1024)
        assert closed(s)
    errors: list[KafkaError] = []
    plain = AdminClient({"bootstrap.servers": f"{HOST}:{sasl_broker.kafka_port}",
                         "error_cb": errors.append})
    with pytest.raises(KafkaException):
        plain.list_topics(timeout=2)
    assert AdminClient(settings(sasl_broker, "PLAIN")).list_topics(timeout=10).brokers


def test_kafka_python_authenticates_with_each_mechanism(sasl_broker, caplog):
    from kafka import KafkaProducer
    from kafka.errors import KafkaError as KPError

    for mechanism in MECHANISMS:
        topic = f"kp-sasl-{mechanism.lower()}"
        common = dict(bootstrap_servers=f"{HOST}:{sasl_broker.kafka_port}",
                      security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
                      sasl_plain_username="alice", sasl_plain_password="alice-secret")
        assert kafka_python_round_trip(common, topic, 5) == [b"v%d" % i for i in range(5)]
    caplog.set_level("ERROR", logger="kafka")
    with pytest.raises(KPError):
        KafkaProducer(bootstrap_servers=f"{HOST}:{sasl_broker.kafka_port}",
                      security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                      sasl_plain_username="alice", sasl_plain_password="nope",
                      bootstrap_timeout_ms=2000)
    assert "Authentication failed" in caplog.text


def test_aiokafka_authenticates_with_scram(sasl_broker):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    async def run() -> list[bytes]:
        common = dict(bootstrap_servers=f"{HOST}:{sasl_broker.kafka_port}",
                      security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
                      sasl_plain_username="alice", sasl_plain_password="alice-secret")
        p = AIOKafkaProducer(acks="all", **common)
        await p.start()
        try:
            for i in range(5):
                await p.send_and_wait("aio-sasl", b"a%d" % i)
        finally:
            await p.stop()
        c = AIOKafkaConsumer("aio-sasl", auto_offset_reset="earliest", **common)
        await c.start()
        got: list[bytes] = []
        try:
            while len(got) < 5:
                batch = await asyncio.wait_for(c.getmany(timeout_ms=1000), 15)
                for msgs in batch.values():
                    got.extend(m.value for m in msgs)
        finally:
            await c.stop()
        return got

    assert asyncio.run(run()) == [b"a%d" % i for i in range(5)]


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_authenticates_with_plain_and_scram(sasl_broker):
    for mechanism in ("PLAIN", "SCRAM-SHA-256"):
        topic = f"kcat-sasl-{uuid.uuid4().hex[:6]}"
        auth = ["-b", f"{HOST}:{sasl_broker.kafka_port}", "-X", "security.protocol=SASL_PLAINTEXT",
                "-X", f"sasl.mechanisms={mechanism}", "-X", "sasl.username=alice",
                "-X", "sasl.password=alice-secret"]
        subprocess.run(["kcat", *auth, "-P", "-t", topic], input=b"one\ntwo\n", check=True,
                       timeout=30)
        out = subprocess.run(["kcat", *auth, "-C", "-t", topic, "-o", "beginning", "-e", "-q"],
                             capture_output=True, check=True, timeout=30)
        assert out.stdout.split() == [b"one", b"two"]


def test_bad_sasl_settings_stop_start_up_with_one_line(tmp_path):
    for env, needle in [
        ({"CONNECTORS_KAFKA_SASL_MECHANISMS": "GSSAPI", "CONNECTORS_KAFKA_SASL_USERS": USERS},
         "CONNECTORS_KAFKA_SASL_MECHANISMS"),
        ({"CONNECTORS_KAFKA_SASL_MECHANISMS": "PLAIN"}, "CONNECTORS_KAFKA_SASL_USERS"),
        ({"CONNECTORS_KAFKA_SASL_MECHANISMS": "PLAIN",
          "CONNECTORS_KAFKA_SASL_USERS": "alice"}, "CONNECTORS_KAFKA_SASL_USERS"),
        ({"CONNECTORS_KAFKA_SASL_MECHANISMS": "OAUTHBEARER",
          "CONNECTORS_KAFKA_SASL_OAUTHBEARER_JWKS_URL": f"file://{tmp_path}/missing.json"},
         "missing.json"),
    ]:
        d = tmp_path / uuid.uuid4().hex
        d.mkdir()
        b = start_broker(d, env=env, wait=False)
        assert b.proc.wait(30) != 0
        lines = [line for line in b.log().splitlines() if "invalid setting" in line]
        assert len(lines) == 1 and needle in lines[0], b.log()
        assert "alice-secret" not in b.log()


def _string(text: str) -> bytes:
    return struct.pack(">h", len(text)) + text.encode()


@pytest.mark.parametrize("password,accepted", [("alice-secret", True), ("wrong", False)])
def test_v0_handshake_then_bare_tokens(sasl_broker, password, accepted):
    """SaslHandshake v0 (clients older than SaslAuthenticate): the token travels bare."""
    with socket.create_connection((HOST, sasl_broker.kafka_port), timeout=5) as s:
        s.sendall(_frame(17, 0, _string("PLAIN"), correlation=7))
        body = _read_frame(s)
        correlation, error = struct.unpack_from(">ih", body, 0)
        assert (correlation, error) == (7, 0)
        token = b"\0alice\0" + password.encode()
        s.sendall(struct.pack(">i", len(token)) + token)
        if not accepted:
            assert closed(s)
            return
        assert s.recv(4, socket.MSG_WAITALL) == struct.pack(">i", 0)  # PLAIN's empty answer
        s.sendall(_frame(3, 1, struct.pack(">i", -1), correlation=8))  # Metadata v1
        assert struct.unpack_from(">i", _read_frame(s))[0] == 8


def test_describe_user_scram_credentials_lists_the_configured_users(sasl_broker):
    from confluent_kafka.admin import ScramMechanism

    admin = AdminClient(settings(sasl_broker, "SCRAM-SHA-512"))
    described = admin.describe_user_scram_credentials().result(10)
    assert sorted(described) == ["alice", "bob"]
    infos = described["alice"].scram_credential_infos
    assert sorted((i.mechanism, i.iterations) for i in infos) == [
        (ScramMechanism.SCRAM_SHA_256, 4096), (ScramMechanism.SCRAM_SHA_512, 4096)]
    (future,) = admin.describe_user_scram_credentials(["mallory"]).values()
    with pytest.raises(KafkaException) as e:
        future.result(10)
    assert e.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND


def test_scram_users_set_by_an_admin_authenticate_survive_a_restart_and_can_be_deleted(tmp_path):
    """AlterUserScramCredentials (KIP-554) stores a credential the SCRAM exchange then checks;
    it outlives a restart; deleting it refuses the user again."""
    from confluent_kafka.admin import (
        ScramCredentialInfo, ScramMechanism, UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    b = start_broker(tmp_path, env={"CONNECTORS_KAFKA_SASL_MECHANISMS": "SCRAM-SHA-256,PLAIN",
                                    "CONNECTORS_KAFKA_SASL_USERS": "admin:admin-secret"})
    try:
        admin = AdminClient(settings(b, "PLAIN", "admin", "admin-secret"))
        sha256 = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192)
        futures = admin.alter_user_scram_credentials([
            UserScramCredentialUpsertion("dave", sha256, b"dave-secret"),
            UserScramCredentialUpsertion("admin", sha256, b"rotated"),  # replaces the config's
            UserScramCredentialUpsertion("erin", ScramCredentialInfo(
                ScramMechanism.SCRAM_SHA_256, 100), b"x"),  # too few iterations
            UserScramCredentialDeletion("frank", ScramMechanism.SCRAM_SHA_256),  # none stored
        ])
        futures["dave"].result(10)
        futures["admin"].result(10)
        for user, code in (("erin", KafkaError.UNACCEPTABLE_CREDENTIAL),
                           ("frank", KafkaError.RESOURCE_NOT_FOUND)):
            with pytest.raises(KafkaException) as e:
                futures[user].result(10)
            assert e.value.args[0].code() == code, user
        described = admin.describe_user_scram_credentials().result(10)
        assert sorted(described) == ["admin", "dave"]
        assert [(i.mechanism, i.iterations) for i in described["dave"].scram_credential_infos] \
            == [(ScramMechanism.SCRAM_SHA_256, 8192)]

        assert round_trip(settings(b, "SCRAM-SHA-256", "dave", "dave-secret"), "dave-t", 2) \
            == [b"v0", b"v1"]
        assert auth_errors(settings(b, "SCRAM-SHA-256", "admin", "admin-secret"))
        assert authenticates(settings(b, "SCRAM-SHA-256", "admin", "rotated"))

        b.stop()
        b.restart()
        admin = AdminClient(settings(b, "PLAIN", "admin", "admin-secret"))  # PLAIN: the config
        assert authenticates(settings(b, "SCRAM-SHA-256", "dave", "dave-secret"))
        admin.alter_user_scram_credentials([UserScramCredentialDeletion(
            "dave", ScramMechanism.SCRAM_SHA_256)])["dave"].result(10)
        errors = auth_errors(settings(b, "SCRAM-SHA-256", "dave", "dave-secret"))
        assert errors and errors[0].code() == KafkaError._AUTHENTICATION
    finally:
        b.stop()


def test_scram_credentials_can_be_set_without_sasl(tmp_path):
    """As in Kafka, the credential APIs work whatever the listeners ask for."""
    from confluent_kafka.admin import (
        ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion,
    )

    b = start_broker(tmp_path)
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        sha512 = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
        admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion("gina", sha512, b"pw")])["gina"].result(10)
        described = admin.describe_user_scram_credentials(["gina"])["gina"].result(10)
        assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] \
            == [(ScramMechanism.SCRAM_SHA_512, 4096)]

        from kio.schema.alter_user_scram_credentials.v0 import request as m
        from kio.schema.errors import ErrorCode

        def up(name: str, mechanism: int = 1, iterations: int = 4096, salt: bytes = b"s"):
            return m.ScramCredentialUpsertion(name=name, mechanism=mechanism,
                                              iterations=iterations, salt=salt,
                                              salted_password=b"p" * 32)
        with RawClient(b.kafka_port) as raw:
            r = raw.call(m.AlterUserScramCredentialsRequest(
                deletions=(m.ScramCredentialDeletion(name="dup", mechanism=1),),
                upsertions=(up("dup"), up(""), up("odd", mechanism=0), up("many", iterations=20000),
                            up("nosalt", salt=b""), up("ok", 2), up("ok", 1))))
        assert [(x.user, x.error_code) for x in r.results] == [
            ("dup", ErrorCode.duplicate_resource), ("", ErrorCode.unacceptable_credential),
            ("odd", ErrorCode.unsupported_sasl_mechanism),
            ("many", ErrorCode.unacceptable_credential),
            ("nosalt", ErrorCode.unacceptable_credential), ("ok", ErrorCode.none)]
        assert sorted(admin.describe_user_scram_credentials().result(10)) == ["gina", "ok"]
    finally:
        b.stop()


def test_metrics_count_authentications_by_mechanism_and_result(sasl_broker):
    from conftest import http_get

    assert auth_errors(settings(sasl_broker, "SCRAM-SHA-512", "alice", "wrong"))
    assert AdminClient(settings(sasl_broker, "SCRAM-SHA-512")).list_topics(timeout=10).brokers
    text = http_get(sasl_broker.http_port, "/metrics").decode()
    for result in ("success", "failure"):
        line = next(x for x in text.splitlines() if x.startswith(
            f'kmqkafka_kafka_sasl_authentications_total{{mechanism="SCRAM-SHA-512",'
            f'result="{result}"}}'))
        assert float(line.rpartition(" ")[2]) >= 1, line


def test_sasl_requests_after_authentication_are_refused_but_keep_the_connection(sasl_broker):
    """No KIP-368 re-authentication: ILLEGAL_SASL_STATE, as Kafka answers with it off."""
    from kio.schema.errors import ErrorCode
    from kio.schema.metadata.v1.request import MetadataRequest
    from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

    with RawClient(sasl_broker.kafka_port) as raw:
        assert raw.authenticate("SCRAM-SHA-256", "alice", "alice-secret").error_code == 0
        again = raw.call(SaslHandshakeRequest(mechanism="PLAIN"))
        assert again.error_code == ErrorCode.illegal_sasl_state
        assert raw.call(MetadataRequest(topics=None)).brokers


def test_clients_authenticate_again_on_their_connections_when_sessions_expire(tmp_path):
    """KIP-368 with connections.max.reauth.ms = 1.5 s: librdkafka and kafka-python re-
    authenticate on the same connections and keep producing; a client that does not is cut
    off at its next request after expiry."""
    from kio.schema.metadata.v1.request import MetadataRequest

    from conftest import http_get

    b = start_broker(tmp_path, env={"CONNECTORS_KAFKA_SASL_MECHANISMS": "SCRAM-SHA-256,PLAIN",
                                    "CONNECTORS_KAFKA_SASL_USERS": USERS,
                                    "CONNECTORS_KAFKA_CONNECTIONS_MAX_REAUTH_MS": "1500"})
    try:
        with RawClient(b.kafka_port) as raw:
            r = raw.authenticate("PLAIN", "alice", "alice-secret")
            assert r.error_code == 0 and r.session_lifetime.total_seconds() == 1.5
            assert raw.call(MetadataRequest(topics=None)).brokers
            time.sleep(1.7)
            with pytest.raises(OSError):  # reset or closed
                raw.call(MetadataRequest(topics=None))

        from confluent_kafka import Producer

        delivered: list = []
        p = Producer({**settings(b, "SCRAM-SHA-256"), "acks": "all", "linger.ms": 50})
        deadline = time.monotonic() + 5
        i = 0
        while time.monotonic() < deadline:
            p.produce("reauth", value=b"%d" % i, on_delivery=lambda e, m: delivered.append(e))
            p.poll(0.1)
            i += 1
        assert p.flush(20) == 0
        assert len(delivered) == i and not any(delivered), delivered[:3]
        common = dict(bootstrap_servers=f"{HOST}:{b.kafka_port}",
                      security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                      sasl_plain_username="alice", sasl_plain_password="alice-secret")
        assert kafka_python_round_trip(common, "reauth-kp", 3) == [b"v0", b"v1", b"v2"]
        text = http_get(b.http_port, "/metrics").decode()
        successes = next(float(x.rpartition(" ")[2]) for x in text.splitlines() if x.startswith(
            'kmqkafka_kafka_sasl_authentications_total{mechanism="SCRAM-SHA-256",'
            'result="success"}'))
        assert successes >= 4, successes  # 5 s of 1.5 s sessions: re-authentications
        # Only the raw client outlived its session; the real clients re-authenticated in time.
        assert b.log().count("request after the SASL session expired") == 1
    finally:
        b.stop()


def test_broker_configs_name_the_sasl_listeners_and_mechanisms(sasl_broker):
    from confluent_kafka.admin import ConfigResource, ResourceType

    admin = AdminClient(settings(sasl_broker, "PLAIN"))
    resource = ConfigResource(ResourceType.BROKER, "1")
    configs = admin.describe_configs([resource])[resource].result(10)
    assert configs["sasl.enabled.mechanisms"].value == ",".join(MECHANISMS)
    assert configs["listeners"].value.startswith("SASL_PLAINTEXT://")
    assert ",SASL_SSL://" in configs["advertised.listeners"].value
    assert configs["connections.max.reauth.ms"].value == "0"
