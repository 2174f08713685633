"""SASL/OAUTHBEARER with real clients: tokens an identity provider signed (here, a key made for
the test) are checked against its JWKS, read from a file or fetched over HTTP; expired
tokens, tokens signed by another key and tokens for another audience are refused."""

import http.server
import json
import threading
import time

import jwt
import pytest
from confluent_kafka import KafkaError
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from conftest import (
    HOST, BrokerProcess, auth_errors, authenticates, kafka_python_round_trip, round_trip,
    start_broker,
)

AUDIENCE = "kmqkafka"
ISSUER = "https://idp.test"


def make_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def jwks_of(key: rsa.RSAPrivateKey, kid: str) -> bytes:
    jwk = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
    jwk.update(kid=kid, use="sig", alg="RS256")
    return json.dumps({"keys": [jwk]}).encode()


def token(key: rsa.RSAPrivateKey, kid: str = "k1", sub: str = "svc-orders",
          lifetime_s: int = 600, **claims) -> str:
    now = int(time.time())
    body = {"sub": sub, "iat": now, "exp": now + lifetime_s, "aud": AUDIENCE, "iss": ISSUER,
            **claims}
    return jwt.encode(body, key, algorithm="RS256", headers={"kid": kid})


KEY = make_key()


@pytest.fixture(scope="module")
def oauth_broker(tmp_path_factory) -> BrokerProcess:
    tmp = tmp_path_factory.mktemp("oauth")
    (tmp / "jwks.json").write_bytes(jwks_of(KEY, "k1"))
    b = start_broker(tmp, env={
        "CONNECTORS_KAFKA_SASL_MECHANISMS": "OAUTHBEARER",
        "CONNECTORS_KAFKA_SASL_OAUTHBEARER_JWKS_URL": f"file://{tmp / 'jwks.json'}",
        "CONNECTORS_KAFKA_SASL_OAUTHBEARER_EXPECTED_AUDIENCE": f"other,{AUDIENCE}",
        "CONNECTORS_KAFKA_SASL_OAUTHBEARER_EXPECTED_ISSUER": ISSUER,
        "CONNECTORS_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0"})
    try:
        yield b
    finally:
        b.stop()


