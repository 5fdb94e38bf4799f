"""Secrets at rest: function/task secrets and registry credentials, sealed with the platform secret."""

from __future__ import annotations

import enum

import attrs

from nvcf_mono.models.common import NameValue, max_len
from nvcf_mono.models.function import tags_check
from nvcf_mono.structure import WireModel, checked, wire


@wire
class SealedSecrets(WireModel):
    """The secrets of a function version or task (bucket ``nvcf_secrets``); values sealed as one blob."""

    names: tuple[str, ...]
    sealed: str
    updated_at: str


class ArtifactType(enum.Enum):
    """What a registry credential is used for."""

    CONTAINER = "CONTAINER"
    HELM = "HELM"
    MODEL = "MODEL"
    RESOURCE = "RESOURCE"


class ProvisionedBy(enum.Enum):
    """Who added a registry credential: a user, or the platform (never deletable by users)."""

    USER = "USER"
    SYSTEM = "SYSTEM"


def _artifact_types_check(value: tuple[ArtifactType, ...] | None) -> str | None:
    return None if value is None or value else "must name at least one of CONTAINER, HELM, MODEL, RESOURCE"


@wire
class SecretValue(WireModel):
    """``{name, value}`` of a registry credential (value: base64 of ``user:password``)."""

    name: str = checked(check=max_len(128))
    value: str = checked(check=max_len(32768))


@wire
class RegistryCredential(WireModel):
    """A registry credential as returned (the secret never is)."""

    registry_credential_id: str
    nca_id: str
    registry_credential_name: str
    registry_name: str
    registry_hostname: str
    artifact_types: tuple[ArtifactType, ...]
    provisioned_by: ProvisionedBy
    created_at: str
    last_updated_at: str
    tags: tuple[str, ...] | None = None
    description: str | None = None


@wire
class StoredRegistryCredential(WireModel):
    """A registry credential as stored (bucket ``nvcf_registry_credentials``)."""

    credential: RegistryCredential
    sealed_secret: str


@wire
class AddRegistryCredentialRequest(WireModel):
    """Body of ``POST /v2/nvcf/registry-credentials``."""

    registry_hostname: str = checked(check=max_len(253))
    secret: SecretValue
    artifact_types: tuple[ArtifactType, ...] = checked(check=_artifact_types_check)
    tags: tuple[str, ...] | None = checked(None, check=tags_check)
    description: str | None = checked(None, check=max_len(256))


@wire
class UpdateRegistryCredentialRequest(WireModel):
    """Body of ``PATCH /v2/nvcf/registry-credentials/{id}``: artifact types are added, not replaced."""

    secret: SecretValue | None = None
    artifact_type_enums: tuple[ArtifactType, ...] | None = checked(None, check=_artifact_types_check)


@wire
class RegistryCredentialResponse(WireModel):
    """``{registryCredential}``."""

    registry_credential: RegistryCredential


@wire
class RegistryCredentialListResponse(WireModel):
    """``{registryCredentials}``."""

    registry_credentials: tuple[RegistryCredential, ...]


@wire
class SecretsRequest(WireModel):
    """Body of ``PUT /v2/nvcf/secrets/functions/{fid}/versions/{vid}`` (and of the account's secrets)."""

    secrets: tuple[NameValue, ...]


@wire
class SecretNames(WireModel):
    """The names of an account's secrets (values are never returned)."""

    secrets: tuple[str, ...]


@attrs.frozen
class RecognizedRegistry:
    """A registry NVCF recognises by host name (``*.`` marks any subdomain)."""

    name: str
    hostname: str


@wire
class RecognizedRegistriesByType(WireModel):
    """The recognized registries for each artifact type (keys are the type names)."""

    container: tuple[RecognizedRegistry, ...] = checked(key="CONTAINER")
    helm: tuple[RecognizedRegistry, ...] = checked(key="HELM")
    model: tuple[RecognizedRegistry, ...] = checked(key="MODEL")
    resource: tuple[RecognizedRegistry, ...] = checked(key="RESOURCE")


@wire
class RecognizedRegistriesResponse(WireModel):
    """``{recognizedRegistries: {CONTAINER: [{name, hostname}], HELM: [...], ...}}``."""

    recognized_registries: RecognizedRegistriesByType
