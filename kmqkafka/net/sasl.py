"""SASL authentication of a Kafka connection: PLAIN and SCRAM-SHA-256/512 against the
configured users, OAUTHBEARER against an identity provider's keys (``oauthbearer.py``).

``SaslUsers`` is built once from the settings. SCRAM needs per-user salted keys, which cost a
PBKDF2 run each; they are derived at start-up (4,096 iterations, Kafka's minimum), so a
connection's authentication never blocks the reactor on key derivation. PLAIN passwords are
compared in constant time.

``SaslSession`` is one connection's state, driven by the SaslHandshake and SaslAuthenticate
handlers (``kafka/security.py``), in the order Kafka requires: a handshake picks the mechanism,
then one (PLAIN, OAUTHBEARER) or two (SCRAM) SaslAuthenticate exchanges. Until it succeeds
the connection may only send ApiVersions, SaslHandshake and SaslAuthenticate (``allows``). A
failed exchange marks the session ``failed``: the connection answers it and then closes, as Kafka's
SaslServerAuthenticator does. With ``max_reauth_ms`` (Kafka's connections.max.reauth.ms) a
session expires after that long (or when its OAUTHBEARER token does, if sooner); the client
is told so in SaslAuthenticate and authenticates again on the same connection, with the same
mechanism and principal (KIP-368); past expiry only the SASL APIs are answered.

Reactor-thread only.
"""
from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from scramp import ScramException, ScramMechanism
from twisted.logger import Logger

from kmqkafka.kafka.context import ANONYMOUS
from kmqkafka.kafka.scram_credentials import CODES
from kmqkafka.net.oauthbearer import (
    InvalidToken, Jwks, bearer_token, validate, validate_unsecured,
)

__all__ = ["AuthenticationFailed", "IllegalSaslState", "SaslSession", "SaslUsers", "client_steps"]

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
_BEFORE_AUTH = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})
SCRAM_ITERATIONS = 4096
log = Logger()


class AuthenticationFailed(Exception):
    """The client's credentials were refused; ``str()`` is the message the client sees."""


class IllegalSaslState(Exception):
    """A SASL request out of order (SaslAuthenticate before a handshake, a second one)."""


def _failed_message(mechanism: str) -> str:
    # Kafka's wording; it names neither the user nor what was wrong with the credentials.
    return (f"Authentication failed during authentication due to invalid credentials with "
            f"SASL mechanism {mechanism}")


@dataclass(frozen=True)
class OAuthSettings:
    """How OAUTHBEARER tokens are checked: the signing keys (None: Kafka's unsecured
    validator, unsigned tokens), and the audiences (any one) and issuer a token must name
    (empty: not checked)."""

    jwks: Jwks | None
    audience: tuple[str, ...] = ()
    issuer: str = ""


class SaslUsers:
    """The configured users and the mechanisms they may authenticate with."""

    def __init__(self, mechanisms: tuple[str, ...], users: tuple[tuple[str, str], ...],
                 stored: Any = None, oauth: "OAuthSettings | None" = None,
                 max_reauth_ms: int = 0, clock: Any = None) -> None:
        """``stored``: the admin-set SCRAM credentials (``kafka.scram_credentials``), checked
        before the configured users; ``oauth``: how OAUTHBEARER tokens are checked;
        ``max_reauth_ms``: Kafka's connections.max.reauth.ms (0: sessions never expire), timed
        by ``clock`` (an ``IReactorTime``)."""
        self.mechanisms = mechanisms
        self.max_reauth_ms = max_reauth_ms
        self.clock = clock
        self.stored = stored
        self.oauth = oauth
        self._plain = {name: hashlib.sha256(password.encode()).digest()
                       for name, password in users}
        self._scram: dict[str, tuple[ScramMechanism, dict[str, Any]]] = {}
        for mechanism in mechanisms:
            if mechanism.startswith("SCRAM-"):
                m = ScramMechanism(mechanism)
                self._scram[mechanism] = (m, {
                    name: m.make_auth_info(password, iteration_count=SCRAM_ITERATIONS)
                    for name, password in users})
        self.names = tuple(name for name, _ in users)
        # What this node's own relayed requests (``net/forward.py``) authenticate with: the
        # first configured user, the same on every node of a cluster; by PLAIN when it is on,
        # as PLAIN checks only the configured password, which an admin's SCRAM change for
        # that user leaves alone.
        with_users = [m for m in mechanisms if m != "OAUTHBEARER"]
        mechanism = "PLAIN" if "PLAIN" in with_users else (with_users or [None])[0]
        self.node_credentials = ((mechanism, users[0][0], users[0][1])
                                 if mechanism is not None and users else None)

    def scram_credentials(self) -> dict[str, tuple[tuple[int, int], ...]]:
        """Per user, (Kafka's ScramMechanism code, iterations) of each enabled SCRAM mechanism
        (DescribeUserScramCredentials)."""
        codes = tuple(CODES[m] for m in self.mechanisms if m in CODES)
        return {name: tuple((code, SCRAM_ITERATIONS) for code in codes)
                for name in self.names} if codes else {}

    def session(self) -> "SaslSession":
        return SaslSession(self)

    def check_plain(self, user: str, password: str) -> bool:
        want = self._plain.get(user)
        given = hashlib.sha256(password.encode()).digest()
        # Compare even for an unknown user, so timing does not tell which users exist.
        return hmac.compare_digest(want or b"\0" * 32, given) and want is not None

    def scram(self, mechanism: str) -> tuple[ScramMechanism, dict[str, Any]]:
        return self._scram[mechanism]


