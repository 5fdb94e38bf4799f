"""Declared API operations: auth, scope checks, typed bodies, NVCF JSON, problem+json, and OpenAPI.

A plugin describes each endpoint once as an :class:`Operation` (path, scopes, request and response
types); :class:`ApiRouter` turns them into aiohttp routes and the OpenAPI document is generated from
the same list, so the two cannot drift apart. Handlers receive a :class:`Call` and return an attrs
value (rendered as camelCase JSON with nulls omitted), ``None`` (204), or an aiohttp response.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, Literal, TypeVar, final

import attrs
from aiohttp import web

from nvcf_mono import compact_json
from nvcf_mono.auth.principal import AuthError, Principal
from nvcf_mono.auth.strategy import Authenticator
from nvcf_mono.contracts.ids import ID_RULE, is_id, shown
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.late import Late
from nvcf_mono.plugin import SetupContext
from nvcf_mono.services import ExtensionPoint
from nvcf_mono.structure import Issue, StructureError, camel_case, structure_json, unstructure

B = TypeVar("B")
C = TypeVar("C")

AuthMode = Literal["required", "none"]

#: Deepest nesting of arrays and objects a JSON body may have (values for Helm charts included).
MAX_JSON_DEPTH = 64
#: The largest JSON body an operation reads (``http.max_json_body``, set by the server).
MAX_JSON_BODY = web.AppKey("max_json_body", int)
DEFAULT_MAX_JSON_BODY = 2 * 1024 * 1024


def id_problem(name: str, value: str) -> str | None:
    """Why ``value`` cannot be the path parameter ``name``, or None."""
    if is_id(value):
        return None
    return f"path parameter {name!r} is not a valid id, got {shown(value)!r}: {ID_RULE}"


def check_path_ids(request: web.Request) -> None:
    """400 for a path parameter no stored id can equal (space, '>', non-ASCII, '..', ...)."""
    for name, value in request.match_info.items():
        problem = id_problem(name, value)
        if problem is not None:
            raise ProblemError(400, problem)


@final
@attrs.frozen(kw_only=True)
class Param:
    """A documented query or header parameter."""

    name: str
    description: str
    location: Literal["query", "header"] = "query"
    schema: Mapping[str, Any] = attrs.field(factory=lambda: {"type": "string"})
    required: bool = False


@final
@attrs.frozen(kw_only=True)
class Operation:
    """One endpoint."""

    method: str
    path: str
    handler: Callable[[Call[Any]], Awaitable[Any]]
    summary: str
    tag: str
    scopes: tuple[str, ...] = ()  # the caller needs one of these (none: any authenticated caller)
    auth: AuthMode = "required"
    body: type[Any] | None = None
    body_optional: bool = False
    #: The status of a JSON body past ``http.max_json_body`` (exec answers 400 there, as NVCF's does).
    body_too_large: int = 413
    response: type[Any] | None = None
    status: int = 200
    params: tuple[Param, ...] = ()
    errors: tuple[int, ...] = ()
    #: Content types of a raw (non-JSON) body or response, documented as binary.
    raw_body: str | None = None
    raw_response: str | None = None
    #: The answer is the function's own (any status, any body): documented as a pass-through.
    passthrough: bool = False
    #: Also served under ``<prefix>/accounts/{ncaId}`` for super admins (``admin:<scope>``).
    cross_account: bool = False
    #: The account acted for is the path's ``{ncaId}`` (404 when it does not exist), not the caller's.
    account_from_path: bool = False
    #: This is the cross-account twin of another operation (set by the router).
    twin: bool = False
    deprecated: bool = False
    description: str = ""
    #: HEAD is answered as GET is; false for a GET that hands something out once.
    head: bool = True

    @property
    def operation_id(self) -> str:
        return camel_case(getattr(self.handler, "__name__", "op").lstrip("_"))


#: Operations contributed by every plugin with an API; ``/v3/openapi`` documents them all.
API_OPERATIONS: ExtensionPoint[Operation] = ExtensionPoint("nvcf_mono.http.api_operations")


class Call(Generic[B]):
    """One request to an operation: the caller, the target account, the parsed body."""

    def __init__(
        self,
        request: web.Request,
        operation: Operation,
        *,
        principal: Principal | None,
        body: B,
        account: str,
        cross_account: bool,
    ) -> None:
        self.request = request
        self.operation = operation
        self.principal_or_none = principal
        self.body = body
        self.account = account
        self.cross_account = cross_account

    @property
    def principal(self) -> Principal:
        if self.principal_or_none is None:
            raise RuntimeError(f"{self.operation.path} is public; there is no principal")
        return self.principal_or_none

    def path(self, name: str) -> str:
        return self.request.match_info[name]

    def query(self, name: str) -> str | None:
        return self.request.query.get(name)

    def query_bool(self, name: str, default: bool = False) -> bool:
        raw = self.request.query.get(name)
        if raw is None or raw == "":
            return default
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
        raise ProblemError(400, f"query parameter {name!r} must be true or false, got {raw!r}")

    def query_int(self, name: str, default: int, *, lo: int, hi: int) -> int:
        raw = self.request.query.get(name)
        if raw is None or raw == "":
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ProblemError(400, f"query parameter {name!r} must be an integer, got {raw!r}") from None
        if not lo <= value <= hi:
            raise ProblemError(400, f"query parameter {name!r} must be between {lo} and {hi}, got {value}")
        return value

    def query_list(self, name: str) -> list[str]:
        """Comma-separated and/or repeated values."""
        out: list[str] = []
        for raw in self.request.query.getall(name, []):
            out.extend(v.strip() for v in raw.split(",") if v.strip())
        return out

    def require(self, *scopes: str) -> None:
        """403 unless the caller holds one of ``scopes`` (``admin:`` forms on the cross-account path)."""
        wanted = tuple(f"admin:{s}" for s in scopes) if self.cross_account else scopes
        try:
            self.principal.require(*wanted)
        except AuthError as err:
            raise ProblemError(err.status, err.detail) from err


def json_response(value: Any, status: int = 200) -> web.Response:
    """NVCF JSON: camelCase keys from the models, null fields omitted."""
    body = compact_json.dumps(unstructure(value, omit_none=True))
    return web.Response(status=status, body=body, content_type="application/json")


def _dig(data: Any, path: str) -> Any:
    for part in path.split(".") if path else []:
        if isinstance(data, Mapping):
            data = data.get(part)
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            return None
    return data


def validation_detail(tp: type[Any], raw: Any, issues: Sequence[Issue]) -> str:
    """NVCF's bean-validation text: ``Validation failed: [object=…, field=…, rejected=…, message=…]``."""
    obj = tp.__name__[:1].lower() + tp.__name__[1:]
    parts = []
    for issue in issues:
        rejected = _dig(raw, issue.path)
        text = rejected if isinstance(rejected, str) else json.dumps(rejected)
        parts.append(f"[object={obj}, field={issue.path}, rejected={text[:256]}, message={issue.message}]")
    return "Validation failed: " + ", ".join(parts)


