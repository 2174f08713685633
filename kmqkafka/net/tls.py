"""TLS for the Kafka listener: a pyOpenSSL context factory from the server's PEM files.

The certificate settings are the server's global ones (``KMQKAFKA_TLS_CERT``/``_KEY``/``_CA``);
there is no Kafka-specific certificate. With a CA bundle, client certificates are requested and
verified when presented (they are not required) on the Kafka listener; the Raft port asks
``server_context`` to require them, since a peer there must always prove who it is.
"""
from __future__ import annotations

from pathlib import Path

from twisted.internet import ssl

from kmqkafka.config import ConfigError


def _read(path: Path, setting: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise ConfigError(f"invalid setting {setting}: cannot read {str(path)!r}: {e.strerror}") from None


def server_context(cert: Path, key: Path, ca: Path | None = None,
                   require_client_cert: bool = False) -> ssl.CertificateOptions:
    """Build the TLS server context; raises ``ConfigError`` (one line) for unreadable/bad PEM.

    With ``ca``, client certificates are verified against it; ``require_client_cert`` also
    refuses clients that present none (the Raft port)."""
    cert_pem = _read(cert, "KMQKAFKA_TLS_CERT")
    key_pem = cert_pem if key == cert else _read(key, "KMQKAFKA_TLS_KEY")
    if b"ENCRYPTED" in key_pem:  # OpenSSL would ask for the pass phrase on the terminal
        raise ConfigError(f"invalid setting KMQKAFKA_TLS_KEY: the private key in {str(key)!r} "
                          "is encrypted; give it unencrypted (there is no pass phrase setting)")
    try:
        private = ssl.PrivateCertificate.loadPEM(cert_pem + b"\n" + key_pem)
    except Exception as e:  # pyOpenSSL raises several unrelated types for bad PEM
        raise ConfigError(
            f"invalid setting KMQKAFKA_TLS_CERT/KMQKAFKA_TLS_KEY: cannot load certificate and key "
            f"from {str(cert)!r}/{str(key)!r}: {type(e).__name__}"
        ) from None
    if private.original.has_expired():  # every client (and Raft peer) would refuse it
        not_after = (private.original.get_notAfter() or b"?").decode()
        raise ConfigError(f"invalid setting KMQKAFKA_TLS_CERT: the certificate in {str(cert)!r} "
                          f"expired ({not_after})")
    # Intermediate certificates after the leaf in the cert file are sent as the chain.
    blocks = cert_pem.split(b"-----BEGIN CERTIFICATE-----")[2:]
    try:
        chain = [ssl.Certificate.loadPEM(b"-----BEGIN CERTIFICATE-----" + b).original for b in blocks]
    except Exception as e:
        raise ConfigError(
            f"invalid setting KMQKAFKA_TLS_CERT: bad certificate chain in {str(cert)!r}: "
            f"{type(e).__name__}"
        ) from None
    kwargs: dict[str, object] = {}
    if ca is not None:
        ca_pem = _read(ca, "KMQKAFKA_TLS_CA")
        try:
            authorities = [
                ssl.Certificate.loadPEM(b"-----BEGIN CERTIFICATE-----" + block).original
                for block in ca_pem.split(b"-----BEGIN CERTIFICATE-----")[1:]
            ]
        except Exception as e:
            raise ConfigError(
                f"invalid setting KMQKAFKA_TLS_CA: cannot load {str(ca)!r}: {type(e).__name__}"
            ) from None
        if not authorities:  # CertificateOptions would raise a bare ValueError (a traceback)
            raise ConfigError(
                f"invalid setting KMQKAFKA_TLS_CA: no PEM certificate in {str(ca)!r}"
            )
        kwargs.update(caCerts=authorities, verify=True, requireCertificate=require_client_cert)
    options = ssl.CertificateOptions(
        privateKey=private.privateKey.original,
        certificate=private.original,
        extraCertChain=chain,
        raiseMinimumTo=ssl.TLSVersion.TLSv1_2,
        **kwargs,
    )
    return options


__all__ = ["server_context"]


def certificate_principal(transport: object) -> str | None:
    """``User:<distinguished name>`` of the client certificate a TLS connection presented
    (RFC 4514 form, most specific part first, as Kafka's default SSL principal builder
    writes it: ``User:CN=app,O=acme,C=US``); None without one."""
    get = getattr(transport, "getPeerCertificate", None)
    cert = get() if get is not None else None
    if cert is None:
        return None
    return "User:" + cert.to_cryptography().subject.rfc4514_string()
