"""Which node serves a path this one has no route for: the detail of a 404 in a split deployment.

A client that sends pexec to a control node (or a management call to an invocation node) learns
where to go instead of a bare "no route".
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from nvcf_mono.plugin import CONTROL_PLANE, INVOCATION_PLANE, Endpoints

#: Paths of the invocation API (pexec, exec and the LLM gateway); everything else under the API
#: prefixes is the management API.
INVOCATION_PREFIXES = (
    "/v2/nvcf/pexec/",
    "/v2/nvcf/exec/",
    "/v1/chat/",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/models",
)
MANAGEMENT_PREFIXES = ("/v2/nvcf/", "/v1/", "/console")


def route_hint(
    role: str, runs: Collection[str], endpoints: Callable[[], Endpoints | None]
) -> Callable[[str], str | None]:
    """A function from a path to the sentence that says where it is served, or None."""

    def hint(path: str) -> str | None:
        ep = endpoints()
        if path.startswith(INVOCATION_PREFIXES):
            plane, what, url, peer = INVOCATION_PLANE, "invocations", ep and ep.invocation_url, "peers.invocation_url"
        elif path.startswith(MANAGEMENT_PREFIXES):
            plane, what, url, peer = CONTROL_PLANE, "the management API", ep and ep.api_url, "peers.api_url"
        else:
            return None
        if plane in runs:
            return None
        where = f"{url} does" if url else f"and its {peer} is not set"
        return f"this node (role {role}) does not serve {what}, {where}"

    return hint
