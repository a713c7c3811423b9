"""An in-memory certificate authority that checks and signs runtime CSRs.

The CA key and certificate live only in memory and are created on first use. A CSR
is accepted only if its signature is valid and its subject matches the expected
one field by field (CN, C, O, OU, L, ST, in Connector's order of checks); the
client certificate gets the CSR's subject (in the order Go writes a name: C, ST, L,
O, OU, CN), client-auth usage and the configured validity. As Connector's RSA CA, it
cannot sign a CSR of another key type. All outputs are PEM bytes; callers
base64-encode them for GraphQL.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from devenv import pki

from .config import CsrSubject

__all__ = [
    "KEY_TYPE_MISMATCH",
    "CertificateAuthority",
    "CsrRejectedError",
    "go_ordered",
    "load_csr",
    "subject_problem",
]


class CsrRejectedError(Exception):
    """The CSR cannot be parsed, is not self-consistent, or has the wrong subject."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind  # "BadRequest" or "WrongInput", as Connector names them
        super().__init__(message)


def load_csr(pem: bytes) -> x509.CertificateSigningRequest:
    if b"-----BEGIN" not in pem:
        raise CsrRejectedError("BadRequest", "Error while decoding pem block.")
    try:
        csr = x509.load_pem_x509_csr(pem)
    except ValueError as exc:
        raise CsrRejectedError("BadRequest", f"Error while parsing CSR: {exc}") from exc
    if not csr.is_signature_valid:
        raise CsrRejectedError("BadRequest", "CSR signature invalid")
    return csr


# Go's order of a name's attributes (crypto/x509/pkix.Name.ToRDNSequence), which Connector's
# certificate gets: it copies the CSR's parsed subject.
_GO_NAME_ORDER = (
    NameOID.COUNTRY_NAME,
    NameOID.STATE_OR_PROVINCE_NAME,
    NameOID.LOCALITY_NAME,
    NameOID.STREET_ADDRESS,
    NameOID.POSTAL_CODE,
    NameOID.ORGANIZATION_NAME,
    NameOID.ORGANIZATIONAL_UNIT_NAME,
    NameOID.COMMON_NAME,
)
# Connector signs with its CA's RSA key and the CSR's signature algorithm: Go refuses a
# CSR of any other key type with this.
KEY_TYPE_MISMATCH = (
    "Error while creating certificate: x509: requested SignatureAlgorithm does not match "
    "private key type"
)


def go_ordered(name: x509.Name) -> x509.Name:
    """`name` with its attributes in Go's order (the ones Go does not know at the end)."""
    known = [a for oid in _GO_NAME_ORDER for a in name.get_attributes_for_oid(oid)]
    rest = [a for a in name if a.oid not in _GO_NAME_ORDER]
    return x509.Name(known + rest)


_CHECKS = (
    (NameOID.COMMON_NAME, "common name"),
    (NameOID.COUNTRY_NAME, "country"),
    (NameOID.ORGANIZATION_NAME, "organization"),
    (NameOID.ORGANIZATIONAL_UNIT_NAME, "organizational unit"),
    (NameOID.LOCALITY_NAME, "locality"),
    (NameOID.STATE_OR_PROVINCE_NAME, "province"),
)


def subject_problem(
    csr: x509.CertificateSigningRequest, expected: CsrSubject, common_name: str
) -> str | None:
    """Connector's wording of the first subject field that differs, or None."""
    wanted = {
        NameOID.COMMON_NAME: common_name,
        NameOID.COUNTRY_NAME: expected.country,
        NameOID.ORGANIZATION_NAME: expected.organization,
        NameOID.ORGANIZATIONAL_UNIT_NAME: expected.organizational_unit,
        NameOID.LOCALITY_NAME: expected.locality,
        NameOID.STATE_OR_PROVINCE_NAME: expected.province,
    }
    for oid, label in _CHECKS:
        values = csr.subject.get_attributes_for_oid(oid)
        if not values:
            if oid == NameOID.COMMON_NAME:
                return "CSR: Invalid common name provided."
            return f"CSR: No {label} provided."
        if values[0].value != wanted[oid]:
            return f"CSR: Invalid {label} provided."
    return None


class CertificateAuthority:
    def __init__(self, *, clock: Callable[[], float], validity_seconds: float) -> None:
        self._clock = clock
        self._validity = timedelta(seconds=validity_seconds)
        self._lock = threading.Lock()
        self._key: rsa.RSAPrivateKey | None = None
        self._cert: x509.Certificate | None = None

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._clock(), UTC)

    def _ensure(self) -> tuple[rsa.RSAPrivateKey, x509.Certificate]:
        with self._lock:
            if self._key is None or self._cert is None:
                key = pki.new_rsa_key()
                self._cert = pki.new_ca(
                    "compass-sim CA", key=key, now=self._now(), validity=timedelta(days=3650)
                ).cert
                self._key = key
            return self._key, self._cert

    @property
    def certificate_pem(self) -> bytes:
        return self._ensure()[1].public_bytes(serialization.Encoding.PEM)

    def sign(self, csr: x509.CertificateSigningRequest) -> bytes:
        """The client certificate for the CSR, as PEM; CsrRejectedError for a key that is no
        RSA key."""
        if not isinstance(csr.public_key(), rsa.RSAPublicKey):
            raise CsrRejectedError("Internal", KEY_TYPE_MISMATCH)
        key, ca_cert = self._ensure()
        now = self._now()
        certificate = (
            x509.CertificateBuilder()
            .subject_name(go_ordered(csr.subject))
            .issuer_name(ca_cert.subject)
            .public_key(csr.public_key())
            # 159 random bits: positive and at most 20 bytes, as RFC 5280 requires.
            .serial_number(secrets.randbits(159) | 1)
            .not_valid_before(now)
            .not_valid_after(now + self._validity)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(key, hashes.SHA256())
        )
        return certificate.public_bytes(serialization.Encoding.PEM)
