"""OAUTHBEARER's message parsing and token checks (``net/oauthbearer.py``), without sockets."""

import json
import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from kmqkafka.net.oauthbearer import InvalidToken, Jwks, bearer_token, validate


def test_the_bearer_token_is_taken_from_the_gs2_message():
    assert bearer_token(b"n,,\x01auth=Bearer abc.def.ghi\x01\x01") == "abc.def.ghi"
    assert bearer_token(b"n,a=svc,\x01host=h\x01auth=bearer t\x01port=9\x01\x01") == "t"
    for bad in (b"", b"n,,auth=Bearer t", b"n,,\x01auth=Basic t\x01\x01",
                b"n,,\x01host=h\x01\x01", b"x,,\x01auth=Bearer t\x01\x01", b"n,,\x01\xff\x01\x01"):
        with pytest.raises(InvalidToken):
            bearer_token(bad)


def keyset(key, kid="e1") -> Jwks:
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
    jwks = Jwks("file:///unused")
    jwks.set(json.dumps({"keys": [{**jwk, "kid": kid}]}).encode())
    return jwks


def test_an_ec_signed_token_yields_its_subject_and_claims_are_checked():
    key = ec.generate_private_key(ec.SECP256R1())
    jwks = keyset(key)
    now = int(time.time())

    def signed(**claims):
        body = {"sub": "svc", "exp": now + 60, **claims}
        return jwt.encode({k: v for k, v in body.items() if v is not None}, key,
                          algorithm="ES256", headers={"kid": "e1"})

    assert validate(signed(), jwks, (), "") == ("svc", now + 60)
    assert validate(signed(exp=now - 20), jwks, (), "")[0] == "svc"  # within the clock skew
    for bad in (signed(exp=now - 40), signed(sub=None), signed(exp=None),
                signed(nbf=now + 120), signed(aud="x")):
        with pytest.raises(InvalidToken):
            validate(bad, jwks, ("kmq",), "")
    with pytest.raises(InvalidToken):
        validate(signed(iss="a"), jwks, (), "b")
    with pytest.raises(InvalidToken):
        validate("not-a-jwt", jwks, (), "")


def test_a_key_set_without_usable_keys_is_refused_and_an_empty_one_refuses_tokens():
    with pytest.raises(ValueError):
        Jwks("file:///x").set(b'{"keys": []}')
    with pytest.raises(ValueError):
        Jwks("file:///x").set(b"not json")
    with pytest.raises(InvalidToken, match="not been fetched"):
        Jwks("https://idp.test/jwks").key_for("k1")


def _unsecured(claims: dict, header: dict | None = None, signature: str = "") -> str:
    import base64

    def part(d: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()

    return f"{part(header or {'alg': 'none'})}.{part(claims)}.{signature}"


def test_unsecured_tokens_are_checked_as_kafkas_default_validator_checks_them():
    from kmqkafka.net.oauthbearer import validate_unsecured

    now = 1_000_000.0
    good = _unsecured({"sub": "alice", "iat": now - 10, "exp": now + 60})
    assert validate_unsecured(good, now) == ("alice", now + 60)
    assert validate_unsecured(_unsecured({"sub": "bob", "exp": now + 1}), now)[0] == "bob"
    for token, why in [
        (_unsecured({"sub": "a", "exp": now}), "on or after the Expiration Time"),
        (_unsecured({"sub": "a"}), "No expiration time"),
        (_unsecured({"exp": now + 60}), "No principal name"),
        (_unsecured({"sub": "a", "exp": now + 60}, {"alg": "RS256"}), "'none'"),
        (_unsecured({"sub": "a", "exp": now + 60}, signature="c2ln"), "digital signature"),
        (_unsecured({"sub": "a", "iat": now + 5, "exp": now + 60}), "in the future"),
        (_unsecured({"sub": "a", "iat": now - 5, "exp": now - 10}), "Expiration Time"),
        ("a.b", "3 dot-separated"),
        ("a..b", "'..'"),
        ("!!!.e30.", "malformed"),
    ]:
        with pytest.raises(InvalidToken) as info:
            validate_unsecured(token, now)
        assert why in str(info.value), (token, str(info.value))
