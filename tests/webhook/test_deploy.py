"""deploy/kubernetes/webhook: both ways of getting a certificate, rendered with ``kubectl kustomize`` (the
self-signed one after ``ci-sizer webhook certs`` wrote its files), validated strictly against the
Kubernetes schema (``kubernetes-validate``), the MutatingWebhookConfiguration's every field against the
official client's ``V1MutatingWebhookConfiguration``, cert-manager's and the Prometheus Operator's
resources against their CRD models, and held to what the issue asks: fail open, scope, certificates."""

from __future__ import annotations

import base64
import copy
import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography import x509

from service.quantity import parse_cpu_millicores, parse_memory_bytes

from ..test_deploy import KUBE, _by_key, _unknown_fields, _validate_crd
from . import pods
from .conftest import make_certs

WEBHOOK = KUBE / "webhook"
KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")


def kustomize(directory: Path) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    out = subprocess.run([KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    """The self-signed overlay as an operator gets it: the tree copied, the command's files written in."""
    root = tmp_path_factory.mktemp("deploy") / "webhook"
    shutil.copytree(WEBHOOK, root, ignore=shutil.ignore_patterns("tls.*", "ca.*"))
    make_certs(root / "self-signed")
    return kustomize(root / "self-signed"), root / "self-signed"


@pytest.fixture(scope="module")
def cert_manager() -> list[dict[str, Any]]:
    return kustomize(WEBHOOK / "cert-manager")


CRDS = {"Certificate", "Issuer", "ServiceMonitor"}


def _validate_cert_manager(doc: dict[str, Any]) -> None:
    from cloudcoil.models.cert_manager import v1

    model = getattr(v1, doc["kind"]).model_validate(doc)
    dumped = yaml.safe_load(model.model_dump_json(by_alias=True, exclude_none=True))
    assert not _unknown_fields(doc, dumped), _unknown_fields(doc, dumped)


def test_the_command_writes_no_secret_into_the_repository() -> None:
    assert not list((WEBHOOK / "self-signed").glob("tls.*")), "certificates made in the tree"
    ignored = (WEBHOOK / "self-signed" / ".gitignore").read_text().split()
    assert {"tls.crt", "tls.key", "ca.crt", "ca-bundle.yaml"} <= set(ignored)


@pytest.mark.parametrize("overlay", ["self-signed", "cert-manager"])
def test_every_manifest_validates(overlay: str, self_signed: Any, cert_manager: Any) -> None:
    docs = self_signed[0] if overlay == "self-signed" else cert_manager
    version = kubernetes_validate.latest_version()
    kinds = {d["kind"] for d in docs}
    assert kinds >= {"Deployment", "Service", "ServiceAccount", "MutatingWebhookConfiguration", "Secret"}
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":
            _validate_crd(doc)
        elif doc["kind"] in ("Certificate", "Issuer"):
            _validate_cert_manager(doc)
        else:
            kubernetes_validate.validate(doc, version, strict=True)
    if overlay == "cert-manager":
        assert kinds >= {"Certificate", "Issuer"}


def test_the_schema_check_catches_a_misspelt_webhook_field(self_signed: Any) -> None:
    config = _by_key(self_signed[0])[("MutatingWebhookConfiguration", "ci-sizer")]
    bad = copy.deepcopy(config)
    bad["webhooks"][0]["failurPolicy"] = "Ignore"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, kubernetes_validate.latest_version(), strict=True)


def test_the_configuration_against_the_client_s_model(self_signed: Any) -> None:
    config = _by_key(self_signed[0])[("MutatingWebhookConfiguration", "ci-sizer")]
    model = pods.from_dict(config, "V1MutatingWebhookConfiguration")
    assert pods.to_dict(model) == config  # every field known to V1MutatingWebhookConfiguration, none dropped
    (hook,) = model.webhooks
    # fail open: never a pod refused for the webhook's sake, and a short wait
    assert hook.failure_policy == "Ignore"
    assert 1 <= hook.timeout_seconds <= 5
    assert hook.side_effects == "None"  # dry runs are sent, and get the same answer
    assert hook.admission_review_versions == ["v1"]
    (rule,) = hook.rules
    assert (rule.api_groups, rule.api_versions, rule.operations, rule.resources) == ([""], ["v1"], ["CREATE"], ["pods"])
    # scope: labelled namespaces, never the webhook's own, never ci-sizer's own pods, a pod may opt out
    assert hook.namespace_selector.match_labels == {"ci-sizer.io/enabled": "true"}
    service = hook.client_config.service
    own = {(e.key, e.operator, tuple(e.values)) for e in hook.namespace_selector.match_expressions}
    assert own == {("kubernetes.io/metadata.name", "NotIn", (service.namespace,))}
    objects = {(e.key, e.operator, tuple(e.values)) for e in hook.object_selector.match_expressions}
    assert objects == {
        ("ci-sizer.io/enabled", "NotIn", ("false",)),
        ("app.kubernetes.io/part-of", "NotIn", ("ci-sizer",)),
    }
    # the Service it calls is the webhook's, on its https port
    docs = _by_key(self_signed[0])
    svc = docs[("Service", service.name)]
    assert svc["metadata"]["namespace"] == service.namespace
    assert [p["port"] for p in svc["spec"]["ports"]] == [service.port]
    assert service.path == "/mutate"
    deployment = docs[("Deployment", "ci-sizer-webhook")]
    pod = deployment["spec"]["template"]
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    # the webhook's own pods are outside its objectSelector
    assert pod["metadata"]["labels"]["app.kubernetes.io/part-of"] == "ci-sizer"
    # its deadline is under the API server's wait
    (c,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert int(env["CI_SIZER_WEBHOOK_DEADLINE_MS"]) < hook.timeout_seconds * 1000
    assert c["args"] == ["webhook", "serve"]


def test_the_ca_bundle_verifies_the_serving_certificate(self_signed: Any, tmp_path: Path) -> None:
    docs = _by_key(self_signed[0])
    config = docs[("MutatingWebhookConfiguration", "ci-sizer")]
    ca_pem = base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"])
    secret = docs[("Secret", "ci-sizer-webhook-tls")]
    assert secret["type"] == "kubernetes.io/tls"
    cert_pem = base64.b64decode(secret["data"]["tls.crt"])
    assert base64.b64decode(secret["data"]["ca.crt"]) == ca_pem
    cert = x509.load_pem_x509_certificate(cert_pem)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    service = config["webhooks"][0]["clientConfig"]["service"]
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert f"{service['name']}.{service['namespace']}.svc" in names  # what the API server checks
    # the Secret is what the Deployment mounts, where its flags point
    pod = docs[("Deployment", "ci-sizer-webhook")]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == secret["metadata"]["name"]
    # and Python's TLS stack takes the pair (the key matches the certificate)
    (tmp_path / "tls.crt").write_bytes(cert_pem)
    (tmp_path / "tls.key").write_bytes(base64.b64decode(secret["data"]["tls.key"]))
    ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    assert (self_signed[1] / "tls.key").stat().st_mode & 0o077 == 0  # the key file: its owner's only


def test_cert_manager_injects_the_ca_of_the_serving_certificate(cert_manager: Any) -> None:
    docs = _by_key(cert_manager)
    config = docs[("MutatingWebhookConfiguration", "ci-sizer")]
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]
    namespace, _, name = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].partition("/")
    certificate = docs[("Certificate", name)]
    assert certificate["metadata"]["namespace"] == namespace
    service = config["webhooks"][0]["clientConfig"]["service"]
    assert f"{service['name']}.{service['namespace']}.svc" in certificate["spec"]["dnsNames"]
    assert certificate["spec"]["issuerRef"]["name"] in {n for k, n in docs if k == "Issuer"}
    pod = docs[("Deployment", "ci-sizer-webhook")]["spec"]["template"]["spec"]
    assert {v["name"]: v for v in pod["volumes"]}["tls"]["secret"]["secretName"] == certificate["spec"]["secretName"]


def test_quantities_and_the_restricted_profile(self_signed: Any) -> None:
    deployment = _by_key(self_signed[0])[("Deployment", "ci-sizer-webhook")]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False  # it calls no Kubernetes API
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    res = c["resources"]
    assert parse_cpu_millicores(res["requests"]["cpu"]) <= parse_cpu_millicores(res["limits"]["cpu"])
    assert parse_memory_bytes(res["requests"]["memory"]) <= parse_memory_bytes(res["limits"]["memory"])
    for probe in (c["readinessProbe"], c["livenessProbe"]):
        assert probe["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    secret = _by_key(self_signed[0])[("Secret", "ci-sizer-webhook-token")]
    assert "REPLACE-ME" in secret["stringData"]["token"]  # a placeholder the webhook refuses to start with