def json_server(respond) -> http.server.ThreadingHTTPServer:
    """A local HTTP server, in a thread, answering every GET and POST with the JSON bytes
    ``respond(handler)`` returns (an identity provider's JWKS or token endpoint)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = respond(self)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer((HOST, 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def settings(port: int, jwt_text: str) -> dict:
    return {"bootstrap.servers": f"{HOST}:{port}", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "OAUTHBEARER",
            "oauth_cb": lambda _config: (jwt_text, time.time() + 600)}


def test_confluent_kafka_produces_and_consumes_with_a_signed_token(oauth_broker):
    got = round_trip(settings(oauth_broker.kafka_port, token(KEY)), "oauth-t", 10)
    assert got == [b"v%d" % i for i in range(10)]


@pytest.mark.parametrize("bad,why", [
    (lambda: token(KEY, lifetime_s=-120), "expired"),
    (lambda: token(make_key()), "Signature verification failed"),
    (lambda: token(KEY, kid="k9"), "no key with id 'k9'"),
    (lambda: token(KEY, aud="someone-else"), "audience"),
    (lambda: token(KEY, iss="https://evil.test"), "issuer"),
    (lambda: jwt.encode({"sub": "x", "exp": int(time.time()) + 60}, "s" * 32,
                        algorithm="HS256", headers={"kid": "k1"}), "HS256"),
], ids=["expired", "other-key", "unknown-kid", "audience", "issuer", "shared-secret"])
def test_tokens_that_do_not_check_out_are_refused(oauth_broker, bad, why):
    errors = auth_errors(settings(oauth_broker.kafka_port, bad()))
    assert errors and errors[0].code() == KafkaError._AUTHENTICATION, errors
    assert why.lower() in errors[0].str().lower(), errors[0].str()
    # A good token still works on the same daemon.
    assert authenticates(settings(oauth_broker.kafka_port, token(KEY)))


def test_kafka_python_authenticates_with_a_token_provider(oauth_broker):
    from kafka.net.sasl.oauth import AbstractTokenProvider

    class Provider(AbstractTokenProvider):
        def token(self):
            return token(KEY, sub="kp-client")

    common = dict(bootstrap_servers=f"{HOST}:{oauth_broker.kafka_port}",
                  security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
                  sasl_oauth_token_provider=Provider())
    assert kafka_python_round_trip(common, "oauth-kp", 3) == [b"v0", b"v1", b"v2"]


def test_a_jwks_fetched_over_http_is_used_and_refreshed(tmp_path):
    """The key set comes from an HTTP endpoint, and a key published later is picked up at the
    next refresh (rotation)."""
    published = {"doc": jwks_of(KEY, "k1")}
    server = json_server(lambda _handler: published["doc"])
    b = start_broker(tmp_path, env={
        "CONNECTORS_KAFKA_SASL_MECHANISMS": "OAUTHBEARER",
        "CONNECTORS_KAFKA_SASL_OAUTHBEARER_JWKS_URL":
            f"http://{HOST}:{server.server_address[1]}/jwks.json",
        "CONNECTORS_KAFKA_SASL_OAUTHBEARER_JWKS_REFRESH_MS": "1000"})
    try:
        assert authenticates(settings(b.kafka_port, token(KEY)))
        rotated = make_key()
        assert auth_errors(settings(b.kafka_port, token(rotated, kid="k2")))
        published["doc"] = jwks_of(rotated, "k2")
        time.sleep(2.5)  # two refreshes at 1 s
        assert authenticates(settings(b.kafka_port, token(rotated, kid="k2")))
    finally:
        b.stop()
        server.shutdown()


def test_aiokafka_authenticates_with_a_token_provider(oauth_broker):
    import asyncio

    from aiokafka import AIOKafkaProducer
    from aiokafka.abc import AbstractTokenProvider

    class Provider(AbstractTokenProvider):
        async def token(self):
            return token(KEY, sub="aio-client")

    async def run() -> None:
        p = AIOKafkaProducer(bootstrap_servers=f"{HOST}:{oauth_broker.kafka_port}",
                             security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
                             sasl_oauth_token_provider=Provider(), acks="all")
        await p.start()
        try:
            meta = await p.send_and_wait("oauth-aio", b"a")
            assert meta.offset == 0
        finally:
            await p.stop()

    asyncio.run(run())


def test_librdkafka_fetches_its_token_from_an_oidc_endpoint(oauth_broker):
    """librdkafka's own OIDC client-credentials flow (sasl.oauthbearer.method=oidc): it asks a
    token endpoint (here a local one) for a JWT and presents it."""
    import base64
    import urllib.parse

    asked: list[dict] = []

    def issue(request: http.server.BaseHTTPRequestHandler) -> bytes:
        form = urllib.parse.parse_qs(
            request.rfile.read(int(request.headers.get("Content-Length") or 0)).decode())
        auth = base64.b64decode(request.headers.get("Authorization", "Basic ").split()[-1])
        asked.append({"grant": form.get("grant_type"), "client": auth.decode()})
        return json.dumps({"access_token": token(KEY, sub="oidc-client"),
                           "token_type": "bearer", "expires_in": 600}).encode()

    server = json_server(issue)
    try:
        common = {"bootstrap.servers": f"{HOST}:{oauth_broker.kafka_port}",
                  "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "OAUTHBEARER",
                  "sasl.oauthbearer.method": "oidc",
                  "sasl.oauthbearer.client.id": "orders-svc",
                  "sasl.oauthbearer.client.secret": "s3cret",
                  "sasl.oauthbearer.token.endpoint.url":
                      f"http://{HOST}:{server.server_address[1]}/token"}
        assert authenticates(common)
        assert asked and asked[0]["grant"] == ["client_credentials"]
        assert asked[0]["client"] == "orders-svc:s3cret"
    finally:
        server.shutdown()


def test_without_a_jwks_unsigned_tokens_are_taken_as_kafkas_default_validator_takes_them(
        tmp_path):
    """Kafka's OAUTHBEARER with no validator configured is its unsecured one: librdkafka's
    own unsecured JWT (``enable.sasl.oauthbearer.unsecure.jwt``) and kafka-python's provider
    of one authenticate; an expired or signed token does not."""
    import base64

    def unsigned(claims: dict) -> str:
        def part(d: dict) -> str:
            return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
        return f"{part({'alg': 'none'})}.{part(claims)}."

    b = start_broker(tmp_path, env={"CONNECTORS_KAFKA_SASL_MECHANISMS": "OAUTHBEARER",
                                    "CONNECTORS_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0"})
    try:
        assert "accepts unsigned tokens" in b.log()
        librdkafka = {"bootstrap.servers": f"{HOST}:{b.kafka_port}",
                      "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "OAUTHBEARER",
                      "enable.sasl.oauthbearer.unsecure.jwt": True,
                      "sasl.oauthbearer.config": "principal=alice lifeSeconds=600"}
        assert round_trip(librdkafka, "unsecured-t", 5) == [b"v%d" % i for i in range(5)]

        from kafka.net.sasl.oauth import AbstractTokenProvider

        class Provider(AbstractTokenProvider):
            def token(self):
                return unsigned({"sub": "kp-client", "exp": int(time.time()) + 600})

        common = dict(bootstrap_servers=f"{HOST}:{b.kafka_port}",
                      security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
                      sasl_oauth_token_provider=Provider())
        assert kafka_python_round_trip(common, "unsecured-kp", 3) == [b"v0", b"v1", b"v2"]
        expired = unsigned({"sub": "x", "exp": int(time.time()) - 60})
        for bad, why in [(expired, "Expiration Time"), (token(KEY), "'none'")]:
            errors = auth_errors(settings(b.kafka_port, bad))
            assert errors and errors[0].code() == KafkaError._AUTHENTICATION, errors
            assert why in errors[0].str(), errors[0].str()
    finally:
        b.stop()
