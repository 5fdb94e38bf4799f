"""Check real responses against the platform's own ``/v3/openapi`` document.

Tests attach a :class:`ResponseChecker` to their API client, so every JSON response any test sees
is validated against the documented (closed) schema of its operation and status; an undocumented
route or status fails as loudly as a wrong field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012


@attrs.define
class _Route:
    method: str
    template: str
    regex: re.Pattern[str]
    operation: Mapping[str, Any]


def _regex(template: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[^}]+\})", template)
    return re.compile("^" + "".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts) + "$")


class ResponseChecker:
    """Validates (method, path, status, content type, body) against the document."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        self.document = document
        resource = Resource.from_contents(dict(document), default_specification=DRAFT202012)
        self._registry: Registry[Any] = Registry().with_resource("urn:nvcf-mono:openapi", resource)
        self._routes: list[_Route] = []
        for template, methods in document["paths"].items():
            for method, op in methods.items():
                self._routes.append(_Route(method.upper(), template, _regex(template), op))
        # Literal segments beat parameters: /functions/ids before /functions/{functionId}.
        self._routes.sort(key=lambda r: (r.template.count("{"), -len(r.template)))
        self.checked = 0

    def operation(self, method: str, path: str) -> tuple[str, Mapping[str, Any]] | None:
        for route in self._routes:
            if route.method == method.upper() and route.regex.match(path):
                return route.template, route.operation
        return None

    def check(self, method: str, path: str, status: int, content_type: str, body: Any) -> None:
        """Raise AssertionError when the response is not what the document promises."""
        found = self.operation(method, path)
        if found is None and method.upper() == "HEAD" and self.operation("GET", path) is not None:
            return  # every GET answers HEAD (its head, no body to check)
        if found is None:
            if status in (404, 405):
                return  # no route: the server's own 404/405
            raise AssertionError(f"{method} {path} answered {status} but is not in /v3/openapi")
        template, op = found
        if op.get("x-passthrough"):
            return  # the function's own status and body
        responses = op.get("responses", {})
        code = str(status) if str(status) in responses else "default"
        spec = responses.get(code)
        if spec is None:
            raise AssertionError(
                f"{method} {template} answered {status}, which /v3/openapi does not document "
                f"(documented: {sorted(responses)})"
            )
        media = content_type.split(";", 1)[0].strip()
        content = spec.get("content")
        if not content:
            return
        entry = content.get(media)
        if entry is None:
            raise AssertionError(f"{method} {template} {status}: content type {media!r} not in {sorted(content)}")
        schema = entry.get("schema")
        if not schema or body is None:
            return
        location = "/".join(
            _escape(part) for part in ("paths", template, method.lower(), "responses", code, "content", media)
        )
        validator = Draft202012Validator({"$ref": f"urn:nvcf-mono:openapi#/{location}/schema"}, registry=self._registry)
        try:
            validator.validate(body)
        except ValidationError as err:
            where = "/".join(str(p) for p in err.absolute_path) or "<root>"
            raise AssertionError(
                f"{method} {template} {status}: response does not match /v3/openapi at {where}: {err.message}"
            ) from None
        self.checked += 1


def _escape(token: str) -> str:
    """A JSON-pointer reference token."""
    return token.replace("~", "~0").replace("/", "~1")
