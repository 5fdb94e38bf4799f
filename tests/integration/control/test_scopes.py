"""The auth matrix, driven by ``/v3/openapi``: every operation that needs a bearer refuses callers without one.

Nothing here names a route: operations other modules add later are covered as soon as they are
served, and a route served but missing from the document fails the test (it would escape the matrix).
"""

from __future__ import annotations

import re
import secrets
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from nvcf_mono.auth.keystore import API_KEY_STORE
from nvcf_mono.auth.scopes import ALL_SCOPES
from nvcf_mono.console import ROUTES as CONSOLE_ROUTES
from nvcf_mono.http.openapi import path_template
from nvcf_mono.models.api_key import FUNCTIONS_SERVICE_ID, Authorizations, KeyResource, Policy, Product
from nvcf_mono.planes.invocation.llm.gateway import ROUTES as LLM_GATEWAY_ROUTES
from nvcf_mono.testing.platform import Api, Reply

from .conftest import Platform, platform

BEARER = [{"bearer": []}]
#: Unauthenticated in NVCF too (reference auth §3, §4.2): liveness, the document itself, NATS' auth webhook,
#: the API Keys service's introspection and evaluations (the key asked about is the credential); plus
#: this platform's readiness and metrics.
OPEN_PATHS = re.compile(
    r"^/(health|ready|metrics|v3/openapi|actuator(/.*)?|v2/nvcf/webhook/.*"
    r"|v1/introspect|v1/namespaces/\{namespace\}/evaluations/\{rule\})$"
)
HTTP_METHODS = {"get", "put", "post", "delete", "patch"}


def operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for template, methods in sorted(document["paths"].items()):
        for method, op in sorted(methods.items()):
            if method in HTTP_METHODS:
                yield method.upper(), template, op


def concrete(template: str) -> str:
    """The template with its path parameters filled: the default account, random UUIDs for the rest."""
    return re.sub(r"\{([^}/]+)\}", lambda m: "nvcf-default" if m.group(1) == "ncaId" else str(uuid.uuid4()), template)


async def call(api: Api, method: str, template: str, op: dict[str, Any]) -> Reply:
    content = op.get("requestBody", {}).get("content", {})
    if "application/json" in content:
        return await api.call(method, concrete(template), {})
    if content:
        media = next(iter(content))
        return await api.call(method, concrete(template), data=b"{}", headers={"Content-Type": media})
    return await api.call(method, concrete(template))


def assert_problem(reply: Reply, status: int, what: str) -> None:
    assert reply.status == status, f"{what}: expected {status}, got {reply.status}: {reply.body[:300]!r}"
    content_type = reply.headers.get("Content-Type", "")
    assert content_type.startswith("application/problem+json"), f"{what}: content type {content_type!r}"
    doc = reply.json
    assert isinstance(doc, dict), f"{what}: body {reply.body[:300]!r}"
    for field in ("type", "title", "status", "detail"):
        assert doc.get(field), f"{what}: problem body lacks {field!r}: {doc}"
    assert doc["status"] == status, f"{what}: body status {doc['status']} != {status}"
    assert doc["type"].startswith("urn:nv-boot:problem-details:"), f"{what}: type {doc['type']!r}"


async def key_holding(p: Platform, scope: str) -> Api:
    """A valid API key of the default account holding exactly ``scope`` (minted in the store itself)."""
    _, value = await p.host.services.get(API_KEY_STORE).create(
        nca_id="nvcf-default",
        owner_id="scope-matrix",
        description=f"only {scope}",
        authorizations=Authorizations(
            policies=(
                Policy(
                    scopes=(scope,),
                    resources=(
                        KeyResource(id="*", type="account-functions"),
                        KeyResource(id="*", type="authorized-functions"),
                        KeyResource(id="*", type="account-tasks"),
                    ),
                    product=Product.FUNCTIONS,
                ),
            )
        ),
        expires_in=timedelta(hours=1),
        issuer_service_id=FUNCTIONS_SERVICE_ID,
        audience_service_ids=(FUNCTIONS_SERVICE_ID,),
    )
    return p.api(value)


