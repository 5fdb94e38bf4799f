"""Settings of the LLM gateway (``plugins.invocation.llm_gateway``)."""

from __future__ import annotations

import attrs

from nvcf_mono.structure import at_least, in_range, setting


@attrs.frozen(kw_only=True)
class LlmGatewaySettings:
    """The OpenAI-compatible gateway on the invocation plane's HTTP port."""

    enabled: bool = setting(
        True, doc="Serve /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, /v1/models."
    )
    wait_seconds: int = setting(
        600,
        doc="How long a call waits for the function's answer to start (a function at zero instances starts in "
        "this time); past it the caller gets 504 with NVCF-REQID and the request goes on, its result kept for "
        "/v2/nvcf/pexec/status. OpenAI's clients wait 600 s by default.",
        check=in_range(1, 3600),
    )
    models: dict[str, str] = setting(
        factory=dict,
        doc="Model aliases for every account: name -> '<functionId>' or '<functionId>/<downstream model>' "
        "(a function tag 'model=<name>' registers an alias too). The caller must still be allowed to invoke it.",
    )
    requests_per_minute: int = setting(
        0,
        doc="Per account: requests a minute through the gateway (0: no limit). Every invocation node holds all "
        "of it and takes what the others report their calls took (every 0.5 s).",
        check=at_least(0),
    )
    tokens_per_minute: int = setting(
        0,
        doc="Per account: tokens a minute, estimated before a call (prompt characters / 4 plus max_tokens) and "
        "corrected by the usage the function reports (0: no limit). Shared by the invocation nodes as requests are.",
        check=at_least(0),
    )
    key_requests_per_minute: int = setting(0, doc="The same per API key (0: no limit).", check=at_least(0))
    key_tokens_per_minute: int = setting(0, doc="The same per API key (0: no limit).", check=at_least(0))
