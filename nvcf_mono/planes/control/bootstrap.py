"""First start: the default account exists; all-in-one also mints a function key and a task key.

The keys' values are kept (mode 0600) in the plugin's state directory so ``endpoints.json`` can
name them again after a restart; a key that expired or was revoked is replaced.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from nvcf_mono.auth import scopes
from nvcf_mono.auth.keystore import ApiKeyStore, effective_status
from nvcf_mono.models.account import Account
from nvcf_mono.models.api_key import (
    FUNCTIONS_SERVICE_ID,
    TASKS_SERVICE_ID,
    Authorizations,
    KeyResource,
    KeyStatus,
    Policy,
    Product,
)
from nvcf_mono.models.common import now_iso
from nvcf_mono.planes.control.context import Control
from nvcf_mono.state_dir import write_private

KEYS_FILE = "bootstrap-keys.json"


async def ensure_account(
    ctl: Control, nca_id: str, name: str | None = None, *, clients: tuple[str, ...] = ()
) -> Account:
    """Create the account if it does not exist (NVCF's bootstrap account has client ``ncp``)."""

    def change(current: Account | None) -> Account:
        if current is not None:
            return current
        return Account(nca_id=nca_id, name=name or nca_id, admin_client_ids=clients, last_updated_at=now_iso())

    account = await ctl.store.accounts.mutate(nca_id, change)
    assert account is not None
    return account


def function_key_authorizations() -> Authorizations:
    """What ``nvcf-cli api-key generate`` asks for a function key."""
    return Authorizations(
        policies=(
            Policy(
                scopes=tuple(sorted(scopes.FUNCTION_KEY_SCOPES)),
                resources=(
                    KeyResource(id="*", type="account-functions"),
                    KeyResource(id="*", type="authorized-functions"),
                ),
                product=Product.FUNCTIONS,
                aud=FUNCTIONS_SERVICE_ID,
                auds=(FUNCTIONS_SERVICE_ID,),
            ),
        )
    )


def task_key_authorizations() -> Authorizations:
    """The eight task scopes over the account's tasks."""
    return Authorizations(
        policies=(
            Policy(
                scopes=tuple(sorted(scopes.TASK_KEY_SCOPES)),
                resources=(KeyResource(id="*", type="account-tasks"),),
                product=Product.TASKS,
                aud=TASKS_SERVICE_ID,
                auds=(TASKS_SERVICE_ID,),
            ),
        )
    )


async def bootstrap_keys(ctl: Control, keys: ApiKeyStore, state_dir: Path) -> dict[str, str]:
    """The bootstrap function and task keys (reused while valid); returns credential name -> value."""
    path = state_dir / KEYS_FILE
    try:
        saved: dict[str, dict[str, str]] = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = {}
    out: dict[str, str] = {}
    lifetime = timedelta(seconds=ctl.config.bootstrap_key_lifetime)
    for name, description, authorizations, service in (
        ("api_key", "bootstrap function key", function_key_authorizations(), FUNCTIONS_SERVICE_ID),
        ("task_api_key", "bootstrap task key", task_key_authorizations(), TASKS_SERVICE_ID),
    ):
        entry = saved.get(name)
        record = keys.find(entry["id"]) if entry else None
        if entry is None or record is None or effective_status(record) is not KeyStatus.ACTIVE:
            record, value = await keys.create(
                nca_id=ctl.config.default_account,
                owner_id="bootstrap",
                description=description,
                authorizations=authorizations,
                expires_in=lifetime,
                issuer_service_id=service,
                audience_service_ids=(service,),
            )
            entry = {"id": record.id, "value": value}
            saved[name] = entry
        out[name] = entry["value"]
    write_private(path, (json.dumps(saved, indent=2) + "\n").encode())
    return out
