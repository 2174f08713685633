"""SASL/OAUTHBEARER (RFC 7628, KIP-255/KIP-768): a client presents a JWT its identity provider
signed; the broker checks it against the provider's published keys (a JWKS) and takes the
token's ``sub`` as the principal.

``Jwks`` holds the key set: read from a ``file://`` URL at start-up (an unreadable or invalid
file stops start-up with one line), or fetched from ``http(s)://`` with treq, and read again
every ``refresh_s`` (Kafka's sasl.oauthbearer.jwks.endpoint.url and .refresh.ms). Until a
fetched set first arrives every token is refused.

``validate`` follows Kafka's secured validator (OAuthBearerValidatorCallbackHandler): the
signature must verify with the key the token's ``kid`` names (an asymmetric algorithm only:
never ``none`` or a shared secret), ``exp`` and ``sub`` are required, ``exp``/``nbf``/``iat``
are checked with 30 s of clock skew, and the audience and issuer when configured.

``validate_unsecured`` is Kafka's default when no key set is configured
(OAuthBearerUnsecuredValidatorCallbackHandler, for development only): an unsigned JWS
(``alg`` ``none``, an empty signature), whose ``sub`` names the principal and whose ``exp``
has not passed (and ``iat``, when present, is not in the future nor after ``exp``), with no
clock skew. Anyone who can reach the listener can then claim any principal.

The client's first message is the GS2 header and ``auth=Bearer <token>`` between ``\\x01``
separators; a good token is answered with empty bytes, a bad one fails the exchange at once
with SASL_AUTHENTICATION_FAILED and a message saying what was wrong (Kafka first sends an RFC
7628 error challenge; clients report both as an authentication failure).
"""
from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import jwt
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

__all__ = ["InvalidToken", "Jwks", "bearer_token", "validate", "validate_unsecured"]

log = Logger()

CLOCK_SKEW_S = 30  # Kafka's sasl.oauthbearer.clock.skew.seconds
_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
               "ES512", "EdDSA")


class InvalidToken(Exception):
    """The token was refused; ``str()`` says why (sent to the client)."""


class Jwks:
    """The signing keys tokens are checked against, by key id."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.keys: dict[str | None, Any] = {}
        self.loaded = False
        self._refresh: LoopingCall | None = None

    def load_file(self) -> None:
        """Read a ``file://`` JWKS now; raises ValueError (one line) if it cannot be used."""
        path = self.url[len("file://"):]
        try:
            with open(path, "rb") as f:
                self.set(f.read())
        except OSError as e:
            raise ValueError(f"cannot read {path!r}: {e.strerror}") from None

    def set(self, document: bytes) -> None:
        """Take a JWKS document; raises ValueError if it holds no usable key."""
        try:
            keys = jwt.PyJWKSet.from_dict(json.loads(document)).keys
        except (ValueError, jwt.PyJWTError) as e:
            raise ValueError(f"not a usable JWKS: {e}") from None
        self.keys = {k.key_id: k for k in keys}
        self.loaded = True

    def start(self, reactor: Any, refresh_s: float) -> None:
        """Keep the set fresh: read it again every ``refresh_s`` (at once for http(s))."""
        self._refresh = LoopingCall(self._reload, reactor)
        self._refresh.clock = reactor
        self._refresh.start(refresh_s, now=not self.url.startswith("file://"))

    def stop(self) -> None:
        if self._refresh is not None and self._refresh.running:
            self._refresh.stop()

    def _reload(self, reactor: Any) -> Any:
        if self.url.startswith("file://"):
            try:
                self.load_file()
            except ValueError as e:
                log.warn("OAUTHBEARER JWKS {url} not reloaded: {why}", url=self.url, why=str(e))
            return None
        import treq

        def got(body: bytes) -> None:
            try:
                self.set(body)
            except ValueError as e:
                log.warn("OAUTHBEARER JWKS {url} not taken: {why}", url=self.url, why=str(e))

        def failed(failure: Any) -> None:
            log.warn("OAUTHBEARER JWKS {url} not fetched: {why}", url=self.url,
                     why=failure.getErrorMessage())

        d = treq.get(self.url, timeout=30, reactor=reactor).addCallback(treq.content)
        d.addCallbacks(got, failed)
        return None  # a slow fetch never stops the refresh loop

    def key_for(self, kid: str | None) -> Any:
        if kid in self.keys:
            return self.keys[kid]
        if kid is None and len(self.keys) == 1:
            return next(iter(self.keys.values()))
        raise InvalidToken(f"no key with id {kid!r} in the JWKS" if self.loaded else
                           "the JWKS has not been fetched yet")