async def test_every_operation_requires_a_credential_and_its_scopes(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        reply = await p.anonymous.get("/v3/openapi")
        assert reply.status == 200
        document = reply.json
        ops = list(operations(document))

        # Everything served is documented, so nothing escapes the matrix below.
        assert p.host.http is not None
        documented = {(method, template) for method, template, _ in ops}
        served = {
            (route.method, route.resource.canonical)
            for route in p.host.http.app.router.routes()
            if route.resource is not None and route.method.lower() in HTTP_METHODS
        }
        gateway = {(method, path_template(path)) for method, path in LLM_GATEWAY_ROUTES}
        console = {(method, path_template(path)) for method, path in CONSOLE_ROUTES}  # a page, not operations
        undocumented = served - documented - gateway - console
        assert undocumented == set(), f"served but not in /v3/openapi: {sorted(undocumented)}"
        # The LLM gateway is OpenAI's API: the same rules, in OpenAI's error shape.
        await gateway_refuses_strangers(
            p, sorted(gateway), keys={"list_functions": await key_holding(p, "list_functions")}
        )

        garbage = [
            p.api("not-a-real-token"),
            p.api("nvapi-" + secrets.token_urlsafe(48)[:64]),  # the key format, but no such key
            p.api("eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"),  # shaped like a JWT, signed by nobody
        ]
        keys: dict[str, Api] = {}
        protected = scoped = 0
        for method, template, op in ops:
            what = f"{method} {template}"
            if op.get("security") != BEARER:
                assert op.get("security") == [], f"{what}: unexpected security {op.get('security')}"
                if not OPEN_PATHS.match(template):
                    # Public by declaration (signed links): still never open to an anonymous caller.
                    refused = await call(p.anonymous, method, template, op)
                    assert refused.status in (401, 403), f"{what} is public and answered {refused.status}"
                    assert_problem(refused, refused.status, what)
                continue
            protected += 1
            assert_problem(await call(p.anonymous, method, template, op), 401, f"{what} without a credential")
            for api in garbage:
                assert_problem(await call(api, method, template, op), 401, f"{what} with {api.token!r}")
            wanted = op.get("x-scopes")
            if not wanted:
                continue
            scoped += 1
            # /v1/keys grants only known scopes: an operation wanting another could never be reached by a key.
            assert set(wanted) <= ALL_SCOPES, f"{what}: unknown scopes {sorted(set(wanted) - ALL_SCOPES)}"
            other = sorted(ALL_SCOPES - set(wanted))[0]
            if other not in keys:
                keys[other] = await key_holding(p, other)
            assert_problem(
                await call(keys[other], method, template, op), 403, f"{what} with a key holding only {other!r}"
            )
        # The control plane alone declares dozens of protected, scoped operations.
        assert protected >= 50 and scoped >= 40, (protected, scoped)


async def gateway_refuses_strangers(p: Platform, routes: list[tuple[str, str]], keys: dict[str, Api]) -> None:
    """Every gateway route but its probes: 401 without a valid credential, 403 without invoke_function."""
    session, base = p.anonymous.session, p.anonymous.base
    for method, template in routes:
        if template in ("/v1/health/ready", "/v1/health/live"):
            async with session.get(base + template) as resp:
                assert resp.status == 200
            continue
        path = template.replace("{model}", "m")
        body = {"model": "m", "messages": []} if method == "POST" else None
        for token, status in (
            (None, 401),
            ("not-a-real-token", 401),
            ("nvapi-" + secrets.token_urlsafe(48)[:64], 401),
            (keys["list_functions"].token, 403),
        ):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with session.request(method, base + path, json=body, headers=headers) as resp:
                doc = await resp.json()
                assert resp.status == status, f"{method} {path} with {token!r}: {resp.status} {doc}"
            assert doc["error"]["type"] in ("authentication_error", "permission_error"), doc
