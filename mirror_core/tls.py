"""A throw-away certificate authority for the secured local clusters (``local up --secure``).

Generated with the ``cryptography`` library: one CA, one certificate per service (brokers,
registries) valid for ``127.0.0.1`` and ``localhost``, and client certificates in the forms the
clients take (PEM with an encrypted key, PKCS#12). Every private key file is written mode 0600.
For local use and tests only: nothing here is meant for a production PKI.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID_DAYS = 30


@dataclass(frozen=True)
class Issued:
    """One issued certificate: its PEM files and the distinguished name brokers see as its principal."""

    cert: Path
    key: Path
    #: certificate chain + private key in one file (what Kafka's PEM key store takes)
    bundle: Path
    principal: str


def write_private(path: Path, data: bytes) -> Path:
    """Write ``data`` readable by this user only (the file is created 0600, never world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # before the data is in it: a file that was there keeps its own mode through O_CREAT
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return path


class LocalCA:
    """A CA kept in ``directory`` (``ca.pem`` is the trust bundle every client needs)."""

    def __init__(self, directory: Path, name: str = "mirrorflow local CA"):
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=_VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.ca_file = directory / "ca.pem"
        self.ca_file.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, *, server: bool = True, key_password: str | None = None) -> Issued:
        """A certificate ``CN=<name>`` for 127.0.0.1/localhost (server and client use), signed by this CA.

        With ``key_password`` the key files are encrypted PKCS#8 (what ``ssl.key.password`` opens)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=_VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        enc: serialization.KeySerializationEncryption = (
            serialization.BestAvailableEncryption(key_password.encode()) if key_password
            else serialization.NoEncryption()
        )
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)
        cert_pem = cert.public_bytes(serialization.Encoding.PEM) + self._cert.public_bytes(serialization.Encoding.PEM)
        cert_file = self.directory / f"{name}-cert.pem"
        cert_file.write_bytes(cert_pem)
        key_file = write_private(self.directory / f"{name}-key.pem", key_pem)
        bundle = write_private(self.directory / f"{name}.pem", key_pem + cert_pem)
        return Issued(cert_file, key_file, bundle, f"CN={name}")

    def pkcs12(self, issued: Issued, password: str, key_password: str | None = None) -> Path:
        """``issued`` as a PKCS#12 key store protected by ``password`` (``.p12``, mode 0600)."""
        key = serialization.load_pem_private_key(issued.key.read_bytes(),
                                                 key_password.encode() if key_password else None)
        certs = x509.load_pem_x509_certificates(issued.cert.read_bytes())
        data = pkcs12.serialize_key_and_certificates(
            issued.principal.encode(), key, certs[0], certs[1:],  # type: ignore[arg-type]
            serialization.BestAvailableEncryption(password.encode()),
        )
        return write_private(issued.cert.with_name(issued.cert.name.replace("-cert.pem", ".p12")), data)