def bearer_token(message: bytes) -> str:
    """The token of a client's first OAUTHBEARER message (GS2 header, then key=value pairs
    between \\x01 separators, ``auth=Bearer <token>`` among them)."""
    try:
        text = message.decode()
    except UnicodeDecodeError:
        raise InvalidToken("Invalid OAUTHBEARER client first message: not UTF-8") from None
    header, sep, rest = text.partition("\x01")
    if not sep or not header.startswith(("n,", "y,")) or not rest.endswith("\x01\x01"):
        raise InvalidToken("Invalid OAUTHBEARER client first message")
    for pair in rest[:-2].split("\x01"):
        key, _, value = pair.partition("=")
        if key == "auth":
            scheme, _, token = value.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise InvalidToken("Invalid OAUTHBEARER client first message: no bearer token")
            return token.strip()
    raise InvalidToken("Invalid OAUTHBEARER client first message: no auth")


def validate(token: str, jwks: Jwks, audience: tuple[str, ...],
             issuer: str) -> tuple[str, float]:
    """The token's subject and expiry (epoch seconds), once its signature and claims check
    out; else ``InvalidToken``."""
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as e:
        raise InvalidToken(f"malformed token: {e}") from None
    algorithm = header.get("alg")
    if algorithm not in _ALGORITHMS:
        raise InvalidToken(f"token algorithm {algorithm!r} is not accepted")
    key = jwks.key_for(header.get("kid"))
    try:
        claims = jwt.decode(
            token, key=key.key, algorithms=[algorithm], audience=list(audience) or None,
            issuer=issuer or None, leeway=CLOCK_SKEW_S,
            options={"require": ["exp", "sub"], "verify_aud": bool(audience)})
    except jwt.PyJWTError as e:
        raise InvalidToken(f"token refused: {e}") from None
    subject = claims["sub"]
    if not isinstance(subject, str) or not subject:
        raise InvalidToken("token refused: the sub claim is empty")
    return subject, float(claims["exp"])


def _unsecured_part(part: str, what: str) -> dict[str, Any]:
    try:
        decoded = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (ValueError, binascii.Error):
        raise InvalidToken(f"malformed Base64 URL encoded value in the {what}") from None
    try:
        value = json.loads(decoded)
    except ValueError:
        raise InvalidToken(f"malformed JSON in the {what}") from None
    if not isinstance(value, dict):
        raise InvalidToken(f"malformed JSON in the {what}")
    return value


def validate_unsecured(token: str, now_s: float) -> tuple[str, float]:
    """The subject and expiry (epoch seconds) of an unsecured JWS, checked as Kafka's
    unsecured validator checks it; else ``InvalidToken``."""
    if ".." in token:
        raise InvalidToken("Malformed compact serialization contains '..'")
    parts = token.split(".")
    if len(parts) != 3:
        raise InvalidToken("Unsecured JWS compact serializations must have 3 dot-separated "
                           "Base64URL-encoded values")
    header = _unsecured_part(parts[0], "header")
    claims = _unsecured_part(parts[1], "claims")
    if header.get("alg") != "none":
        raise InvalidToken("Unsecured JWS must have 'none' for an algorithm")
    if parts[2]:
        raise InvalidToken("Unsecured JWS must not contain a digital signature")
    expires, issued, subject = claims.get("exp"), claims.get("iat"), claims.get("sub")
    if not isinstance(expires, (int, float)) or isinstance(expires, bool):
        raise InvalidToken("No expiration time in JWT")
    if not isinstance(subject, str) or not subject.strip():
        raise InvalidToken("No principal name in JWT claim: sub")
    if issued is not None:
        if not isinstance(issued, (int, float)) or isinstance(issued, bool):
            raise InvalidToken("The 'iat' claim was not of type Number")
        if issued > now_s:
            raise InvalidToken(f"The Issued At value ({issued}) is in the future")
        if expires <= issued:
            raise InvalidToken(f"The Expiration Time time ({expires}) is not after the "
                               f"Issued At time ({issued})")
    if now_s >= expires:
        raise InvalidToken(f"The indicated time ({now_s}) is on or after the Expiration Time "
                           f"value ({expires})")
    return subject, float(expires)
