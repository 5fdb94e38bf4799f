"""The Helm chart in deploy/helm/nvcf-mono, rendered by the platform's own renderer (helm-python-sdk).

Every rendered object is checked against the Kubernetes API schemas (kubernetes-validate, strict: no
field Kubernetes does not know), and every node's nvcf-mono configuration is loaded by the platform's
own config loader, so a chart that writes a config the platform would refuse fails here.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from nvcf_mono.auth.secret import PlatformSecret
from nvcf_mono.config.load import ConfigError, ConfigSources, ResolvedConfig, load_config
from nvcf_mono.helm import HelmRenderError, RenderedChart, RenderRequest, render_chart
from nvcf_mono.planes.invocation.llm.gateway import FORWARDED

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "nvcf-mono"
KUBERNETES = kubernetes_validate.latest_version()
RELEASE, NAMESPACE = "nvcf", "nvcf-system"
FULLNAME = "nvcf-nvcf-mono"

SPLIT = {
    "layout": "split",
    "control": {"replicas": 2},
    "invocation": {"replicas": 3},
    "compute": {
        "clusters": [
            {
                "name": "gpu-a",
                "settings": {
                    "cloud_provider": "DGX-CLOUD",
                    "attributes": ["NVLinkOptimized=true"],
                    "kubernetes": {"namespace": "functions", "image_pull_secrets": ["regcred"]},
                },
            }
        ]
    },
    "ingress": {
        "enabled": True,
        "className": "nginx",
        "host": "nvcf.example.com",
        "invocationHost": "*.invocation.nvcf.example.com",
        "tls": [{"secretName": "nvcf-tls", "hosts": ["nvcf.example.com"]}],
        "grpc": {"enabled": True},
    },
}


#: What the API host sends to the invocation nodes: pexec, exec and the LLM gateway's routes.
INVOCATION_PATHS = (
    "/v2/nvcf/pexec",
    "/v2/nvcf/exec",
    *FORWARDED,
    "/v1/models",
    "/v1/health",  # the gateway's probes: ready and live
)


async def _render(values: dict[str, Any] | None = None) -> RenderedChart:
    request = RenderRequest(chart=str(CHART), values=values or {}, release=RELEASE, namespace=NAMESPACE)
    return await render_chart(request, renderer="sdk")


def _schema_errors(objects: tuple[dict[str, Any], ...]) -> list[str]:
    errors = []
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as err:
            path = ".".join(str(p) for p in err.path)
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {path}: {err.message}")
    return errors


def _by_kind(result: RenderedChart, kind: str) -> dict[str, dict[str, Any]]:
    return {obj["metadata"]["name"]: obj for obj in result.objects if obj["kind"] == kind}


def _configs(result: RenderedChart, tmp_path: Path) -> dict[str, ResolvedConfig]:
    """Each ConfigMap's nvcf-mono file, loaded as `nvcf-mono run --config` would load it."""
    loaded = {}
    for name, config_map in _by_kind(result, "ConfigMap").items():
        for key, text in config_map["data"].items():
            path = tmp_path / name / key
            path.parent.mkdir(parents=True)
            path.write_text(text)
            try:
                loaded[f"{name}/{key}"] = load_config(ConfigSources(files=(path,)))
            except ConfigError as err:
                pytest.fail(f"{name}/{key} is not a valid nvcf-mono config:\n{err}")
    return loaded


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _mounted_config(deployment: dict[str, Any], configs: dict[str, ResolvedConfig]) -> ResolvedConfig:
    """The config the pod runs: its --config file, looked up through its ConfigMap volume."""
    container = _container(deployment)
    args = container["args"]
    assert args[:2] == ["run", "--config"]
    mount = next(m for m in container["volumeMounts"] if args[2].startswith(m["mountPath"] + "/"))
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    return configs[f"{volume['configMap']['name']}/{args[2].rsplit('/', 1)[1]}"]


def _mount_path(deployment: dict[str, Any], volume_of: str) -> str:
    """Where the pod mounts the Secret or PersistentVolumeClaim named ``volume_of``."""
    spec = deployment["spec"]["template"]["spec"]
    volume = next(
        v
        for v in spec["volumes"]
        if volume_of in (v.get("secret", {}).get("secretName"), v.get("persistentVolumeClaim", {}).get("claimName"))
    )
    return next(m["mountPath"] for m in _container(deployment)["volumeMounts"] if m["name"] == volume["name"])