class SaslSession:
    """One connection's SASL exchange: ``handshake`` then ``authenticate`` until done."""

    def __init__(self, users: SaslUsers) -> None:
        self._users = users
        self.mechanism: str | None = None
        self.principal = ANONYMOUS
        self.authenticated = False
        self.failed = False
        self.exchanging = False  # a handshake picked the mechanism, the exchange is not done
        self.lifetime_ms = 0  # what SaslAuthenticate tells the client (0: no expiry)
        self.expires_at: float | None = None  # clock time after which only SASL is answered
        self._token_expires_at: float | None = None  # an OAUTHBEARER token's exp
        self._scram: Any = None  # the ScramServer between SCRAM's two exchanges
        self._scram_user = ""
        # After a v0 handshake, frames are bare tokens until authenticated (no SaslAuthenticate).
        self.v0 = False

    @property
    def enabled(self) -> tuple[str, ...]:
        """The mechanisms this listener offers."""
        return self._users.mechanisms

    @property
    def raw_tokens(self) -> bool:
        """The next frame is a bare SASL token (a v0 handshake picked the mechanism)."""
        return self.v0 and self.exchanging

    def allows(self, api_key: int) -> bool:
        """Whether a request of ``api_key`` may be handled on this connection now: before
        authentication, and once a session has expired (KIP-368), only the SASL APIs."""
        if api_key in _BEFORE_AUTH:
            return True
        return self.authenticated and not self.expired()

    def expired(self) -> bool:
        return self.expires_at is not None and self._users.clock.seconds() >= self.expires_at

    @property
    def reauthenticates(self) -> bool:
        """Sessions expire, so an authenticated client may authenticate again (KIP-368)."""
        return self._users.max_reauth_ms > 0

    def handshake(self, mechanism: str) -> bool:
        """Pick the mechanism; False if it is not enabled. Raises ``IllegalSaslState`` for a
        second handshake, unless it starts a re-authentication (KIP-368) with the same
        mechanism."""
        if self.exchanging or (self.mechanism is not None and not self.authenticated) or (
                self.authenticated and not self.reauthenticates):
            raise IllegalSaslState("Unexpected SASL handshake: one was made already")
        if mechanism not in self._users.mechanisms:
            return False
        if self.authenticated and mechanism != self.mechanism:
            raise IllegalSaslState(f"Re-authentication must use {self.mechanism}, not "
                                   f"{mechanism}")
        self.mechanism = mechanism
        self.exchanging = True
        self._scram = None
        return True

    def authenticate(self, token: bytes) -> bytes:
        """One exchange: the client's bytes in, the server's out. Sets ``authenticated`` when
        the exchange completes; raises ``AuthenticationFailed`` (and sets ``failed``) when the
        credentials are refused, ``IllegalSaslState`` before a handshake or after success."""
        if not self.exchanging or self.failed:
            raise IllegalSaslState(
                "Unexpected SaslAuthenticate: no SASL handshake picked a mechanism" if
                self.mechanism is None else "Unexpected SaslAuthenticate: already authenticated")
        try:
            if self.mechanism == "PLAIN":
                return self._plain(token)
            if self.mechanism == "OAUTHBEARER":
                return self._oauthbearer(token)
            return self._scram_step(token)
        except AuthenticationFailed:
            self.failed = True
            raise

    def _plain(self, token: bytes) -> bytes:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: expected 3 tokens")
        try:
            authzid, user, password = (p.decode() for p in parts)
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: not UTF-8") from None
        if not user or not password:
            raise AuthenticationFailed("Authentication failed: username or password not specified")
        if authzid and authzid != user:
            raise AuthenticationFailed(
                "Authentication failed: Client requested an authorization id that is "
                "different from username")
        if not self._users.check_plain(user, password):
            raise AuthenticationFailed("Authentication failed: Invalid username or password")
        self._succeed(user)
        return b""

    def _oauthbearer(self, message: bytes) -> bytes:
        oauth = self._users.oauth
        assert oauth is not None
        try:
            token = bearer_token(message)
            if oauth.jwks is None:
                subject, expires = validate_unsecured(token, self._users.clock.seconds())
            else:
                subject, expires = validate(token, oauth.jwks, oauth.audience, oauth.issuer)
        except InvalidToken as e:
            raise AuthenticationFailed(f"Authentication failed: {e}") from None
        self._token_expires_at = expires
        self._succeed(subject)
        return b""

    def _scram_step(self, token: bytes) -> bytes:
        mechanism = self.mechanism
        assert mechanism is not None
        m, infos = self._users.scram(mechanism)
        try:
            text = token.decode()
            if self._scram is None:
                def lookup(user: str) -> Any:
                    self._scram_user = user
                    stored = self._users.stored
                    info = stored.auth_info(mechanism, user) if stored is not None else None
                    return info if info is not None else infos[user]

                server = m.make_server(lookup)
                server.set_client_first(text)
                self._scram = server
                return server.get_server_first().encode()
            server, self._scram = self._scram, None
            _accept_nonce_suffix(server, text)
            server.set_client_final(text)
            final = server.get_server_final()
            self._succeed(self._scram_user)
            return final.encode()
        except (ScramException, KeyError, UnicodeDecodeError, ValueError) as e:
            log.info("SCRAM exchange refused: {why}", why=repr(e))
            raise AuthenticationFailed(_failed_message(mechanism)) from None

    def _succeed(self, user: str) -> None:
        principal = f"User:{user}"
        if self.authenticated and principal != self.principal:
            raise AuthenticationFailed(
                f"Cannot change principals during re-authentication from {self.principal}: "
                f"{principal}")
        self.authenticated = True
        self.exchanging = False
        self.principal = principal
        if self.reauthenticates:
            # Kafka: the session lasts connections.max.reauth.ms, or until the token expires.
            now = self._users.clock.seconds()
            lifetime = self._users.max_reauth_ms / 1000
            if self._token_expires_at is not None:
                lifetime = max(0.0, min(lifetime, self._token_expires_at - now))
            self.lifetime_ms = int(lifetime * 1000)
            self.expires_at = now + lifetime


