"""The control plane's HTTP API, one module per resource; each has ``register(router, ctl)``."""

from __future__ import annotations

from nvcf_mono.planes.control.api import deployments, functions

ALL = (functions, deployments)
