"""The Kubernetes deployment (deploy/kubernetes), the Dockerfile and docker-compose.yml.

Every manifest of every overlay, rendered, is validated against the Kubernetes schema of the
``kubernetes-validate`` package (offline, strict: an unknown field fails). The schema checks
structure only (``cpu: 1x`` passes), so every quantity is also parsed with the service's own
parser. ServiceMonitor and PrometheusRule are Prometheus Operator CRDs the schema does not know:
they are validated with the pydantic models ``cloudcoil-models-prometheus-operator`` generates
from the operator's CRDs (types and patterns), plus a round trip that fails on any field the model
does not know. The overlays are rendered here (the subset of kustomize they use: resources,
namespace, labels, images, JSON 6902 patches) and, where ``kubectl`` is installed, compared with
``kubectl kustomize``'s output.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from service.auth import TokensFileError, load_tokens
from service.quantity import parse_cpu_millicores, parse_memory_bytes
from service.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
KUBE = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(p.parent for p in (KUBE / "overlays").glob("*/kustomization.yaml"))
TARGETS = [KUBE / "base", *OVERLAYS]
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


# ------------------------------------------------------------------ rendering (kustomize's subset)


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def _json6902(doc: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    for op in ops:
        *parents, last = _pointer(op["path"])
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        key: Any = int(last) if isinstance(node, list) and last != "-" else last
        if op["op"] == "replace":
            node[key]  # must exist
            node[key] = op["value"]
        elif op["op"] == "add":
            if isinstance(node, list):
                node.insert(len(node) if key == "-" else key, op["value"])
            else:
                node[key] = op["value"]
        elif op["op"] == "remove":
            del node[key]
        else:
            raise AssertionError(f"op {op['op']} not supported by this renderer")


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    if doc["kind"] in ("Deployment", "Job"):
        spec: dict[str, Any] = doc["spec"]["template"]["spec"]
        return spec
    return None


def render(directory: Path) -> list[dict[str, Any]]:
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    allowed = {"apiVersion", "kind", "resources", "namespace", "labels", "images", "patches"}
    assert set(k) <= allowed, set(k) - allowed  # anything else: teach this renderer first
    docs: list[dict[str, Any]] = []
    for entry in k["resources"]:
        path = directory / entry
        if path.is_dir():
            docs += render(path)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for patch in k.get("patches", []):
        target = patch["target"]
        matched = [d for d in docs if d["kind"] == target["kind"] and d["metadata"]["name"] == target["name"]]
        assert len(matched) == 1, target
        _json6902(matched[0], yaml.safe_load(patch["patch"]))
    for label in k.get("labels", []):
        assert label.get("includeSelectors") is False
        assert not label.get("includeTemplates")
        for d in docs:
            d["metadata"].setdefault("labels", {}).update(label["pairs"])
    for image in k.get("images", []):
        for d in docs:
            pod = _pod_spec(d)
            for c in (pod or {}).get("containers", []) + (pod or {}).get("initContainers", []):
                name, _, _ = c["image"].partition(":")
                if name == image["name"]:
                    ref = image.get("newName", name)
                    c["image"] = ref + (f"@{image['digest']}" if "digest" in image else f":{image['newTag']}")
    if "namespace" in k:
        for d in docs:
            if d["kind"] != "Namespace":
                d["metadata"]["namespace"] = k["namespace"]
    return docs


def _by_key(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    out = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert len(out) == len(docs), "two resources with one kind and name"
    return out


@pytest.fixture(params=TARGETS, ids=[str(p.relative_to(KUBE)) for p in TARGETS])
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(request.param)


@pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl is not installed (the renderer is checked where it is)"
)
@pytest.mark.parametrize("target", TARGETS, ids=[str(p.relative_to(KUBE)) for p in TARGETS])
def test_renderer_agrees_with_kubectl_kustomize(target: Path) -> None:
    out = subprocess.run(["kubectl", "kustomize", str(target)], capture_output=True, text=True, check=True).stdout
    assert _by_key(render(target)) == _by_key([d for d in yaml.safe_load_all(out) if d])


def test_the_renderer_applies_patches() -> None:
    docs = _by_key(render(KUBE / "overlays" / "production"))
    assert docs[("HorizontalPodAutoscaler", "ci-sizer")]["spec"]["minReplicas"] == 3
    assert docs[("Deployment", "ci-sizer")]["metadata"]["namespace"] == "ci-sizer"
    image = docs[("Deployment", "ci-sizer")]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "registry.example.com/ci-sizer:0.1.0"


# ------------------------------------------------------------------ schema validation


def test_every_manifest_validates_against_the_kubernetes_schema(rendered: list[dict[str, Any]]) -> None:
    version = kubernetes_validate.latest_version()
    core = [d for d in rendered if d["kind"] not in CRD_KINDS]
    assert {d["kind"] for d in core} >= {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "Job",
        "Secret",
    }
    for doc in core:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_catches_mistakes() -> None:
    version = kubernetes_validate.latest_version()
    deployment = _by_key(render(KUBE / "base"))[("Deployment", "ci-sizer")]
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pathh"] = "/readyz"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, version, strict=True)
    bad = copy.deepcopy(deployment)
    bad["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, version, strict=True)


def _crd_model(kind: str) -> Any:
    from cloudcoil.models.prometheus_operator import v1

    return getattr(v1, kind)


def _unknown_fields(given: Any, known: Any, where: str = "") -> list[str]:
    """Paths present in ``given`` and missing from the model's dump ``known`` (dropped as unknown)."""
    if isinstance(given, dict):
        if not isinstance(known, dict):
            return [where or "/"]
        out = []
        for key, value in given.items():
            if key not in known:
                out.append(f"{where}/{key}")
            else:
                out += _unknown_fields(value, known[key], f"{where}/{key}")
        return out
    if isinstance(given, list):
        return [
            p for i, (g, k) in enumerate(zip(given, known, strict=True)) for p in _unknown_fields(g, k, f"{where}/{i}")
        ]
    return []


