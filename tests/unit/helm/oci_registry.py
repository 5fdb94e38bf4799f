"""An OCI registry for the chart tests: the read side of the distribution API (manifests, blobs, tag
lists) with a token service, as registries answer ``helm pull``, plus knobs a hostile or broken
registry would turn. It is not a registry: ``tests/integration/helm`` pulls from a real one too.

Charts are stored as ``helm push`` stores them: a config blob with the chart's metadata and one layer
with the archive. Blobs are served by a redirect to a separate storage server (another origin, as cloud
registries hand blobs to object storage), which refuses requests that carry credentials, as presigned
URLs do.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
from aiohttp import web

from tests.unit.helm.https_server import serving

USER, PASSWORD = "robot", "registry-pass"
TOKEN = "t0ken-for-robot"
ANONYMOUS = "anonymous-t0ken"
#: A second user, who sees only public repositories (as anyone does).
VIEWER, VIEWER_PASSWORD = "viewer", "viewer-pass"
VIEWER_TOKEN = "t0ken-for-viewer"
HELM_CONFIG = "application/vnd.cncf.helm.config.v1+json"
CHART_LAYER = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def chart_manifest(archive: bytes, *, config_type: str = HELM_CONFIG) -> tuple[bytes, dict[str, bytes]]:
    """The manifest ``helm push`` writes for ``archive``, and its blobs by digest."""
    config = json.dumps({"name": "demo", "version": "pushed"}).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": config_type, "digest": digest_of(config), "size": len(config)},
        "layers": [{"mediaType": CHART_LAYER, "digest": digest_of(archive), "size": len(archive)}],
    }
    return json.dumps(manifest).encode(), {digest_of(config): config, digest_of(archive): archive}


@attrs.define
class Registry:
    """What the registry holds and how it behaves; ``requests`` records (path, Authorization) of each call."""

    auth: str = "bearer"  # "bearer", "basic" or "none"
    public: set[str] = attrs.Factory(set)  # repositories anyone may pull (an anonymous token)
    tags: dict[str, dict[str, str]] = attrs.Factory(dict)  # repository -> tag -> manifest digest
    manifests: dict[str, bytes] = attrs.Factory(dict)
    blobs: dict[str, bytes] = attrs.Factory(dict)
    corrupt_blobs: bool = False
    #: Answer 404, not 401, to a token that may not read a repository (as registries that hide private ones).
    hide_private: bool = False
    realm: str | None = None  # the token service's URL; default: this server's /token
    tags_page: int = 2
    requests: list[tuple[str, str | None]] = attrs.Factory(list)
    storage_requests: list[tuple[str, str | None]] = attrs.Factory(list)
    base: str = ""
    storage: str = ""

    def push(self, repository: str, tag: str, archive: bytes, **kwargs: Any) -> str:
        manifest, blobs = chart_manifest(archive, **kwargs)
        return self.push_manifest(repository, tag, manifest, blobs)

    def push_manifest(self, repository: str, tag: str, manifest: bytes, blobs: dict[str, bytes]) -> str:
        digest = digest_of(manifest)
        self.manifests[digest] = manifest
        self.blobs.update(blobs)
        self.tags.setdefault(repository, {})[tag] = digest
        return digest


def _error(status: int, code: str, message: str, **headers: str) -> web.Response:
    body = json.dumps({"errors": [{"code": code, "message": message}]})
    return web.Response(status=status, text=body, content_type="application/json", headers=headers)


def _authorized(registry: Registry, request: web.Request, repository: str) -> web.Response | None:
    """None when the request may read ``repository``; else the registry's refusal."""
    given = request.headers.get("Authorization")
    registry.requests.append((request.path_qs, given))
    if registry.auth == "none":
        return None
    if registry.auth == "basic":
        if given == "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode():
            return None
        return _error(401, "UNAUTHORIZED", "authentication required", **{"WWW-Authenticate": 'Basic realm="test"'})
    if given == f"Bearer {TOKEN}" or (
        given in (f"Bearer {ANONYMOUS}", f"Bearer {VIEWER_TOKEN}") and repository in registry.public
    ):
        return None
    if registry.hide_private and given in (f"Bearer {ANONYMOUS}", f"Bearer {VIEWER_TOKEN}"):
        return _error(404, "NAME_UNKNOWN", "repository name not known to registry")
    realm = registry.realm or f"{registry.base}/token"
    challenge = f'Bearer realm="{realm}",service="test-registry",scope="repository:{repository}:pull"'
    return _error(401, "UNAUTHORIZED", "authentication required", **{"WWW-Authenticate": challenge})


