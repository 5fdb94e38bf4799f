"""README's plugin examples, taken from the README as a user copies them, run in a platform.

"Writing a plugin" and "An auth strategy" are code a user pastes into a package of their own; when
the README drifts from the API, this is where it shows.
"""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp
import pytest

from nvcf_mono.testing.platform import wait_for
from nvcf_mono.testing.running import CONTAINER_FUNCTION, platform

README = Path(__file__).parents[2] / "README.md"


def readme_block(section: str, marker: str) -> str:
    """The first Python block after the heading ``section`` that contains ``marker``."""
    text = README.read_text()
    start = text.index(f"\n{section}\n")
    for block in re.findall(r"```python\n(.*?)```", text[start:], re.S):
        if marker in block:
            return str(block)
    raise AssertionError(f"README has no Python block with {marker!r} after {section!r}")


async def test_the_readme_plugin_examples_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "readme_examples"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "hello.py").write_text(readme_block("## Writing a plugin", "class Hello("))
    (package / "my_auth.py").write_text(readme_block("### An auth strategy", "class MyAuth("))
    monkeypatch.syspath_prepend(str(tmp_path))
    settings = {
        "extra_plugins": "[readme_examples.hello:Hello, readme_examples.my_auth:MyAuth]",
        "plugins.my_auth.enabled": "true",
        "plugins.hello.greeting": "bonjour",
        "plugins.hello.interval": "0.05",
    }
    async with platform(tmp_path, **settings) as p, aiohttp.ClientSession() as session:

        async def said_thrice() -> dict[str, object] | None:
            async with session.get(f"{p.host.endpoints.url}/hello") as resp:
                assert resp.status == 200, await resp.text()
                doc: dict[str, object] = await resp.json()
            return doc if isinstance(doc["said"], int) and doc["said"] >= 3 else None

        doc = await wait_for(said_thrice, timeout=15, what="the hello plugin's third greeting")
        assert doc["greeting"] == "bonjour"
        assert (await p.bus.stream("HELLO").info()).messages >= 3  # what it announced was stored

        assert (await p.admin.post("/v2/nvcf/functions", CONTAINER_FUNCTION)).status == 200
        mine = p.api("my-secret-token")
        listed = await mine.get("/v2/nvcf/functions")
        assert listed.status == 200 and len(listed.json["functions"]) == 1, listed.body
        assert (await mine.post("/v2/nvcf/functions", CONTAINER_FUNCTION)).status == 403  # not among its scopes
        assert (await p.api("my-other-token").get("/v2/nvcf/functions")).status == 401  # claimed, and refused
        assert (await p.key.get("/v2/nvcf/functions")).status == 200  # tokens it does not claim go on
