# syntax=docker/dockerfile:1
# nvcf-mono: every role runs from this image (`nvcf-mono run --config FILE`), and the Kubernetes backend
# runs it as the `utils` sidecar (`nvcf-mono worker`) of every instance pod.
#   docker build -t nvcf-mono:0.1.0 .
#   docker run --rm -p 8080:8080 -p 8081:8081 -v nvcf-state:/var/lib/nvcf-mono nvcf-mono:0.1.0   # all-in-one
FROM python:3.11-slim

# EXTRAS: helm adds helm-python-sdk (Helm charts rendered in process), otel OpenTelemetry's SDK and OTLP
# exporter (tracing.otlp_endpoint; the worker sidecar traces with it too); empty for the bare platform.
ARG EXTRAS=helm,otel

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The sources only for the install: the image keeps the installed package, not the tree.
COPY pyproject.toml README.md /tmp/nvcf-mono/
COPY nvcf_mono /tmp/nvcf-mono/nvcf_mono
RUN pip install "/tmp/nvcf-mono${EXTRAS:+[$EXTRAS]}" \
 && rm -rf /tmp/nvcf-mono \
 && groupadd --system --gid 10001 nvcf \
 && useradd --system --uid 10001 --gid nvcf --home-dir /var/lib/nvcf-mono --shell /usr/sbin/nologin nvcf \
 && install -d -o nvcf -g nvcf -m 0750 /var/lib/nvcf-mono /etc/nvcf-mono

COPY --chown=root:root --chmod=0644 deploy/docker/nvcf-mono.yaml /etc/nvcf-mono/nvcf-mono.yaml

USER 10001:10001
WORKDIR /var/lib/nvcf-mono
# HTTP (API, invocation, /health, /ready, /metrics) and gRPC (gRPC proxy, WorkerService, health).
EXPOSE 8080 8081
# SIGTERM drains (shutdown.drain_grace), then stops; give the container longer than that to exit.
STOPSIGNAL SIGTERM
ENTRYPOINT ["nvcf-mono"]
CMD ["run", "--config", "/etc/nvcf-mono/nvcf-mono.yaml"]
