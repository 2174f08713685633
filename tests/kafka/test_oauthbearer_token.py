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