def _validate_crd(doc: dict[str, Any]) -> None:
    model = _crd_model(doc["kind"]).model_validate(doc)
    dumped = json.loads(model.model_dump_json(by_alias=True, exclude_none=True))
    assert not _unknown_fields(doc, dumped), _unknown_fields(doc, dumped)


def test_crds_validate_against_the_operator_s_models(rendered: list[dict[str, Any]]) -> None:
    crds = [d for d in rendered if d["kind"] in CRD_KINDS]
    assert {d["kind"] for d in crds} == CRD_KINDS
    for doc in crds:
        assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        _validate_crd(doc)


def test_the_crd_check_catches_mistakes() -> None:
    monitor = _by_key(render(KUBE / "base"))[("ServiceMonitor", "ci-sizer")]
    bad = copy.deepcopy(monitor)
    bad["spec"]["endpoints"][0]["interval"] = "fifteen seconds"
    with pytest.raises(ValueError, match="interval"):
        _validate_crd(bad)
    bad = copy.deepcopy(monitor)
    bad["spec"]["endpoints"][0]["scrapeTimeOut"] = "10s"  # misspelt: silently ignored by a lax check
    with pytest.raises(AssertionError, match="scrapeTimeOut"):
        _validate_crd(bad)


def _quantities(doc: Any, where: str = "") -> list[tuple[str, str, Any]]:
    """(path, kind, value) of every CPU/memory quantity: container resources and emptyDir sizes."""
    out: list[tuple[str, str, Any]] = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            path = f"{where}/{key}"
            if key in ("requests", "limits") and isinstance(value, dict):
                out += [(f"{path}/{r}", r, q) for r, q in value.items()]
            elif key == "sizeLimit":
                out.append((path, "memory", value))
            else:
                out += _quantities(value, path)
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            out += _quantities(value, f"{where}/{i}")
    return out


def test_every_quantity_parses_with_the_service_s_parser(rendered: list[dict[str, Any]]) -> None:
    found = 0
    for doc in rendered:
        for path, kind, value in _quantities(doc):
            found += 1
            assert isinstance(value, str), (path, value)  # 1 and "1" differ to a YAML reader, not to k8s
            amount = parse_cpu_millicores(value) if kind == "cpu" else parse_memory_bytes(value)
            assert amount > 0, (path, value)
    assert found >= 8


def test_requests_fit_under_limits(rendered: list[dict[str, Any]]) -> None:
    for doc in rendered:
        pod = _pod_spec(doc)
        for c in (pod or {}).get("containers", []):
            res = c["resources"]
            assert {"cpu", "memory"} <= set(res["requests"]), c["name"]
            assert "memory" in res["limits"], c["name"]
            for kind, parse in (("cpu", parse_cpu_millicores), ("memory", parse_memory_bytes)):
                if kind in res["limits"]:
                    assert parse(res["requests"][kind]) <= parse(res["limits"][kind]), (doc["kind"], kind)


# ------------------------------------------------------------------ what the deployment must hold


def test_deployment_shape(rendered: list[dict[str, Any]]) -> None:
    docs = _by_key(rendered)
    deployment = docs[("Deployment", "ci-sizer")]
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (container,) = pod["spec"]["containers"]
    assert container["args"] == ["serve"]
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["http"]
    # probes: ready when the database answers, alive while the process answers
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    # non-root, verifiably: the pod names the image's numeric USER
    security = pod["spec"]["securityContext"]
    assert security["runAsNonRoot"] is True
    assert f"USER {security['runAsUser']}:{security['runAsGroup']}" in _dockerfile_users()
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    # the settings the pods get are ones the service knows
    config = docs[("ConfigMap", "ci-sizer")]["data"]
    fields = {f"CI_SIZER_{name.upper()}" for name in Settings.model_fields}
    names = set(config) | {e["name"] for e in container["env"]}
    assert names <= fields, names - fields
    assert config["CI_SIZER_PORT"] == str(port)
    assert "CI_SIZER_DATABASE_URL" in {e["name"] for e in container["env"]}
    # tokens: the Secret is mounted where CI_SIZER_TOKENS_FILE points
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    secret = docs[("Secret", volumes["tokens"]["secret"]["secretName"])]
    (key,) = secret["stringData"]
    assert config["CI_SIZER_TOKENS_FILE"] == f"{mounts['tokens']}/{key}"
    assert "/tmp" in mounts.values()  # the only writable place with a read-only root