def _check_pod(deployment: dict[str, Any], config: ResolvedConfig) -> None:
    """Probes, ports and grace agree with the config the pod runs."""
    spec = deployment["spec"]["template"]["spec"]
    container = _container(deployment)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == config.settings.http.port
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert spec["terminationGracePeriodSeconds"] > config.settings.shutdown.drain_grace
    assert config.settings.http.host == "0.0.0.0"
    assert spec["securityContext"]["runAsNonRoot"] is True


def _check_secret_mount(deployment: dict[str, Any], config: ResolvedConfig, secret_name: str) -> None:
    secret_file = config.plugins["auth"].config.secret_file
    directory = _mount_path(deployment, secret_name)
    assert secret_file.parent == Path(directory)


async def test_the_default_values_install_the_all_in_one_platform(tmp_path: Path) -> None:
    result = await _render()
    assert (result.chart_name, result.chart_version) == ("nvcf-mono", "0.1.0")
    assert _schema_errors(result.objects) == []
    configs = _configs(result, tmp_path)

    deployments = _by_kind(result, "Deployment")
    assert set(deployments) == {f"{FULLNAME}-all-in-one"}
    deployment = deployments[f"{FULLNAME}-all-in-one"]
    assert deployment["spec"]["replicas"] == 1
    assert _container(deployment)["image"] == "nvcf-mono:0.1.0"
    config = _mounted_config(deployment, configs)
    assert config.settings.role == "all-in-one"
    assert {"control", "invocation", "compute", "auth", "helm"} <= set(config.order)
    assert config.settings.bus.url == "nats://nats.nats.svc.cluster.local:4222"
    assert config.settings.bus.stream_replicas == 3
    (local,) = config.plugins["compute"].config.clusters
    assert (local.name, local.backend) == ("local", "local")
    assert local.id  # fixed: an emptyDir keeps no generated id across restarts
    _check_pod(deployment, config)

    (secret,) = _by_kind(result, "Secret").values()
    _check_secret_mount(deployment, config, secret["metadata"]["name"])
    secret_file = tmp_path / "platform-secret"
    secret_file.write_bytes(base64.b64decode(secret["data"]["platform-secret"]))
    assert PlatformSecret.load(secret_file).fingerprint()  # the platform reads what the chart generated

    (service,) = _by_kind(result, "Service").values()
    assert service["metadata"]["name"] == FULLNAME
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "http": config.settings.http.port,
        "grpc": config.settings.grpc.port,
    }
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert not _by_kind(result, "ClusterRole") and not _by_kind(result, "Ingress")


