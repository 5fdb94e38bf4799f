"""Helm charts of functions, written by tests: NVIDIA's ``inference-test`` sample shape (a Deployment, its
Service, the ``nvcf-workload-config`` ConfigMap) and the variants the validator must refuse.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import yaml

SECURE = """\
          securityContext:
            capabilities: {drop: [ALL]}
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            runAsNonRoot: true
            runAsUser: 1000
            seccompProfile: {type: RuntimeDefault}
"""

INFERENCE = (
    """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: inference
  labels: {app: inference}
spec:
  replicas: {{ .Values.replicas }}
  selector:
    matchLabels: {app: inference}
  template:
    metadata:
      labels: {app: inference}
    spec:
      containers:
        - name: server
          image: "{{ .Values.image }}"
          ports:
            - {name: http, containerPort: 8000}
          env:
            - {name: GREETING, value: {{ .Values.greeting | quote }}}
          resources:
            limits: {nvidia.com/gpu: 1}
"""
    + SECURE
)

SERVICE = """\
apiVersion: v1
kind: Service
metadata:
  name: {{ .Values.serviceName }}
spec:
  type: {{ .Values.serviceType }}
  selector: {app: inference}
  ports:
    - {name: http, port: {{ .Values.servicePort }}, targetPort: http}
"""

WORKLOAD_CONFIG = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: nvcf-workload-config
data:
  config.yaml: |
    featureFlags:
      StatusByWorkerReadiness: true
"""

SIDECAR = (
    """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: metrics
spec:
  replicas: 1
  selector:
    matchLabels: {app: metrics}
  template:
    metadata:
      labels: {app: metrics}
    spec:
      containers:
        - name: exporter
          image: registry.example.com/exporter:1
"""
    + SECURE
)

VALUES = {
    "replicas": 1,
    "image": "nvcr.io/acme/inference:1.0",
    "greeting": "hello",
    "serviceName": "inference-svc",
    "servicePort": 8001,
    "serviceType": "ClusterIP",
}


def write_chart(
    root: Path,
    *,
    name: str = "inference-test",
    version: str = "1.0.0",
    templates: Mapping[str, str] | None = None,
    values: Mapping[str, object] | None = None,
) -> Path:
    """A chart directory under ``root`` (default: the sample: inference Deployment and its Service)."""
    chart = root / name
    (chart / "templates").mkdir(parents=True, exist_ok=True)
    (chart / "Chart.yaml").write_text(yaml.safe_dump({"apiVersion": "v2", "name": name, "version": version}))
    (chart / "values.yaml").write_text(yaml.safe_dump(dict(values if values is not None else VALUES)))
    for file, text in (
        templates if templates is not None else {"inference.yaml": INFERENCE, "service.yaml": SERVICE}
    ).items():
        (chart / "templates" / file).write_text(text)
    return chart
