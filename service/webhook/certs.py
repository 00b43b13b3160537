"""A self-signed CA and the webhook's serving certificate, for clusters without cert-manager
(``ci-sizer webhook certs``; needs the ``webhook`` extra: ``pip install 'ci-sizer[webhook]'``).

The API server calls the webhook at ``https://<service>.<namespace>.svc:443/mutate`` and checks the
certificate against the configuration's ``caBundle`` for that name (k8s.io/apiserver
``pkg/util/webhook/authentication.go`` and ``pkg/admission/plugin/webhook/config``: the service's
``<name>.<namespace>.svc``). So the certificate names the service in every form a client may use, and
the ``caBundle`` is the CA's certificate, base64-encoded.

Written to a directory: ``tls.crt``, ``tls.key`` (mode 0600), ``ca.crt`` (the files of a
``kubernetes.io/tls`` Secret, as cert-manager writes them too) and ``ca-bundle.yaml``, a JSON patch that
sets the caBundle of the MutatingWebhookConfiguration (deploy/kubernetes/webhook/self-signed reads all four).
The CA's private key is not kept: a new certificate is a new CA, made by running the command again.
"""

from __future__ import annotations

import base64
import datetime
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: the certificate lasts this long; the webhook logs a warning from 30 days before its end
VALID_DAYS = 5 * 365
WARN_DAYS = 30


class CertsUnavailable(RuntimeError):
    """The ``cryptography`` package is not installed."""


@dataclass(frozen=True)
class Made:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode(self.ca_pem).decode()


def dns_names(service: str, namespace: str) -> list[str]:
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def make(service: str, namespace: str, *, days: int = VALID_DAYS) -> Made:
    """A new CA (ECDSA P-256) and a serving certificate it signed for the service's DNS names."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        raise CertsUnavailable("making certificates needs the webhook extra: pip install 'ci-sizer[webhook]'") from None

    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)  # a node's clock a little behind
    until = now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"ci-sizer webhook CA ({namespace}/{service})")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = dns_names(service, namespace)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[2])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return Made(
        ca_pem=ca.public_bytes(pem),
        cert_pem=cert.public_bytes(pem),
        key_pem=key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )


def ca_bundle_patch(made: Made) -> list[dict[str, Any]]:
    """The JSON patch that gives the MutatingWebhookConfiguration's one webhook this CA."""
    return [{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": made.ca_bundle}]


def write(made: Made, directory: Path) -> list[Path]:
    """The four files (see the module's doc), the key readable by its owner only; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "ca.crt": made.ca_pem,
        "tls.crt": made.cert_pem,
        "tls.key": made.key_pem,
        "ca-bundle.yaml": (
            "# Written by `ci-sizer webhook certs`: the caBundle of the MutatingWebhookConfiguration (a JSON patch).\n"
            + yaml.safe_dump(ca_bundle_patch(made), sort_keys=False)
        ).encode(),
    }
    out = []
    for name, data in files.items():
        path = directory / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if name == "tls.key" else 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if name == "tls.key":
            os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT
        out.append(path)
    return out


def not_after(cert_file: Path) -> datetime.datetime | None:
    """When the certificate in ``cert_file`` ends (None without ``cryptography``, or unreadable)."""
    try:
        from cryptography import x509
    except ImportError:
        return None
    try:
        return x509.load_pem_x509_certificate(cert_file.read_bytes()).not_valid_after_utc
    except (OSError, ValueError):
        return None