def _registry_app(registry: Registry) -> web.Application:
    async def token(request: web.Request) -> web.Response:
        registry.requests.append((request.path_qs, request.headers.get("Authorization")))
        given = request.headers.get("Authorization")
        if given is None:
            return web.json_response({"token": ANONYMOUS})
        if given == "Basic " + base64.b64encode(f"{VIEWER}:{VIEWER_PASSWORD}".encode()).decode():
            return web.json_response({"token": VIEWER_TOKEN})
        if given != "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode():
            return web.Response(status=401, reason="Unauthorized")
        return web.json_response({"access_token": TOKEN, "expires_in": 300})

    async def manifest(request: web.Request) -> web.Response:
        repository, wanted = request.match_info["repository"], request.match_info["reference"]
        if (refused := _authorized(registry, request, repository)) is not None:
            return refused
        digest = wanted if wanted.startswith("sha256:") else registry.tags.get(repository, {}).get(wanted, "")
        body = registry.manifests.get(digest)
        if body is None or (wanted.startswith("sha256:") and digest not in registry.tags.get(repository, {}).values()):
            return _error(404, "MANIFEST_UNKNOWN", "manifest unknown")
        try:
            kind = json.loads(body).get("mediaType", OCI_MANIFEST)
        except ValueError:
            kind = "text/html"
        return web.Response(body=body, headers={"Content-Type": kind, "Docker-Content-Digest": digest})

    async def blob(request: web.Request) -> web.Response:
        repository, digest = request.match_info["repository"], request.match_info["digest"]
        if (refused := _authorized(registry, request, repository)) is not None:
            return refused
        if digest not in registry.blobs:
            return _error(404, "BLOB_UNKNOWN", "blob unknown to registry")
        raise web.HTTPTemporaryRedirect(f"{registry.storage}/objects/{digest}?signature=abc")

    async def tag_list(request: web.Request) -> web.Response:
        repository = request.match_info["repository"]
        if (refused := _authorized(registry, request, repository)) is not None:
            return refused
        if repository not in registry.tags:
            return _error(404, "NAME_UNKNOWN", "repository name not known to registry")
        tags = sorted(registry.tags[repository])
        last = request.query.get("last")
        rest = [t for t in tags if last is None or t > last]
        page, more = rest[: registry.tags_page], rest[registry.tags_page :]
        headers = {}
        if more:
            headers["Link"] = f'</v2/{repository}/tags/list?n={registry.tags_page}&last={page[-1]}>; rel="next"'
        return web.json_response({"name": repository, "tags": page}, headers=headers)

    app = web.Application()
    app.router.add_get("/token", token)
    app.router.add_get(r"/v2/{repository:.+}/manifests/{reference}", manifest)
    app.router.add_get(r"/v2/{repository:.+}/blobs/{digest}", blob)
    app.router.add_get(r"/v2/{repository:.+}/tags/list", tag_list)
    return app


def _storage_app(registry: Registry) -> web.Application:
    async def stored(request: web.Request) -> web.Response:
        registry.storage_requests.append((request.path_qs, request.headers.get("Authorization")))
        if "Authorization" in request.headers:
            return web.Response(status=400, text="only one auth mechanism allowed")
        data = registry.blobs[request.match_info["digest"]]
        return web.Response(body=data[:-1] + b"!" if registry.corrupt_blobs else data)

    app = web.Application()
    app.router.add_get("/objects/{digest}", stored)
    return app


@asynccontextmanager
async def running(registry: Registry, context: Any) -> AsyncIterator[Registry]:
    """Serve ``registry`` (and its blob storage) over https on 127.0.0.1 (plain http without ``context``); its
    URLs set on it.
    """
    async with serving(_storage_app(registry), context) as storage, serving(_registry_app(registry), context) as base:
        registry.base, registry.storage = base, storage
        yield registry
