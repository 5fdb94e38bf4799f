"""The tokens a call used, read from the function's answer as it is relayed (never held whole).

OpenAI's servers report ``usage`` in a JSON answer, in the last chunk of a stream asked with
``stream_options.include_usage``, and (Responses API) in ``response.completed``'s ``response.usage``.
"""

from __future__ import annotations

from nvcf_mono.planes.invocation.llm.shallow import NotJson, ShallowObject

#: A JSON answer larger than this is not searched for its usage (the estimate stands).
JSON_LIMIT = 4 * 1024 * 1024
#: A server-sent event line longer than this is skipped.
LINE_LIMIT = 1024 * 1024


def tokens_in(raw: bytes) -> int | None:
    """``usage``'s total in a chat/completions/embeddings answer or a Responses event (read one level deep)."""
    try:
        doc = ShallowObject.parse(raw)
    except NotJson:
        return None
    usage = doc.get("usage")
    if not isinstance(usage, dict):
        response = doc.inner("response")
        usage = response.get("usage") if response is not None else None
    if not isinstance(usage, dict):
        return None
    total = usage.get("total_tokens")
    if isinstance(total, int):
        return total
    parts = [usage.get(k) for k in ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens")]
    counted = [p for p in parts if isinstance(p, int)]
    return sum(counted) if counted else None


class UsageMeter:
    """Fed each piece of the answer; :attr:`tokens` is the last usage it reported, if any."""

    def __init__(self, *, streaming: bool) -> None:
        self.streaming = streaming
        self.tokens: int | None = None
        self._pending = bytearray()
        self._overflow = False

    def feed(self, chunk: bytes) -> None:
        if self._overflow:
            return
        self._pending += chunk
        if not self.streaming:
            self._overflow = len(self._pending) > JSON_LIMIT
            return
        if b"\n" not in chunk:
            if len(self._pending) > LINE_LIMIT:
                self._pending.clear()
            return
        *lines, rest = bytes(self._pending).split(b"\n")
        self._pending = bytearray(rest)
        if len(rest) > LINE_LIMIT:
            self._pending.clear()
        for line in lines:
            if line.startswith(b"data:") and b'"usage"' in line:
                self._take(line[5:])

    def finish(self) -> int | None:
        """The usage, once the whole answer went through."""
        if not self.streaming and not self._overflow and self._pending:
            self._take(bytes(self._pending))
        elif self.streaming and self._pending.startswith(b"data:"):
            self._take(bytes(self._pending[5:]))
        self._pending.clear()
        return self.tokens

    def _take(self, raw: bytes) -> None:
        found = tokens_in(raw)
        if found is not None:
            self.tokens = found
