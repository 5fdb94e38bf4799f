"""The example function's marker: what the control plane remembers of it, and what the banner prints.

The control plane writes ``example-function.json`` in its plugin state directory (``pending`` until
the example is deployed, then ``deployed``; ``removed`` once the function is found deleted); the
CLI's ready banner reads it to print how to invoke the example.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Literal

import attrs

from nvcf_mono.contracts import buckets

MARKER_FILE = "example-function.json"
NAME = "echo-example"
#: What the ready banner and the log suggest sending.
SAMPLE_BODY = '{"message":"hello"}'
State = Literal["pending", "deployed", "removed"]


@attrs.frozen(kw_only=True)
class Marker:
    """What the platform remembers of its example function."""

    function_id: str
    version_id: str
    state: State

    @property
    def key(self) -> str:
        return buckets.version_key(self.function_id, self.version_id)


def marker_path(plugin_state_dir: Path) -> Path:
    """Where the marker lives, given the control plugin's state directory."""
    return plugin_state_dir / MARKER_FILE


def read_marker(plugin_state_dir: Path) -> Marker | None:
    """The marker, or None when there is none (or it cannot be read)."""
    try:
        doc = json.loads(marker_path(plugin_state_dir).read_text())
        state = doc["state"]
        if state not in ("pending", "deployed", "removed"):
            return None
        return Marker(function_id=str(doc["function_id"]), version_id=str(doc["version_id"]), state=state)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def invoke_lines(
    function_id: str, invocation_url: str, state_dir: Path, endpoints: Path, ca_file: str | None = None
) -> list[str]:
    """Copy-paste commands that invoke the example: ``curl`` and ``nvcf-mono invoke``.

    The key itself is never printed (the banner ends up in logs): the first line reads it from
    ``endpoints.json`` into ``NVCF_API_KEY``, which the ``curl`` line uses.
    """
    url = f"{invocation_url.rstrip('/')}/v2/nvcf/pexec/functions/{function_id}"
    read_key = 'import json,sys; print(json.load(open(sys.argv[1]))["credentials"]["api_key"])'
    export = f'export NVCF_API_KEY="$(python3 -c {shlex.quote(read_key)} {shlex.quote(str(endpoints))})"'
    cacert = f"--cacert {shlex.quote(ca_file)} " if ca_file else ""
    curl = (
        f'curl -s {cacert}{url} -H "Authorization: Bearer $NVCF_API_KEY" '
        f"-H 'Content-Type: application/json' -d {shlex.quote(SAMPLE_BODY)}"
    )
    state = "" if state_dir == Path(".nvcf-mono") else f" --state-dir {shlex.quote(str(state_dir))}"
    return [
        f"  key         {export}",
        f"  curl        {curl}",
        f"  CLI         nvcf-mono invoke {function_id}{state} -d {shlex.quote(SAMPLE_BODY)}",
    ]