def parse_body(tp: type[B], raw: Any) -> B:
    """Structure a decoded JSON body into ``tp``; 400 with NVCF's validation text on failure."""
    if not isinstance(raw, Mapping):
        raise ProblemError(400, f"Validation failed: the request body must be a JSON object, got {type(raw).__name__}")
    try:
        return structure_json(tp, raw)
    except StructureError as err:
        raise ProblemError(400, validation_detail(tp, raw, err.issues)) from err


async def read_json(request: web.Request, *, optional: bool = False, too_large: int = 413) -> Any:
    """The request's JSON body; 400 (with where it broke) when it is not JSON.

    The text is decoded as the declared charset (UTF-8 when none is); nesting deeper than
    :data:`MAX_JSON_DEPTH` (or than the parser can follow) is a malformed body, not a crash. A body past
    ``http.max_json_body`` is refused (``too_large``) before more of it is read.
    """
    limit = request.config_dict.get(MAX_JSON_BODY, DEFAULT_MAX_JSON_BODY)
    try:
        raw = await read_within(request, limit)
    except BodyTooLarge:
        raise ProblemError(
            too_large,
            f"a JSON request body may be at most {limit} bytes (http.max_json_body); hand large inputs to a "
            "function as assets, or as a pexec body",
        ) from None
    charset = request.charset or "utf-8"
    try:
        text = raw.decode(charset)
    except LookupError:
        raise ProblemError(400, f"Malformed JSON request body: unknown charset {charset[:64]!r}") from None
    except UnicodeDecodeError as err:
        raise ProblemError(400, f"Malformed JSON request body: not valid {charset} text ({err.reason})") from None
    if not text.strip():
        if optional:
            return {}
        raise ProblemError(400, "Required request body is missing")
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise ProblemError(400, f"Malformed JSON request body: {err}") from err
    except RecursionError:
        doc = None
    else:
        if _depth_within(doc, MAX_JSON_DEPTH):
            return doc
    raise ProblemError(400, f"Malformed JSON request body: nested deeper than {MAX_JSON_DEPTH} levels")


