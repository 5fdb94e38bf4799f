"""Delegation tokens as the auth strategy sees them, without a platform (no API key minted them)."""

from __future__ import annotations

import pytest

from nvcf_mono.auth.delegation import KIND, DelegationTokens
from nvcf_mono.auth.principal import AuthError, Principal
from nvcf_mono.auth.secret import Keyring, PlatformSecret
from nvcf_mono.auth.tokens import TokenSigner, mint_worker_token
from tests.support.tampering import altered

FID, VID = "3f0c8a52-5a42-4e3e-9a55-1c2b8e0d7a10", "9b1d6e7c-2f3a-4b5c-8d9e-0a1b2c3d4e5f"
MINTER = Principal(kind="jwt", subject="alice", account="team-a", scopes=frozenset({"invoke_function"}))


def tokens(keyring: Keyring) -> DelegationTokens:
    t = DelegationTokens(lifetime=600)
    t.bind(keyring, None)
    return t


@pytest.fixture
def keyring() -> Keyring:
    k = Keyring()
    k.load(PlatformSecret.generate())
    return k


async def test_the_token_makes_a_principal_for_the_client(keyring: Keyring) -> None:
    t = tokens(keyring)
    token, ttl = t.mint(MINTER, client_id="partner", functions=[(FID, None), (FID, VID)], key=None)
    assert ttl == 600
    principal = await t.authenticate(token)
    assert principal is not None
    assert (principal.kind, principal.subject, principal.account) == (KIND, "partner", "team-a")
    assert principal.scopes == frozenset({"invoke_function"}) and principal.key_id is None
    assert principal.resources is not None and principal.resources.functions == {(FID, "*"), (FID, VID)}
    # Own account's other functions are out: the token names functions, not the account.
    assert not principal.resources.account_functions and not principal.resources.authorized_functions


async def test_other_tokens_are_left_to_other_strategies(keyring: Keyring) -> None:
    t = tokens(keyring)
    assert await t.authenticate("nvapi-something") is None
    worker = mint_worker_token(
        TokenSigner(keyring.token_key), nca_id="team-a", function_id=FID, function_version_id=VID, request_id="r"
    )
    assert await t.authenticate(worker) is None  # a platform token, of another kind


async def test_forged_expired_and_foreign_tokens_are_refused(keyring: Keyring) -> None:
    t = tokens(keyring)
    token, _ = t.mint(MINTER, client_id="partner", functions=[(FID, None)], key=None)
    with pytest.raises(AuthError) as err:
        await t.authenticate(altered(token))
    assert err.value.status == 401 and "signature" in err.value.detail
    # Minted with another platform secret.
    other = Keyring()
    other.load(PlatformSecret.generate())
    foreign, _ = tokens(other).mint(MINTER, client_id="partner", functions=[(FID, None)], key=None)
    with pytest.raises(AuthError):
        await t.authenticate(foreign)
    expired = TokenSigner(keyring.token_key).mint(KIND, {"nca": "a", "sub": "c", "fn": []}, ttl=-1)
    with pytest.raises(AuthError) as err:
        await t.authenticate(expired)
    assert "expired" in err.value.detail
    incomplete = TokenSigner(keyring.token_key).mint(KIND, {"nca": "a"}, ttl=60)
    with pytest.raises(AuthError) as err:
        await t.authenticate(incomplete)
    assert "incomplete" in err.value.detail


async def test_a_token_naming_a_key_is_refused_where_keys_cannot_be_checked(keyring: Keyring) -> None:
    t = tokens(keyring)
    keyed = TokenSigner(keyring.token_key).mint(
        KIND, {"nca": "a", "sub": "c", "fn": [f"{FID}/*"], "key": "k1", "kf": "x"}, ttl=60
    )
    with pytest.raises(AuthError) as err:
        await t.authenticate(keyed)
    assert "no API keys" in err.value.detail
