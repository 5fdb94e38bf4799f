"""A third-party auth strategy, installed as README's "An auth strategy" shows: its own principal kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvcf_mono.auth.principal import Principal

from .conftest import CONTAINER_FUNCTION, platform

PLUGIN = {"extra_plugins": "[tests.support.plugins:MyAuth]", "plugins.my_auth.enabled": "true"}


async def test_a_plugins_strategy_vouches_with_its_own_kind_and_scopes(tmp_path: Path) -> None:
    async with platform(tmp_path, **PLUGIN) as p:
        assert (await p.admin.post("/v2/nvcf/functions", CONTAINER_FUNCTION)).status == 200
        mine = p.api("my-default")
        listed = await mine.get("/v2/nvcf/functions")
        assert listed.status == 200 and len(listed.json["functions"]) == 1  # the default account's
        assert (await p.api("my-nobody").get("/v2/nvcf/functions")).status == 401  # claimed, and refused
        assert (await mine.post("/v2/nvcf/functions", CONTAINER_FUNCTION)).status == 403  # not among its scopes
        # Only admin tokens and JWTs manage API keys; a plugin's kind is treated like an API key there.
        keys = await mine.get("/v1/keys")
        assert keys.status == 403 and "admin credential" in keys.detail, keys.body
        # Tokens it does not claim still reach the built-in strategies.
        assert (await p.key.get("/v2/nvcf/functions")).status == 200


def test_a_principal_kind_is_a_name() -> None:
    Principal(kind="header_tokens", subject="s", account="a", scopes=frozenset())
    for bad in ("", "Upper", "with space", "x" * 65, "1st"):
        with pytest.raises(ValueError, match=r"Principal\.kind"):
            Principal(kind=bad, subject="s", account="a", scopes=frozenset())