class BodyTooLarge(Exception):
    """A request body past the limit its reader was given."""


async def read_within(request: web.Request, limit: int, *, each: Callable[[int], None] | None = None) -> bytearray:
    """The whole body; :class:`BodyTooLarge` as soon as it is known to pass ``limit`` (by its
    Content-Length before any of it is read, else once what came passes it). ``each`` is told each
    piece's size before the piece is kept, and may raise to refuse it.
    """
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(limit)
    raw = bytearray()
    async for chunk in request.content.iter_any():  # read() may stop at any piece; this reads to the end
        if each is not None:
            each(len(chunk))
        raw += chunk
        if len(raw) > limit:
            raise BodyTooLarge(limit)
    return raw


def _depth_within(doc: Any, limit: int) -> bool:
    """Whether arrays and objects nest at most ``limit`` deep (iterative: no recursion on hostile input).

    Level by level, and only containers go to the next level: a body of many small values costs a
    comprehension per container, not a loop turn per value (a 2 MiB body of ``{}`` took 0.76 s the
    other way, on the event loop).
    """
    level: list[Any] = [doc] if type(doc) is dict or type(doc) is list else []
    depth = 1
    while level:
        if depth > limit:
            return False
        below: list[Any] = []
        for item in level:
            if item:
                values = item.values() if type(item) is dict else item
                below += [child for child in values if type(child) is dict or type(child) is list]
        level = below
        depth += 1
    return True


#: A handler declared at module level: the plugin's context first, then the call.
ContextHandler = Callable[[C, Call[Any]], Awaitable[Any]]


def alias(handler: ContextHandler[C], name: str) -> ContextHandler[C]:
    """The same handler under another operation id, for a second path of one endpoint."""

    async def aliased(context: C, call: Call[Any]) -> Any:
        return await handler(context, call)

    aliased.__name__ = name
    return aliased


@final
class Routes(Generic[C]):
    """Operations declared at module level, in the style of aiohttp's ``RouteTableDef``.

    Handlers are plain functions ``handler(context, call)``; :meth:`bind` gives them the plugin's
    context (made in ``setup()``) and adds them to its router.
    """

    def __init__(self) -> None:
        self._declared: list[tuple[str, str, ContextHandler[C], dict[str, Any]]] = []

    def route(self, method: str, path: str, **options: Any) -> Callable[[ContextHandler[C]], ContextHandler[C]]:
        """Declare ``handler`` as the operation ``method path`` (options as :class:`Operation`'s)."""

        def declare(handler: ContextHandler[C]) -> ContextHandler[C]:
            self._declared.append((method, path, handler, options))
            return handler

        return declare

    def bind(self, router: ApiRouter, context: C) -> None:
        """Add every declared operation to ``router``, its handler given ``context``."""
        for method, path, handler, options in self._declared:
            router.add(Operation(method=method.upper(), path=path, handler=_given(handler, context), **options))


