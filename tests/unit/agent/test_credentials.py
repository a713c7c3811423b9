"""mTLS identity: the client pair is loaded lazily, re-loaded only when a file changes, and a
pair that cannot be loaded is a temporary IdentityError (retried), never a crash."""

from __future__ import annotations

import os
import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent.credentials import IdentityError, MtlsIdentity


def self_signed(common_name: str) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(hours=1))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def write_pair(folder: Path, common_name: str) -> tuple[Path, Path]:
    cert, key = self_signed(common_name)
    (folder / "tls.crt").write_bytes(cert)
    (folder / "tls.key").write_bytes(key)
    return folder / "tls.crt", folder / "tls.key"


def identity_for(cert: Path, key: Path) -> MtlsIdentity:
    return MtlsIdentity(context=ssl.create_default_context(), cert_file=cert, key_file=key)


async def test_sends_no_header_and_loads_the_pair_once_until_it_changes(tmp_path: Path) -> None:
    cert, key = write_pair(tmp_path, "rt-1")
    identity = identity_for(cert, key)
    assert await identity.authorization() is None
    assert identity.refresh() is False  # unchanged files: not loaded again
    write_pair(tmp_path, "rt-1-rotated")
    stamp = cert.stat().st_mtime_ns + 1_000_000  # a coarse file system clock must not hide it
    os.utime(cert, ns=(stamp, stamp))
    assert identity.refresh() is True


async def test_missing_files_are_a_temporary_identity_error(tmp_path: Path) -> None:
    identity = identity_for(tmp_path / "tls.crt", tmp_path / "tls.key")
    with pytest.raises(IdentityError):
        await identity.authorization()
    write_pair(tmp_path, "rt-1")  # the mounted secret appears later
    assert await identity.authorization() is None


async def test_a_key_that_does_not_match_is_a_temporary_identity_error(tmp_path: Path) -> None:
    cert, key = write_pair(tmp_path, "rt-1")
    _, other_key = self_signed("someone-else")
    key.write_bytes(other_key)  # caught half-way through a rotation
    identity = identity_for(cert, key)
    with pytest.raises(IdentityError) as caught:
        await identity.authorization()
    assert "PRIVATE KEY" not in str(caught.value)
