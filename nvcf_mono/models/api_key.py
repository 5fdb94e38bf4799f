"""API keys as NVCF's API Keys service shows them (snake_case, reference auth §4)."""

from __future__ import annotations

import enum
from typing import Any

import attrs

from nvcf_mono.auth.principal import Resources
from nvcf_mono.structure import checked


class KeyStatus(enum.Enum):
    """A key's status; a stored ACTIVE key past ``expires_at`` reads as EXPIRED."""

    ACTIVE = "ACTIVE"
    EXPIRED = "EXPIRED"
    SUSPENDED = "SUSPENDED"


class Product(enum.Enum):
    """What a policy's key is for."""

    FUNCTIONS = "nv-cloud-functions"
    TASKS = "nv-cloud-tasks"


FUNCTIONS_SERVICE_ID = "nvidia-cloud-functions-ncp-service-id-aketm"
TASKS_SERVICE_ID = "nvidia-cloud-tasks-ncp-service-id-nvcttasks"
#: The API Keys service id of each product (a policy's ``aud``, a key's issuer and audiences).
SERVICE_IDS = {Product.FUNCTIONS: FUNCTIONS_SERVICE_ID, Product.TASKS: TASKS_SERVICE_ID}
#: The resource types a policy may name, and the id each takes.
RESOURCE_TYPES = {
    "account-functions": "*",
    "authorized-functions": "*",
    "function": "<functionId>/<versionId> or <functionId>/*",
    "account-tasks": "*",
    "task": "<taskId>",
}


@attrs.frozen(kw_only=True)
class KeyResource:
    """``{id, type}``: ``account-functions:*``, ``function:<fid>/<vid>``, ``task:<id>`` ..."""

    id: str
    type: str


@attrs.frozen(kw_only=True)
class Policy:
    """One policy of a key's ``authorizations``."""

    scopes: tuple[str, ...] = ()
    resources: tuple[KeyResource, ...] = ()
    product: Product = Product.FUNCTIONS
    aud: str | None = None
    auds: tuple[str, ...] | None = None


@attrs.frozen(kw_only=True)
class Authorizations:
    """``{policies: [...]}``."""

    policies: tuple[Policy, ...] = ()

    def scopes(self) -> frozenset[str]:
        return frozenset(s for p in self.policies for s in p.scopes)

    def resources(self) -> Resources:
        return Resources.from_entries({"id": r.id, "type": r.type} for p in self.policies for r in p.resources)


@attrs.frozen(kw_only=True)
class ApiKeyRecord:
    """What is stored of a key (bucket ``nvcf_api_keys``, keyed by the key's hash)."""

    id: str
    hash: str
    nca_id: str
    owner_id: str
    description: str
    created_at: str
    expires_at: str
    masked: str
    authorizations: Authorizations
    status: KeyStatus = KeyStatus.ACTIVE
    owner_type: str = "USER"
    issuer_service_id: str = FUNCTIONS_SERVICE_ID
    audience_service_ids: tuple[str, ...] = (FUNCTIONS_SERVICE_ID,)


@attrs.frozen(kw_only=True)
class CreateKeyRequest:
    """Body of ``POST /v1/keys`` (NVCF's snake_case); ``nca_id`` is this platform's addition."""

    description: str
    expires_at: str | None = None
    authorizations: Authorizations = attrs.field(factory=Authorizations)
    audience_service_ids: tuple[str, ...] | None = None
    nca_id: str | None = None


@attrs.frozen(kw_only=True)
class KeyDto:
    """A key as the API returns it; ``value`` only at creation."""

    id: str
    status: KeyStatus
    owner_type: str
    owner_id: str
    issuer_service_id: str
    audience_service_ids: tuple[str, ...]
    description: str
    created_at: str
    expires_at: str
    masked_key: str
    nca_id: str
    value: str | None = None
    authorizations: Authorizations | None = None


@attrs.frozen(kw_only=True)
class KeyListResponse:
    """``{keys: [...]}``."""

    keys: tuple[KeyDto, ...]


@attrs.frozen(kw_only=True)
class AdminKeyRequest:
    """Body of ``POST /v1/admin/keys``: ``{}`` (``nca_id`` is this platform's addition, for super admins)."""

    nca_id: str | None = None


@attrs.frozen(kw_only=True)
class IntrospectRequest:
    """Body of ``POST /v1/introspect``: a key's value, and the service asking about it."""

    audience_service_id: str
    key: str


@attrs.frozen(kw_only=True)
class IntrospectResponse:
    """Who owns a key and what it may do (NVCF's snake_case)."""

    owner_type: str
    owner_id: str
    key_id: str
    issuer_service_id: str
    authorizations: Authorizations
    nca_id: str


@attrs.frozen(kw_only=True)
class EvaluationInput:
    """``{"apiKey": ...}``."""

    api_key: str = checked(key="apiKey")


@attrs.frozen(kw_only=True)
class EvaluationRequest:
    """Body of ``POST /v1/namespaces/{namespace}/evaluations/{rule}``: ``{"input": {"apiKey": ...}}``."""

    input: EvaluationInput


@attrs.frozen(kw_only=True)
class EvaluationResult:
    """``{allowed}``, and for an allowed key its account, owner and the policy for the namespace's service."""

    allowed: bool
    nca_id: str | None = checked(None, key="ncaId")
    owner_id: str | None = checked(None, key="ownerId")
    policy: Policy | None = None


@attrs.frozen(kw_only=True)
class EvaluationResponse:
    """``{namespace, rule_name, result}``."""

    namespace: str
    rule_name: str
    result: EvaluationResult


def key_policy_document(scopes: tuple[str, ...], resources: list[dict[str, str]], product: Product) -> dict[str, Any]:
    """The authorizations document NVCF's CLI writes for a key."""
    aud = SERVICE_IDS[product]
    return {
        "policies": [
            {"aud": aud, "auds": [aud], "product": product.value, "resources": resources, "scopes": list(scopes)}
        ]
    }