def _given(handler: ContextHandler[C], context: C) -> Callable[[Call[Any]], Awaitable[Any]]:
    async def call(request: Call[Any]) -> Any:
        return await handler(context, request)

    call.__name__ = handler.__name__  # the OpenAPI operation id
    call.__doc__ = handler.__doc__
    return call


AccountCheck = Callable[[str], Awaitable[bool]]


@attrs.frozen
class Gatekeeper:
    """Who may call the routes: the auth chain, and (control plane) whether an account exists."""

    authenticator: Authenticator
    account_exists: AccountCheck | None = None


@final
class ApiRouter:
    """Operations of one plugin: install() in setup(); ``gatekeeper`` is set in run()."""

    def __init__(self, *, cross_account_prefixes: Mapping[str, str] | None = None) -> None:
        self._operations: list[Operation] = []
        self.gatekeeper: Late[Gatekeeper] = Late("authentication")
        # "/v2/nvcf/x" -> "/v2/nvcf/accounts/{ncaId}/x" (and the tasks API likewise) for cross-account twins.
        self._prefixes = dict(
            cross_account_prefixes
            or {"/v2/nvcf/": "/v2/nvcf/accounts/{ncaId}/", "/v1/nvct/": "/v1/nvct/accounts/{ncaId}/"}
        )

    @property
    def operations(self) -> tuple[Operation, ...]:
        """Every operation, cross-account twins included."""
        return tuple(self._expand())

    def add(self, operation: Operation) -> None:
        self._operations.append(operation)

    def route(self, method: str, path: str, **options: Any) -> Callable[[Any], Any]:
        """Decorator form of :meth:`add`."""

        def register(handler: Callable[[Call[Any]], Awaitable[Any]]) -> Callable[[Call[Any]], Awaitable[Any]]:
            self.add(Operation(method=method.upper(), path=path, handler=handler, **options))
            return handler

        return register

    def install(self, ctx: SetupContext, extension_point: ExtensionPoint[Operation] = API_OPERATIONS) -> None:
        """Add every operation as a route of the plugin, and to the OpenAPI document."""
        for op in self._expand():
            ctx.add_route(op.method, op.path, self._handler(op), name=None, head=op.head)
            ctx.extend(extension_point, op)

    def _expand(self) -> Iterator[Operation]:
        for op in self._operations:
            yield op
            if not op.cross_account:
                continue
            for prefix, twin in self._prefixes.items():
                if op.path.startswith(prefix):
                    yield attrs.evolve(
                        op,
                        path=twin + op.path[len(prefix) :],
                        scopes=tuple(f"admin:{s}" for s in op.scopes),
                        cross_account=False,
                        account_from_path=True,
                        twin=True,
                        summary=f"{op.summary} (any account; super admin)",
                        description=op.description,
                    )
                    break

    def _handler(self, op: Operation) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        twin = op.account_from_path

        async def handle(request: web.Request) -> web.StreamResponse:
            principal: Principal | None = None
            account = ""
            if op.auth == "required":
                gate = self.gatekeeper.get()
                try:
                    principal = await gate.authenticator.authenticate(request.headers.get("Authorization"))
                    if op.scopes:
                        principal.require(*op.scopes)
                except AuthError as err:
                    raise ProblemError(err.status, err.detail) from err
                account = principal.account
                check_path_ids(request)
                if twin:
                    account = request.match_info["ncaId"]
                    if gate.account_exists is not None and not await gate.account_exists(account):
                        raise ProblemError(404, f"account {account!r} not found")
            else:
                check_path_ids(request)
            body: Any = None
            if op.body is not None:
                body = parse_body(
                    op.body, await read_json(request, optional=op.body_optional, too_large=op.body_too_large)
                )
            result = await op.handler(
                Call(request, op, principal=principal, body=body, account=account, cross_account=twin)
            )
            if isinstance(result, web.StreamResponse):
                return result
            if result is None:
                return web.Response(status=204)
            return json_response(result, op.status)

        handle.__name__ = op.operation_id
        return handle
