"""Small charts written by the tests: one with every case the renderer must handle, one that fails."""

from __future__ import annotations

import tarfile
from pathlib import Path

DEMO_TEMPLATES = {
    "configmap.yaml": """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-settings
  namespace: {{ .Release.Namespace }}
  labels:
    app: {{ include "demo.name" . }}
data:
  greeting: {{ .Values.greeting | quote }}
---
# an empty document: dropped
---
""",
    "deployment.yaml": """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-server
  namespace: {{ .Release.Namespace }}
spec:
  replicas: {{ .Values.replicas }}
  selector:
    matchLabels: {app: demo}
  template:
    metadata:
      labels: {app: demo}
    spec:
      containers:
        - name: server
          image: "{{ .Values.image }}"
""",
    "serviceaccount.yaml": """\
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ .Release.Name }}
""",
    "hooks.yaml": """\
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ .Release.Name }}-migrate
  annotations:
    "helm.sh/hook": pre-install,pre-upgrade
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: migrate, image: busybox}]
---
apiVersion: v1
kind: Pod
metadata:
  name: {{ .Release.Name }}-test
  annotations:
    helm.sh/hook: test
spec:
  containers: [{name: test, image: busybox}]
""",
    "crd.yaml": """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
""",
    "not-an-object.yaml": """\
just: some data without apiVersion or kind
""",
    "_helpers.tpl": """{{- define "demo.name" -}}demo{{- end -}}""",
    "NOTES.txt": "Installed {{ .Release.Name }}.",
}

DEMO_CRDS = {
    "gadgets.yaml": """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.example.com
""",
}


def write_chart(
    root: Path,
    name: str = "demo",
    version: str = "1.2.3",
    *,
    templates: dict[str, str] | None = None,
    crds: dict[str, str] | None = None,
    values: str = "replicas: 1\ngreeting: hello\nimage: registry.example.com/demo:1\n",
) -> Path:
    """A chart directory ``root/name``."""
    chart = root / name
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(f"apiVersion: v2\nname: {name}\nversion: {version}\n")
    (chart / "values.yaml").write_text(values)
    for file, text in (DEMO_TEMPLATES if templates is None else templates).items():
        (chart / "templates" / file).write_text(text)
    for file, text in (DEMO_CRDS if crds is None else crds).items():
        (chart / "crds").mkdir(exist_ok=True)
        (chart / "crds" / file).write_text(text)
    return chart


def package(chart: Path, into: Path) -> Path:
    """``chart`` as a ``.tgz`` archive, the way ``helm package`` lays it out (``<name>/...``)."""
    into.mkdir(parents=True, exist_ok=True)
    archive = into / f"{chart.name}.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(chart, arcname=chart.name)
    return archive


BROKEN_TEMPLATES = {
    "configmap.yaml": """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ required "set .Values.name: the ConfigMap needs a name" .Values.name }}
""",
}