def _accept_nonce_suffix(server: Any, client_final: str) -> None:
    """Kafka's ScramSaslServer takes a client-final nonce that *ends with* the server-first
    nonce (librdkafka 2.0, Debian's kcat, sends its own nonce in front of it once more); the
    proof still covers the message as sent, so only the comparison is widened."""
    for attribute in client_final.split(","):
        if attribute.startswith("r="):
            nonce, expected = attribute[2:], str(server.nonce)
            if nonce != expected and nonce.endswith(expected):
                kind = type(server.nonce)  # scramp 1.5 keeps it as a ``Nonce``
                server.nonce = nonce if kind is str else kind(nonce)
            return


def client_steps(mechanism: str, user: str, password: str):  # type: ignore[no-untyped-def]
    """A client's side of an exchange, for a node's own connections to another node's Kafka
    listener (``net/forward.py``): a generator that takes the server's bytes (first ``None``)
    and yields the next token to send; it returns once the server's last answer is checked."""
    if mechanism == "PLAIN":
        yield b"\0" + user.encode() + b"\0" + password.encode()
        return
    from scramp import ScramClient

    client = ScramClient([mechanism], user, password)
    server_first = yield client.get_client_first().encode()
    client.set_server_first(server_first.decode())
    server_final = yield client.get_client_final().encode()
    client.set_server_final(server_final.decode())
