"""Certificates and kubeconfigs for the local control plane, made with ``cryptography``.

Three kinds of key material, as envtest has them:

* a **serving CA** that signs kube-apiserver's serving certificate (SAN ``localhost``,
  ``127.0.0.1``); clients trust this CA through ``certificate-authority-data``;
* a **client CA** (kube-apiserver ``--client-ca-file``) that signs one certificate per user:
  CN = user name, one O per group, EKU clientAuth;
* a **service-account signing key** (EC P-256; kube-apiserver signs tokens with it, and the
  controller manager's token controller uses the same file).

Python 3.13+ verifies chains with ``VERIFY_X509_STRICT``: CAs carry a critical
BasicConstraints(ca), KeyUsage keyCertSign/cRLSign/digitalSignature and a SubjectKeyIdentifier,
and every leaf an AuthorityKeyIdentifier and its own SubjectKeyIdentifier.
Keys are ECDSA P-256: quick to make and accepted everywhere in the stack.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: leaf and CA lifetime; a test stack lives minutes, a devstack days
VALIDITY = dt.timedelta(days=365)
_BACKDATE = dt.timedelta(hours=1)  # tolerate small clock skew between processes


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, *,
             ca: bool, issuer_ski: x509.SubjectKeyIdentifier | None = None
             ) -> x509.CertificateBuilder:
    """What every certificate here has: names, key, serial, validity, basic constraints, a key
    usage (a CA signs certificates; a leaf only signs: EC keys never encipher) and the key
    identifiers (``issuer_ski`` None: self-signed)."""
    now = dt.datetime.now(dt.UTC)
    ski = x509.SubjectKeyIdentifier.from_public_key(public_key)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(issuer_ski or ski),
            critical=False,
        )
    )


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, *, secret: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A PEM certificate and its PEM (PKCS#8) private key."""

    cert_pem: bytes
    key_pem: bytes

    def write(self, cert_path: Path, key_path: Path) -> None:
        _write(cert_path, self.cert_pem, secret=False)
        _write(key_path, self.key_pem, secret=True)


class CertificateAuthority:
    """A self-signed CA that issues serving and client certificates."""

    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.cert = cert
        self.key = key

    @classmethod
    def create(cls, common_name: str) -> CertificateAuthority:
        key = _new_key()
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "healer-devstack"),
            ]
        )
        cert = _builder(name, name, key.public_key(), ca=True).sign(key, hashes.SHA256())
        return cls(cert, key)

    @classmethod
    def load(cls, cert_path: Path, key_path: Path) -> CertificateAuthority:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise TypeError(f"{key_path}: expected an EC private key")
        return cls(cert, key)

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return _key_pem(self.key)

    def write(self, cert_path: Path, key_path: Path) -> None:
        KeyPair(self.cert_pem, self.key_pem).write(cert_path, key_path)

    def _issue(
        self,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        sans: Sequence[x509.GeneralName] = (),
    ) -> KeyPair:
        key = _new_key()
        ca_ski = self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        builder = _builder(subject, self.cert.subject, key.public_key(), ca=False,
                           issuer_ski=ca_ski).add_extension(
            x509.ExtendedKeyUsage([usage]), critical=False)
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def issue_server(
        self,
        common_name: str,
        dns_names: Sequence[str] = ("localhost",),
        ip_addresses: Sequence[str] = ("127.0.0.1",),
    ) -> KeyPair:
        """A serving certificate (EKU serverAuth) for the given names and addresses."""
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        return self._issue(subject, ExtendedKeyUsageOID.SERVER_AUTH, sans)

    def issue_client(self, user: str, groups: Sequence[str] = ()) -> KeyPair:
        """A client certificate kube-apiserver maps to ``user`` in ``groups``."""
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, user))
        return self._issue(x509.Name(attrs), ExtendedKeyUsageOID.CLIENT_AUTH)


def service_account_keys() -> KeyPair:
    """An EC P-256 key pair for service-account tokens (ES256), as ``KeyPair(public, private)``.

    The private key is SEC1 (``EC PRIVATE KEY``): kube-apiserver's ``keyutil.PublicKeysFromFile``
    does not read a PKCS#8 EC key, so the public half is written separately for
    ``--service-account-key-file``.
    """
    key = _new_key()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return KeyPair(cert_pem=public, key_pem=private)


def kubeconfig(
    *,
    server: str,
    ca_pem: bytes,
    client: KeyPair,
    cluster: str = "healer-devstack",
    user: str = "admin",
) -> dict[str, object]:
    """A v1 kubeconfig with one cluster, user and context; all key material embedded."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    context = f"{user}@{cluster}"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [
            {
                "name": cluster,
                "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(client.cert_pem),
                    "client-key-data": b64(client.key_pem),
                },
            }
        ],
        "contexts": [{"name": context, "context": {"cluster": cluster, "user": user}}],
        "current-context": context,
    }


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    ca_pem: bytes,
    client: KeyPair,
    cluster: str = "healer-devstack",
    user: str = "admin",
) -> Path:
    """Write :func:`kubeconfig` to ``path`` (mode 0600) and return the path."""
    doc = kubeconfig(server=server, ca_pem=ca_pem, client=client, cluster=cluster, user=user)
    _write(path, yaml.safe_dump(doc, sort_keys=False).encode(), secret=True)
    return path


@dataclass(frozen=True, slots=True)
class PKI:
    """The files kube-apiserver and the controllers read, under one directory."""

    dir: Path

    @property
    def serving_ca_crt(self) -> Path:
        return self.dir / "serving-ca.crt"

    @property
    def serving_ca_key(self) -> Path:
        return self.dir / "serving-ca.key"

    @property
    def apiserver_crt(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def client_ca_crt(self) -> Path:
        return self.dir / "client-ca.crt"

    @property
    def client_ca_key(self) -> Path:
        return self.dir / "client-ca.key"

    @property
    def sa_key(self) -> Path:
        """The service-account signing key (private)."""
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        """The service-account verification key (public)."""
        return self.dir / "sa.pub"

    def exists(self) -> bool:
        files = (self.serving_ca_crt, self.serving_ca_key, self.apiserver_crt,
                 self.apiserver_key, self.client_ca_crt, self.client_ca_key, self.sa_key,
                 self.sa_pub)
        return all(p.is_file() for p in files)

    def generate(self) -> PKI:
        """Create every file (overwriting); returns self."""
        self.dir.mkdir(parents=True, exist_ok=True)
        serving = CertificateAuthority.create("healer-devstack-serving-ca")
        serving.write(self.serving_ca_crt, self.serving_ca_key)
        serving.issue_server("kube-apiserver").write(self.apiserver_crt, self.apiserver_key)
        CertificateAuthority.create("healer-devstack-client-ca").write(
            self.client_ca_crt, self.client_ca_key
        )
        service_account_keys().write(self.sa_pub, self.sa_key)
        return self

    def client_ca(self) -> CertificateAuthority:
        return CertificateAuthority.load(self.client_ca_crt, self.client_ca_key)

    def user_kubeconfig(
        self, path: Path, *, server: str, user: str, groups: Sequence[str] = ()
    ) -> Path:
        """Issue a client certificate for ``user``/``groups`` and write a kubeconfig for it."""
        client = self.client_ca().issue_client(user, groups)
        return write_kubeconfig(
            path, server=server, ca_pem=self.serving_ca_crt.read_bytes(), client=client, user=user
        )