def test_service_monitor_pdb_and_hpa_select_the_replicas(rendered: list[dict[str, Any]]) -> None:
    docs = _by_key(rendered)
    deployment = docs[("Deployment", "ci-sizer")]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = docs[("Service", "ci-sizer")]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    monitor = docs[("ServiceMonitor", "ci-sizer")]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [p["name"] for p in service["spec"]["ports"]]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    pdb = docs[("PodDisruptionBudget", "ci-sizer")]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    hpa = docs[("HorizontalPodAutoscaler", "ci-sizer")]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "ci-sizer"}
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    # a drain can always evict one pod: more replicas than the budget keeps
    assert hpa["spec"]["minReplicas"] > pdb["spec"]["minAvailable"]
    assert deployment["spec"]["replicas"] >= hpa["spec"]["minReplicas"]


def test_migration_job(rendered: list[dict[str, Any]]) -> None:
    docs = _by_key(rendered)
    job = docs[("Job", "ci-sizer-migrate")]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    deployment = docs[("Deployment", "ci-sizer")]
    assert container["args"] == ["migrate"]
    assert container["image"] == deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    url = next(e for e in container["env"] if e["name"] == "CI_SIZER_DATABASE_URL")
    assert url["valueFrom"]["secretKeyRef"]["name"] == "ci-sizer-database"


def test_secrets_are_placeholders_that_refuse_to_serve(tmp_path: Path) -> None:
    for path in (KUBE / "base").glob("secret-*.yaml"):
        text = path.read_text()
        assert "PLACEHOLDER" in text
        assert "REPLACE-ME" in text
        assert not re.search(r"\b[0-9a-f]{64}\b", text)  # no token hash
        assert "cis_" not in text  # no token secret
    secret = yaml.safe_load((KUBE / "base" / "secret-tokens.yaml").read_text())
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(secret["stringData"]["tokens.toml"])
    with pytest.raises(TokensFileError, match="sha256"):
        load_tokens(tokens)  # a forgotten placeholder stops the service at start, with its reason


def test_the_prometheusrule_is_generated_from_the_rules_file() -> None:
    rule = yaml.safe_load((KUBE / "base" / "prometheusrule.yaml").read_text())
    assert rule["spec"]["groups"] == yaml.safe_load((ROOT / "prometheus/rules/ci-sizer.yml").read_text())["groups"]


# ------------------------------------------------------------------ Dockerfile and compose


def _dockerfile_users() -> list[str]:
    return [line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("USER ")]


def test_dockerfile_user_is_numeric() -> None:
    # kubelet's verifyRunAsNonRoot (kubernetes/kubernetes pkg/kubelet/kuberuntime/security_context_others.go)
    # refuses runAsNonRoot for an image whose user is a name: "image has non-numeric user"
    users = _dockerfile_users()
    assert users, "no USER"
    assert re.fullmatch(r"USER [1-9][0-9]*(:[1-9][0-9]*)?", users[-1]), users[-1]


def test_dockerfile_base_images_are_pinned_or_say_how() -> None:
    text = (ROOT / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    assert froms
    for image in froms:
        var = re.fullmatch(r"\$\{(\w+)\}", image)
        ref = args[var.group(1)] if var else image
        if "@sha256:" in ref:
            assert re.search(r"@sha256:[0-9a-f]{64}$", ref), ref
        else:
            # not pinned yet: the file must say how, and take the pin as a build argument
            assert var is not None, image
            assert "imagetools inspect" in text
            assert f"--build-arg {var.group(1)}=" in text


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def test_compose_comments_match_what_it_runs() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    comments = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    compose = _compose()
    services = compose["services"]
    published = {p.split(":")[0] for s in services.values() for p in s.get("ports", [])}
    for port in re.findall(r"localhost:(\d+)", comments):
        assert port in published, port
    assert ("--allow-anonymous" in comments) == ("--allow-anonymous" in services["ci-sizer"]["command"])
    mounted_tokens = "CI_SIZER_TOKENS_FILE" in services["ci-sizer"].get("environment", {})
    assert ("No tokens file is mounted" in comments) == (not mounted_tokens)
    assert "alerting rules" in comments
    assert any("prometheus/rules" in v for v in services["prometheus"]["volumes"])
