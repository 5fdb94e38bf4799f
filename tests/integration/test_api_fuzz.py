"""A bounded, property-based fuzz of the published API against a live platform.

Schemathesis generates requests for every operation of ``/v3/openapi`` (valid ones from the schema,
and invalid ones), with a fixed seed and a few examples each, as the admin and as a function key.
Every answer must be documented: no 5xx, a documented status and content type, a body that matches
the schema. The platform runs the test config (no clusters), so deploys and launches fail cleanly
instead of starting instances.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from nvcf_mono.testing.running import CONTAINER_FUNCTION, platform

pytestmark = pytest.mark.slow

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
#: Examples per operation and mode, per caller: enough to reach every handler's checks, small enough to keep
#: the run well within a minute on two cores (generating bodies, not sending them, is what takes the time).
BUDGET: Mapping[str, Mapping[GenerationMode, int]] = {
    "function key": {GenerationMode.POSITIVE: 1},
    "admin": {GenerationMode.POSITIVE: 3, GenerationMode.NEGATIVE: 2},
}
REQUEST_TIMEOUT = 30.0


def operations(schema: Any) -> Iterator[Any]:
    for result in schema.get_all_operations():
        yield result.ok()


class Fuzzer:
    """Sends each operation's examples (from a worker thread) and collects what the schema does not allow."""

    def __init__(self, base: str, session: requests.Session) -> None:
        self.base = base
        self.session = session
        self.sent = 0
        self.statuses: collections.Counter[int] = collections.Counter()
        self.failures: list[str] = []

    def run(
        self, operation: Any, mode: GenerationMode, examples: int, who: str, token: str, known: Mapping[str, str]
    ) -> None:
        # Valid requests name ids that exist (so they reach the handler's own checks); invalid ones get random
        # ids. A DELETE never names a real item: the run would remove what later operations need.
        fixed = None
        if mode is GenerationMode.POSITIVE and operation.method.upper() != "DELETE":
            fixed = {p.name: known[p.name] for p in operation.path_parameters if p.name in known} or None
        auth = {"Authorization": f"Bearer {token}"}
        strategy = operation.as_strategy(generation_mode=mode, path_parameters=fixed, headers=auth)

        @hypothesis.settings(
            max_examples=examples,
            derandomize=True,  # the fixed seed: the same requests on every run
            database=None,
            deadline=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @hypothesis.given(case=strategy)
        def example(case: Any) -> None:
            self.sent += 1
            response = case.call(
                base_url=self.base,
                session=self.session,
                headers=auth,
                timeout=REQUEST_TIMEOUT,
            )
            self.statuses[response.status_code] += 1
            case.validate_response(response, checks=CHECKS)

        try:
            example()
        except Unsatisfiable:
            pass  # nothing invalid to generate (an operation without parameters or body)
        except (Exception, BaseExceptionGroup) as err:
            self.failures.append(f"{who}, {mode.value}, {operation.method.upper()} {operation.path}:\n{err}")


def fuzz(document: dict[str, Any], base: str, tokens: Mapping[str, str], known: Mapping[str, str]) -> Fuzzer:
    """Every operation's examples for every caller (DELETEs last)."""
    schema = schemathesis.openapi.from_dict(document)
    ordered = sorted(operations(schema), key=lambda op: op.method.upper() == "DELETE")
    with requests.Session() as session:
        fuzzer = Fuzzer(base, session)
        for who, token in tokens.items():
            for operation in ordered:
                for mode, examples in BUDGET[who].items():
                    fuzzer.run(operation, mode, examples, who, token, known)
    return fuzzer


async def test_fuzzed_requests_get_documented_answers_and_never_a_5xx(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        document = (await p.anonymous.get("/v3/openapi")).json
        assert p.admin.token is not None and p.key.token is not None
        tokens = {"function key": p.key.token, "admin": p.admin.token}
        created = await p.admin.post("/v2/nvcf/functions", CONTAINER_FUNCTION)
        assert created.status == 200, created.body
        function = created.json["function"]
        known = {"ncaId": function["ncaId"], "functionId": function["id"], "versionId": function["versionId"]}
        fuzzer = await anyio.to_thread.run_sync(fuzz, document, p.admin.base, tokens, known)
    failures = fuzzer.failures
    assert not failures, f"{len(failures)} operations answered outside /v3/openapi:\n\n" + "\n\n".join(failures[:20])
    assert fuzzer.sent > 500 and fuzzer.statuses[200] > 50, fuzzer.statuses
