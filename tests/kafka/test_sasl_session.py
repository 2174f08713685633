"""The SASL state machine of one connection (``net/sasl.py``), without sockets."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scramp import ScramClient

from kmqkafka.net.oauthbearer import Jwks
from kmqkafka.net.sasl import (
    AuthenticationFailed, IllegalSaslState, OAuthSettings, SaslUsers, client_steps,
)

USERS = SaslUsers(("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"), (("alice", "pw"), ("b,o=b", "x")))


def exchange(session, mechanism: str, user: str, password: str) -> None:
    assert session.handshake(mechanism)
    steps = client_steps(mechanism, user, password)
    token = next(steps)
    while True:
        reply = session.authenticate(token)
        try:
            token = steps.send(reply)
        except StopIteration:
            return


def run(mechanism: str, user: str, password: str):
    session = USERS.session()
    exchange(session, mechanism, user, password)
    return session


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_each_mechanism_authenticates_and_names_the_principal(mechanism):
    session = run(mechanism, "b,o=b", "x")  # SCRAM escapes ',' and '=' in the name
    assert session.authenticated and session.principal == "User:b,o=b"
    assert session.allows(3)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_a_wrong_password_fails_the_session(mechanism):
    with pytest.raises(AuthenticationFailed):
        run(mechanism, "alice", "nope")


def test_nothing_but_the_sasl_apis_before_authentication():
    session = USERS.session()
    assert [session.allows(k) for k in (18, 17, 36, 0, 1, 3)] == [True] * 3 + [False] * 3
    with pytest.raises(IllegalSaslState):
        session.authenticate(b"\0alice\0pw")  # no handshake yet
    assert not session.handshake("GSSAPI")
    assert session.handshake("PLAIN")
    with pytest.raises(IllegalSaslState):
        session.handshake("PLAIN")  # one handshake per connection


def test_plain_refuses_another_authorization_id_and_malformed_tokens():
    for token in (b"bob\0alice\0pw", b"alice\0pw", b"\0alice\0", b"\0\xff\0pw"):
        session = USERS.session()
        session.handshake("PLAIN")
        with pytest.raises(AuthenticationFailed):
            session.authenticate(token)
        assert session.failed
    session = USERS.session()
    session.handshake("PLAIN")
    session.authenticate(b"alice\0alice\0pw")  # the same id as the user is fine
    assert session.authenticated


def test_a_client_final_nonce_that_ends_with_the_servers_is_taken_as_kafka_does():
    """librdkafka 2.0 (Debian's kcat) sends its own nonce in front of the server-first one."""
    session = USERS.session()
    session.handshake("SCRAM-SHA-256")
    client = ScramClient(["SCRAM-SHA-256"], "alice", "pw")
    first = client.get_client_first()
    client_nonce = first.rpartition("r=")[2]
    client.set_server_first(session.authenticate(first.encode()).decode())
    # Its final message (and so its proof) carries client nonce + server-first nonce.
    client.nonce = type(client.nonce)(client_nonce + str(client.nonce))
    final = client.get_client_final()
    assert final.count(client_nonce) == 2
    session.authenticate(final.encode())
    assert session.authenticated


def test_scram_credentials_follow_the_enabled_mechanisms():
    assert USERS.scram_credentials()["alice"] == ((1, 4096), (2, 4096))
    assert SaslUsers(("PLAIN",), (("alice", "pw"),)).scram_credentials() == {}


@given(first=st.binary(max_size=300), second=st.binary(max_size=300),
       mechanism=st.sampled_from(["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]))
@settings(max_examples=300, deadline=None)
def test_any_bytes_fail_the_exchange_cleanly(first, second, mechanism):
    """Whatever a client sends, the session answers or refuses it; it never raises anything
    else (which the dispatcher would turn into UNKNOWN_SERVER_ERROR)."""
    jwks = Jwks("file:///unused")
    users = SaslUsers(("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"),
                      (("alice", "pw"),), oauth=OAuthSettings(jwks))
    session = users.session()
    session.handshake(mechanism)
    try:
        session.authenticate(first)
        session.authenticate(second)
    except (AuthenticationFailed, IllegalSaslState):
        pass
    assert not session.authenticated


def reauth_users(max_reauth_ms: int = 2000):
    from twisted.internet.task import Clock

    clock = Clock()
    return SaslUsers(("PLAIN", "SCRAM-SHA-256"), (("alice", "pw"), ("bob", "x")),
                     max_reauth_ms=max_reauth_ms, clock=clock), clock


def test_an_expired_session_answers_only_sasl_until_the_client_authenticates_again():
    users, clock = reauth_users()
    session = users.session()
    exchange(session, "SCRAM-SHA-256", "alice", "pw")
    assert session.lifetime_ms == 2000 and session.allows(3)
    clock.advance(2.1)
    assert not session.allows(3) and session.allows(17) and session.allows(36)
    exchange(session, "SCRAM-SHA-256", "alice", "pw")  # KIP-368: same connection
    assert session.allows(3) and session.principal == "User:alice"
    clock.advance(1.9)
    assert session.allows(3)


def test_re_authentication_keeps_the_mechanism_and_the_principal():
    users, _clock = reauth_users()
    session = users.session()
    exchange(session, "PLAIN", "alice", "pw")
    with pytest.raises(IllegalSaslState):
        session.handshake("SCRAM-SHA-256")
    with pytest.raises(AuthenticationFailed, match="Cannot change principals"):
        exchange(session, "PLAIN", "bob", "x")
    assert session.failed


def test_without_max_reauth_a_session_never_expires_and_a_second_handshake_is_refused():
    users, clock = reauth_users(0)
    session = users.session()
    exchange(session, "PLAIN", "alice", "pw")
    clock.advance(10 ** 6)
    assert session.allows(3) and session.lifetime_ms == 0
    with pytest.raises(IllegalSaslState):
        session.handshake("PLAIN")