async def test_the_split_layout_with_a_gpu_cluster(tmp_path: Path) -> None:
    result = await _render(SPLIT)
    assert _schema_errors(result.objects) == []
    configs = _configs(result, tmp_path)
    deployments = _by_kind(result, "Deployment")
    assert {name: d["spec"]["replicas"] for name, d in deployments.items()} == {
        f"{FULLNAME}-control": 2,
        f"{FULLNAME}-invocation": 3,
        f"{FULLNAME}-compute-gpu-a": 1,
    }
    roles = {name: _mounted_config(d, configs) for name, d in deployments.items()}
    assert {name: c.settings.role for name, c in roles.items()} == {
        f"{FULLNAME}-control": "control",
        f"{FULLNAME}-invocation": "invocation",
        f"{FULLNAME}-compute-gpu-a": "compute",
    }
    for name, deployment in deployments.items():
        _check_pod(deployment, roles[name])
        assert roles[name].settings.bus.stream_replicas == 3

    # Control and invocation share the platform secret; instances dial the invocation Service.
    (secret,) = _by_kind(result, "Secret").values()
    for role in ("control", "invocation"):
        _check_secret_mount(deployments[f"{FULLNAME}-{role}"], roles[f"{FULLNAME}-{role}"], secret["metadata"]["name"])
    control = roles[f"{FULLNAME}-control"].plugins["control"].config
    assert control.worker_grpc_address == f"{FULLNAME}-invocation.{NAMESPACE}.svc:8081"
    services = _by_kind(result, "Service")
    assert {name: [p["port"] for p in s["spec"]["ports"]] for name, s in services.items()} == {
        f"{FULLNAME}-control": [8080],
        f"{FULLNAME}-invocation": [8080, 8081],
    }
    assert roles[f"{FULLNAME}-control"].settings.http.public_url == "https://nvcf.example.com"
    # Each API node names the other for endpoints.json and its wrong-node 404s: the public URL, which the
    # ingress routes to both.
    control_peers = roles[f"{FULLNAME}-control"].settings.peers
    assert control_peers.invocation_url == "https://nvcf.example.com"
    assert control_peers.invocation_grpc_address == f"{FULLNAME}-invocation.{NAMESPACE}.svc:8081"
    assert roles[f"{FULLNAME}-invocation"].settings.peers.api_url == "https://nvcf.example.com"
    agent_peers = roles[f"{FULLNAME}-compute-gpu-a"].settings.peers
    assert (agent_peers.api_url, agent_peers.invocation_url) == ("https://nvcf.example.com",) * 2

    # The agent: the Kubernetes backend in this cluster, through its service account and ClusterRole.
    agent = deployments[f"{FULLNAME}-compute-gpu-a"]
    (cluster,) = roles[f"{FULLNAME}-compute-gpu-a"].plugins["compute"].config.clusters
    assert (cluster.name, cluster.backend, cluster.cloud_provider) == ("gpu-a", "kubernetes", "DGX-CLOUD")
    assert cluster.attributes == ("NVLinkOptimized=true",)
    assert cluster.kubernetes.kubeconfig is None
    assert cluster.kubernetes.namespace == "functions"
    assert cluster.kubernetes.image_pull_secrets == ("regcred",)
    assert cluster.kubernetes.worker_image == "nvcf-mono:0.1.0"
    assert agent["spec"]["strategy"]["type"] == "Recreate"
    pod = agent["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    (binding,) = _by_kind(result, "ClusterRoleBinding").values()
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE}
    ]
    (role,) = _by_kind(result, "ClusterRole").values()
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    for needed in [
        ("", "nodes", "patch"),
        ("", "pods", "create"),
        ("", "pods", "watch"),
        ("", "pods/log", "get"),
        ("", "secrets", "delete"),
        ("", "namespaces", "create"),
        ("nvca.nvcf.nvidia.io", "icmsrequests", "create"),
        ("nvca.nvcf.nvidia.io", "icmsrequests/status", "patch"),
        ("nvca.nvcf.nvidia.io", "miniservices/status", "patch"),
        # Helm functions: the chart's objects, in a namespace of their own.
        ("", "namespaces", "delete"),
        ("apps", "deployments", "create"),
        ("apps", "statefulsets", "patch"),
        ("batch", "jobs", "get"),
        ("", "services", "delete"),
    ]:
        assert needed in granted, needed
    control_pod = deployments[f"{FULLNAME}-control"]["spec"]["template"]["spec"]
    assert control_pod["automountServiceAccountToken"] is False

    # The API host sends invocation to the invocation nodes, the rest to control; Host routing too.
    ingresses = _by_kind(result, "Ingress")
    rules = ingresses[FULLNAME]["spec"]["rules"]
    paths = {p["path"]: p["backend"]["service"]["name"] for p in rules[0]["http"]["paths"]}
    assert paths == {
        **{path: f"{FULLNAME}-invocation" for path in INVOCATION_PATHS},
        "/": f"{FULLNAME}-control",
    }
    assert rules[1]["host"] == "*.invocation.nvcf.example.com"
    grpc = ingresses[f"{FULLNAME}-grpc"]["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert grpc == {"name": f"{FULLNAME}-invocation", "port": {"number": 8081}}
    assert set(_by_kind(result, "PodDisruptionBudget")) == {f"{FULLNAME}-control", f"{FULLNAME}-invocation"}


async def test_a_remote_cluster_gets_its_kubeconfig_and_no_service_account_token(tmp_path: Path) -> None:
    values = {"compute": {"clusters": [{"name": "remote_b", "kubeconfigSecret": "remote-b", "kubeconfigKey": "kc"}]}}
    result = await _render(values)
    assert _schema_errors(result.objects) == []
    configs = _configs(result, tmp_path)
    agent = _by_kind(result, "Deployment")[f"{FULLNAME}-compute-remote-b"]
    (cluster,) = _mounted_config(agent, configs).plugins["compute"].config.clusters
    assert cluster.name == "remote_b"
    assert cluster.kubernetes.kubeconfig == Path(_mount_path(agent, "remote-b")) / "kc"
    assert agent["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    # With agents of their own, the all-in-one node runs no local cluster (and no example function).
    main = _mounted_config(_by_kind(result, "Deployment")[f"{FULLNAME}-all-in-one"], configs)
    assert "compute" not in main.order
    assert main.plugins["control"].config.example_function is False
    assert main.plugins["control"].config.worker_grpc_address == f"{FULLNAME}.{NAMESPACE}.svc:8081"


async def test_config_values_merge_into_every_file_and_false_wins(tmp_path: Path) -> None:
    values = {
        "config": {"node": {"region": "eu-west"}, "plugins": {"invocation": {"transport": "nats"}}},
        "allInOne": {"config": {"plugins": {"control": {"example_function": False}}, "shutdown": {"drain_grace": 0}}},
        "shutdown": {"drainGrace": 20, "pluginGrace": 3},
    }
    result = await _render(values)
    (config,) = _configs(result, tmp_path).values()
    assert config.settings.node.region == "eu-west"
    assert config.plugins["invocation"].config.transport == "nats"
    assert config.plugins["control"].config.example_function is False
    assert config.settings.shutdown.drain_grace == 0
    (deployment,) = _by_kind(result, "Deployment").values()
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 38


async def test_embedded_nats_with_a_persistent_state_volume(tmp_path: Path) -> None:
    result = await _render({"nats": {"embedded": True}, "allInOne": {"persistence": {"enabled": True, "size": "5Gi"}}})
    assert _schema_errors(result.objects) == []
    (config,) = _configs(result, tmp_path).values()
    assert config.settings.bus.url is None  # the host starts its own nats-server
    assert config.settings.bus.stream_replicas == 1
    (claim,) = _by_kind(result, "PersistentVolumeClaim").values()
    (deployment,) = _by_kind(result, "Deployment").values()
    state = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "state")
    assert state == {"name": "state", "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]}}
    assert str(config.settings.state_dir).startswith(_mount_path(deployment, claim["metadata"]["name"]))


async def test_gateway_api_routes(tmp_path: Path) -> None:
    values = {
        "layout": "split",
        "httpRoute": {
            "enabled": True,
            "parentRefs": [{"name": "gateway", "namespace": "gateway-system"}],
            "hostnames": ["nvcf.example.com"],
            "invocationHostnames": ["*.invocation.nvcf.example.com"],
        },
    }
    result = await _render(values)
    routes = _by_kind(result, "HTTPRoute")
    # kubernetes-validate ships no Gateway API schemas: the rest is validated, the routes checked here.
    assert _schema_errors(tuple(o for o in result.objects if o["kind"] != "HTTPRoute")) == []
    api = routes[FULLNAME]["spec"]
    assert api["hostnames"] == ["nvcf.example.com"]
    assert [r["backendRefs"][0]["name"] for r in api["rules"]] == [f"{FULLNAME}-invocation", f"{FULLNAME}-control"]
    assert [m["path"]["value"] for m in api["rules"][0]["matches"]] == list(INVOCATION_PATHS)
    # Without a public URL the API nodes name each other by their Services.
    configs = _configs(result, tmp_path)
    deployments = _by_kind(result, "Deployment")
    control = _mounted_config(deployments[f"{FULLNAME}-control"], configs).settings.peers
    invocation = _mounted_config(deployments[f"{FULLNAME}-invocation"], configs).settings.peers
    assert control.invocation_url == f"http://{FULLNAME}-invocation.{NAMESPACE}.svc:8080"
    assert invocation.api_url == f"http://{FULLNAME}-control.{NAMESPACE}.svc:8080"
    host_routing = routes[f"{FULLNAME}-invocation"]["spec"]
    assert host_routing["hostnames"] == ["*.invocation.nvcf.example.com"]
    assert host_routing["parentRefs"] == [{"name": "gateway", "namespace": "gateway-system"}]


def _declared_metrics() -> set[str]:
    """Every metric name the platform declares (``.counter("name"``, gauges, histograms) in its source."""
    pattern = re.compile(r"\.(?:counter|gauge|histogram)\(\s*\"([a-z_][a-z0-9_]*)\"")
    return {name for path in (ROOT / "nvcf_mono").rglob("*.py") for name in pattern.findall(path.read_text())}


def _queried_metrics(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: a name followed by its selector, range or ``)``."""
    bare = re.sub(r"\{[^}]*\}", "{}", re.sub(r"\bby \([^)]*\)", "", expr))  # no label names left
    names = set(re.findall(r"(?<![\w$])([a-z_][a-z0-9_]*)(?=\{|\[|\))", bare))
    return {re.sub(r"_(bucket|sum|count)$", "", n) if n.endswith(("_bucket", "_sum", "_count")) else n for n in names}


async def test_prometheus_and_grafana_assets(tmp_path: Path) -> None:
    values = {
        "layout": "split",
        "compute": SPLIT["compute"],
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
            "grafanaDashboard": {"enabled": True},
        },
    }
    result = await _render(values)
    # kubernetes-validate has no Prometheus Operator schemas: the rest is validated, the monitor checked here.
    assert _schema_errors(tuple(o for o in result.objects if o["kind"] != "ServiceMonitor")) == []
    (monitor,) = _by_kind(result, "ServiceMonitor").values()
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s"}]
    services = _by_kind(result, "Service")
    assert set(services) == {f"{FULLNAME}-control", f"{FULLNAME}-invocation"}
    for service in services.values():  # the monitor selects each Service, which has the port it names
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert "http" in {p["name"] for p in service["spec"]["ports"]}
    for deployment in _by_kind(result, "Deployment").values():  # compute agents too: annotations
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        port = annotations["prometheus.io/port"]
        assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/path"] == "/metrics"
        assert any(p["name"] == "http" and str(p["containerPort"]) == port for p in _container(deployment)["ports"])

    (dashboard,) = (c for c in _by_kind(result, "ConfigMap").values() if c["metadata"]["name"].endswith("-dashboard"))
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    doc = json.loads(dashboard["data"]["nvcf-mono.json"])
    assert doc["uid"] == "nvcf-mono" and doc["title"] == "nvcf-mono"
    exprs = [t["expr"] for panel in doc["panels"] for t in panel.get("targets", ())]
    assert len(exprs) >= 20
    queried = set().union(*(_queried_metrics(e) for e in exprs))
    declared = _declared_metrics()
    assert {"function_request", "nvcf_invocation_queue_wait_seconds", "nvcf_compute_gpus", "plugin_up"} <= queried
    assert queried - declared == set(), "the dashboard reads metrics the platform does not have"
    ids = [panel["id"] for panel in doc["panels"]]
    assert len(ids) == len(set(ids))

    plain = await _render({"metrics": {"scrapeAnnotations": False}})
    assert not _by_kind(plain, "ServiceMonitor")
    (deployment,) = _by_kind(plain, "Deployment").values()
    assert "prometheus.io/scrape" not in deployment["spec"]["template"]["metadata"]["annotations"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"layout": "spread"}, r"layout"),
        ({"allInOne": {"replicas": 2}}, r"allInOne/replicas|allInOne.replicas"),
        ({"nats": {"embedded": True}, "layout": "split"}, r"nats.embedded runs NATS inside the all-in-one pod"),
        ({"nats": {"url": ""}}, r"nats.url is empty"),
        ({"shutdown": {"terminationGracePeriodSeconds": 10}}, r"must exceed shutdown.drainGrace"),
        ({"compute": {"clusters": [{"name": "a_b"}, {"name": "a-b"}]}}, r"name the same agent"),
        ({"compute": {"clusters": [{"name": "bad name"}]}}, r"compute/clusters/0/name"),
        ({"replicas": 3}, r"additional properties 'replicas' not allowed"),
    ],
    ids=["layout", "all-in-one-replicas", "embedded-split", "no-nats", "grace", "same-agent", "cluster-name", "typo"],
)
async def test_values_that_cannot_work_are_refused_with_the_reason(values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmRenderError, match=message):
        await _render(values)
