{{/* Names. Component suffixes (-invocation, -compute-<cluster>) need room: the base stays short. */}}
{{- define "nvcf-mono.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "nvcf-mono.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "nvcf-mono.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "nvcf-mono.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* (dict "root" $ "component" "control" ["cluster" "gpu-a"]) */}}
{{- define "nvcf-mono.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nvcf-mono.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- if .cluster }}
nvcf-mono.io/cluster: {{ .cluster }}
{{- end }}
{{- end -}}

{{- define "nvcf-mono.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) -}}
{{- end -}}

{{- define "nvcf-mono.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "nvcf-mono.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "nvcf-mono.computeServiceAccountName" -}}
{{- if .Values.compute.serviceAccount.create -}}
{{- default (printf "%s-compute" (include "nvcf-mono.fullname" .)) .Values.compute.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.compute.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "nvcf-mono.platformSecretName" -}}
{{- default (printf "%s-platform-secret" (include "nvcf-mono.fullname" .)) .Values.platformSecret.existingSecret -}}
{{- end -}}

{{/* The Service of the nodes that serve invocation and the WorkerService. */}}
{{- define "nvcf-mono.invocationService" -}}
{{- if eq .Values.layout "split" -}}
{{- printf "%s-invocation" (include "nvcf-mono.fullname" .) -}}
{{- else -}}
{{- include "nvcf-mono.fullname" . -}}
{{- end -}}
{{- end -}}

{{- define "nvcf-mono.controlService" -}}
{{- if eq .Values.layout "split" -}}
{{- printf "%s-control" (include "nvcf-mono.fullname" .) -}}
{{- else -}}
{{- include "nvcf-mono.fullname" . -}}
{{- end -}}
{{- end -}}

{{/* Path prefixes the invocation nodes serve on the API host: pexec, exec and the LLM gateway (OpenAI's
routes). Space-separated; at most 8, the Gateway API's limit of matches in one rule. */}}
{{- define "nvcf-mono.invocationPaths" -}}
/v2/nvcf/pexec /v2/nvcf/exec /v1/chat/completions /v1/completions /v1/embeddings /v1/responses /v1/models /v1/health
{{- end -}}

{{/* URLs of the API nodes inside the cluster, for the peers.* settings of a split deployment: the public
URL where one is set (the ingress routes each path to its nodes), else the Services. */}}
{{- define "nvcf-mono.peerUrl" -}}
{{- $root := index . 0 -}}
{{- $service := index . 1 -}}
{{- with include "nvcf-mono.publicUrl" $root -}}
{{- . -}}
{{- else -}}
{{- printf "http://%s.%s.svc:%d" $service $root.Release.Namespace (int $root.Values.service.httpPort) -}}
{{- end -}}
{{- end -}}

{{/* Where instances dial the WorkerService. The all-in-one pod's own local cluster dials it in-pod. */}}
{{- define "nvcf-mono.workerGrpcAddress" -}}
{{- if .Values.workerGrpcAddress -}}
{{- .Values.workerGrpcAddress -}}
{{- else if and (ne .Values.layout "split") (not .Values.compute.clusters) -}}
{{- printf "127.0.0.1:%d" (int .Values.service.grpcPort) -}}
{{- else -}}
{{- printf "%s.%s.svc:%d" (include "nvcf-mono.invocationService" .) .Release.Namespace (int .Values.service.grpcPort) -}}
{{- end -}}
{{- end -}}

{{/* The gRPC address clients are told (endpoints.json): the Service, or the address instances dial. */}}
{{- define "nvcf-mono.grpcPublicAddress" -}}
{{- if .Values.workerGrpcAddress -}}
{{- .Values.workerGrpcAddress -}}
{{- else -}}
{{- printf "%s.%s.svc:%d" (include "nvcf-mono.invocationService" .) .Release.Namespace (int .Values.service.grpcPort) -}}
{{- end -}}
{{- end -}}

{{- define "nvcf-mono.publicUrl" -}}
{{- if .Values.publicUrl -}}
{{- .Values.publicUrl -}}
{{- else if and .Values.ingress.enabled .Values.ingress.host -}}
{{- printf "%s://%s" (ternary "https" "http" (not (empty .Values.ingress.tls))) .Values.ingress.host -}}
{{- end -}}
{{- end -}}

{{/* A cluster's agent name part: lower case, '-' for '_'. */}}
{{- define "nvcf-mono.clusterSlug" -}}
{{- . | lower | replace "_" "-" | trunc 20 | trimSuffix "-" -}}
{{- end -}}

{{/* A stable cluster id (UUID-shaped) from the release and the cluster name: an agent pod keeps no disk. */}}
{{- define "nvcf-mono.clusterId" -}}
{{- $h := sha256sum (printf "%s/%s/%s" .root.Release.Namespace .root.Release.Name .name) -}}
{{- printf "%s-%s-%s-%s-%s" (substr 0 8 $h) (substr 8 12 $h) (substr 12 16 $h) (substr 16 20 $h) (substr 20 32 $h) -}}
{{- end -}}

{{/* Deep merge of (list dst src) into dst; unlike mergeOverwrite, false, 0 and "" in src win too. */}}
{{- define "nvcf-mono.deepMerge" -}}
{{- $dst := index . 0 -}}
{{- range $key, $value := index . 1 -}}
{{- if and (kindIs "map" $value) (kindIs "map" (get $dst $key)) -}}
{{- include "nvcf-mono.deepMerge" (list (get $dst $key) $value) -}}
{{- else if or (kindIs "map" $value) (kindIs "slice" $value) -}}
{{- $_ := set $dst $key (deepCopy $value) -}}
{{- else -}}
{{- $_ := set $dst $key $value -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "nvcf-mono.terminationGracePeriodSeconds" -}}
{{- $s := .Values.shutdown -}}
{{- if kindIs "invalid" $s.terminationGracePeriodSeconds -}}
{{- add (int $s.drainGrace) (int $s.pluginGrace) 15 -}}
{{- else -}}
{{- int $s.terminationGracePeriodSeconds -}}
{{- end -}}
{{- end -}}

{{/*
A node's nvcf-mono configuration as YAML: (dict "root" $ "role" ROLE "extra" DICT "component" VALUES).
Layers: what the chart decides, the role's additions (extra), .Values.config, the component's config.
*/}}
{{- define "nvcf-mono.config" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $bus := dict "stream_replicas" (int $v.nats.streamReplicas) -}}
{{- if $v.nats.embedded -}}
{{- $_ := set $bus "stream_replicas" 1 -}}
{{- else -}}
{{- $_ := set $bus "url" $v.nats.url -}}
{{- end -}}
{{- if $v.nats.credentials.secretName -}}
{{- $_ := set $bus "credentials_file" (printf "/var/run/secrets/nats/creds/%s" $v.nats.credentials.key) -}}
{{- end -}}
{{- if $v.nats.tls.secretName -}}
{{- $tls := dict "ca_file" "/var/run/secrets/nats/tls/ca.crt" -}}
{{- if $v.nats.tls.clientCertificate -}}
{{- $_ := set $tls "cert_file" "/var/run/secrets/nats/tls/tls.crt" -}}
{{- $_ := set $tls "key_file" "/var/run/secrets/nats/tls/tls.key" -}}
{{- end -}}
{{- $_ := set $bus "tls" $tls -}}
{{- end -}}
{{- $http := dict "host" "0.0.0.0" "port" (int $v.service.httpPort) -}}
{{- $grpc := dict "host" "0.0.0.0" "port" (int $v.service.grpcPort) -}}
{{- $config := dict
    "version" 1
    "role" .role
    "state_dir" "/var/lib/nvcf-mono/state"
    "bus" $bus
    "http" $http
    "grpc" $grpc
    "shutdown" (dict "drain_grace" $v.shutdown.drainGrace "plugin_grace" $v.shutdown.pluginGrace)
    "logging" (dict "level" $v.logging.level "format" $v.logging.format)
    "plugins" dict
-}}
{{- include "nvcf-mono.deepMerge" (list $config (.extra | default dict)) -}}
{{- include "nvcf-mono.deepMerge" (list $config ($v.config | default dict)) -}}
{{- include "nvcf-mono.deepMerge" (list $config (.component.config | default dict)) -}}
{{- toYaml $config -}}
{{- end -}}

{{/* The API nodes' additions: the platform secret, public URL, where instances dial. */}}
{{- define "nvcf-mono.apiNodeConfig" -}}
{{- $extra := dict "plugins" (dict "auth" (dict "secret_file" (printf "/var/run/secrets/nvcf/%s" .Values.platformSecret.key))) -}}
{{- $url := include "nvcf-mono.publicUrl" . -}}
{{- if $url -}}
{{- $_ := set $extra "http" (dict "public_url" $url) -}}
{{- end -}}
{{- toYaml $extra -}}
{{- end -}}

{{/*
The pod template of one component: (dict "root" $ "component" NAME "values" COMPONENT_VALUES "configFile" FILE
"configChecksum" SUM "cluster" CLUSTER_ENTRY_OR_NIL "apiNode" BOOL "serviceAccount" NAME).
*/}}
{{- define "nvcf-mono.podTemplate" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $c := .values -}}
{{- $cluster := .cluster -}}
{{- $slug := "" -}}
{{- $automount := false -}}
{{- if $cluster -}}
{{- $slug = include "nvcf-mono.clusterSlug" $cluster.name -}}
{{- $automount = not $cluster.kubeconfigSecret -}}
{{- end -}}
metadata:
  labels:
    {{- include "nvcf-mono.selectorLabels" (dict "root" $root "component" .component "cluster" $slug) | nindent 4 }}
    {{- with $v.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ .configChecksum }}
    {{- if $v.metrics.scrapeAnnotations }}
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ $v.service.httpPort | quote }}
    prometheus.io/path: /metrics
    {{- end }}
    {{- with $v.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ .serviceAccount }}
  # Only an in-cluster compute agent talks to the Kubernetes API.
  automountServiceAccountToken: {{ $automount }}
  terminationGracePeriodSeconds: {{ include "nvcf-mono.terminationGracePeriodSeconds" $root }}
  {{- with $v.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $v.podSecurityContext | nindent 4 }}
  containers:
    - name: nvcf-mono
      image: {{ include "nvcf-mono.image" $root }}
      imagePullPolicy: {{ $v.image.pullPolicy }}
      args: [run, --config, /etc/nvcf-mono/{{ .configFile }}]
      env:
        - {name: HOME, value: /tmp}
        - {name: PYTHONUNBUFFERED, value: "1"}
        {{- with $v.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - {name: http, containerPort: {{ int $v.service.httpPort }}, protocol: TCP}
        {{- if .apiNode }}
        - {name: grpc, containerPort: {{ int $v.service.grpcPort }}, protocol: TCP}
        {{- end }}
      # The HTTP server starts once NATS is connected: the startup probe waits for that, up to 10 minutes.
      startupProbe:
        httpGet: {path: /health, port: http}
        periodSeconds: 5
        failureThreshold: 120
      livenessProbe:
        httpGet: {path: /health, port: http}
        periodSeconds: 10
        timeoutSeconds: 5
        failureThreshold: 6
      readinessProbe:
        httpGet: {path: /ready, port: http}
        periodSeconds: 5
        timeoutSeconds: 5
        failureThreshold: 3
      securityContext:
        {{- toYaml $v.securityContext | nindent 8 }}
      {{- with ($c.resources | default dict) }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      volumeMounts:
        - {name: config, mountPath: /etc/nvcf-mono, readOnly: true}
        - {name: state, mountPath: /var/lib/nvcf-mono}
        - {name: tmp, mountPath: /tmp}
        {{- if .apiNode }}
        - {name: platform-secret, mountPath: /var/run/secrets/nvcf, readOnly: true}
        {{- end }}
        {{- if $v.nats.credentials.secretName }}
        - {name: nats-creds, mountPath: /var/run/secrets/nats/creds, readOnly: true}
        {{- end }}
        {{- if $v.nats.tls.secretName }}
        - {name: nats-tls, mountPath: /var/run/secrets/nats/tls, readOnly: true}
        {{- end }}
        {{- if and $cluster $cluster.kubeconfigSecret }}
        - {name: kubeconfig, mountPath: /var/run/secrets/nvcf/kubeconfig, readOnly: true}
        {{- end }}
        {{- with $v.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: config
      configMap: {name: {{ .configMap }}}
    - name: state
      {{- if .stateClaim }}
      persistentVolumeClaim: {claimName: {{ .stateClaim }}}
      {{- else }}
      emptyDir: {}
      {{- end }}
    - name: tmp
      emptyDir: {}
    {{- if .apiNode }}
    - name: platform-secret
      secret: {secretName: {{ include "nvcf-mono.platformSecretName" $root }}, defaultMode: 0440}
    {{- end }}
    {{- if $v.nats.credentials.secretName }}
    - name: nats-creds
      secret: {secretName: {{ $v.nats.credentials.secretName }}, defaultMode: 0440}
    {{- end }}
    {{- if $v.nats.tls.secretName }}
    - name: nats-tls
      secret: {secretName: {{ $v.nats.tls.secretName }}, defaultMode: 0440}
    {{- end }}
    {{- if and $cluster $cluster.kubeconfigSecret }}
    - name: kubeconfig
      secret: {secretName: {{ $cluster.kubeconfigSecret }}, defaultMode: 0440}
    {{- end }}
    {{- with $v.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with ($c.nodeSelector | default dict) }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with ($c.tolerations | default list) }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with ($c.affinity | default dict) }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* Refuse values that cannot work, with what to change. */}}
{{- define "nvcf-mono.validate" -}}
{{- $v := .Values -}}
{{- if not (has $v.layout (list "all-in-one" "split")) -}}
{{- fail (printf "layout must be all-in-one or split, not %q" (toString $v.layout)) -}}
{{- end -}}
{{- if and (eq $v.layout "all-in-one") (ne (int $v.allInOne.replicas) 1) -}}
{{- fail "allInOne.replicas must be 1: an all-in-one host owns its state directory; use layout: split to scale" -}}
{{- end -}}
{{- if and $v.nats.embedded (or (eq $v.layout "split") $v.compute.clusters) -}}
{{- fail "nats.embedded runs NATS inside the all-in-one pod: it needs layout all-in-one and no compute.clusters; give a NATS cluster in nats.url instead" -}}
{{- end -}}
{{- if and (not $v.nats.embedded) (not $v.nats.url) -}}
{{- fail "nats.url is empty: give the NATS cluster's client URL(s), or set nats.embedded: true" -}}
{{- end -}}
{{- if le (int (include "nvcf-mono.terminationGracePeriodSeconds" .)) (int $v.shutdown.drainGrace) -}}
{{- fail "shutdown.terminationGracePeriodSeconds must exceed shutdown.drainGrace, or pods are killed while draining" -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $i, $c := $v.compute.clusters -}}
{{- if not $c.name -}}
{{- fail (printf "compute.clusters[%d] has no name" $i) -}}
{{- end -}}
{{- $slug := include "nvcf-mono.clusterSlug" $c.name -}}
{{- if hasKey $seen $slug -}}
{{- fail (printf "compute.clusters: %q and %q name the same agent (%s); rename one" (get $seen $slug) $c.name $slug) -}}
{{- end -}}
{{- $_ := set $seen $slug $c.name -}}
{{- end -}}
{{- end -}}
