"""A small synchronous client for the platform's REST API, with NVCF's CLI's choice of credential.

Where things come from, first match wins: flags (``--api-url``, ``--token``, ``--api-key``), then
the environment (``NVCF_API_URL``, ``NVCF_TOKEN``, ``NVCF_API_KEY``), then ``endpoints.json`` in the
state directory of a platform started here. Credentials are taken as a set from the first of those
that has any, so an explicit ``--api-key`` is never overridden by a token found further down.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from http.client import HTTPMessage
from pathlib import Path
from typing import IO, Any

import attrs

from nvcf_mono import __version__
from nvcf_mono.cli.context import CliContext, CliError
from nvcf_mono.contracts.ids import ID_RULE, is_id, shown
from nvcf_mono.state_dir import ENDPOINTS_FILE

DEFAULT_STATE_DIR = ".nvcf-mono"
DEFAULT_TIMEOUT = 30.0
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_SOURCES = (
    "pass --token (or --api-key), set NVCF_TOKEN (or NVCF_API_KEY), or point --state-dir at a platform "
    "started with `nvcf-mono up` (its endpoints.json holds the credentials)"
)

#: Read size of downloads (task results).
DOWNLOAD_CHUNK = 256 * 1024


def positive_float(text: str) -> float:
    """An argparse type: a number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text!r}")
    return value


def add_api_options(parser: argparse.ArgumentParser, *, timeout_flag: str = "--timeout") -> None:
    """--api-url, --token, --api-key, --state-dir, the HTTP timeout and --json."""
    parser.add_argument("--json", action="store_true", help="print the raw JSON response")
    group = parser.add_argument_group("API connection")
    group.add_argument(
        "--api-url", metavar="URL", help="the platform's API (default: env NVCF_API_URL, else the state dir's)"
    )
    group.add_argument("--token", metavar="TOKEN", help="admin token or JWT for management calls (env NVCF_TOKEN)")
    group.add_argument("--api-key", metavar="KEY", help="API key, used when there is no token (env NVCF_API_KEY)")
    group.add_argument(
        "--state-dir",
        metavar="DIR",
        help=f"state directory of a local platform, read for its endpoints.json (env NVCF_MONO_STATE_DIR; "
        f"default {DEFAULT_STATE_DIR})",
    )
    group.add_argument(
        timeout_flag,
        dest="http_timeout",
        type=positive_float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"give up on one HTTP call after this long (default {DEFAULT_TIMEOUT:g})",
    )


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """These calls are never redirected; following one would hand the bearer to wherever it points."""

    def redirect_request(  # noqa: PLR0917 (urllib's signature)
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        return None


@attrs.frozen
class Credential:
    """A bearer and where it came from (for error messages)."""

    value: str
    kind: str  # "token" or "API key"
    origin: str


class ApiClient:
    """Calls the API with the right credential; failures become :class:`CliError` (exit 1)."""

    def __init__(
        self,
        api_url: str,
        url_origin: str,
        *,
        token: Credential | None,
        api_key: Credential | None,
        timeout: float,
        proxies: Mapping[str, str],
        ca_file: str | None = None,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.url_origin = url_origin
        self.token = token
        self.api_key = api_key
        self.timeout = timeout
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler(dict(proxies)), _NoRedirect()]
        if ca_file is not None:  # a local platform's development CA (else the system's CAs, or SSL_CERT_FILE)
            try:
                context = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as err:
                why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
                raise CliError(f"cannot read the CA certificates to trust from {ca_file}: {why}") from None
            handlers.append(urllib.request.HTTPSHandler(context=context))
        self._opener = urllib.request.build_opener(*handlers)

    def credential(self) -> Credential:
        """The token when there is one, else the API key."""
        cred = self.token or self.api_key
        if cred is None:  # connect() refuses to build a client without either
            raise CliError(f"no credentials: {_SOURCES}")
        return cred

    def url(self, path: str) -> str:
        """The API's URL of ``path``, whose segments are the API's literals and ids from the command line.

        An id is put into the path as it was given, so one no path can hold (a space, '?', '#', '..') is
        refused here, before anything is sent, with the server's own rule. (One with '/' in it makes
        segments that may each pass; the server then finds no such route.)
        """
        for segment in path.split("/")[1:]:
            if not is_id(segment):
                raise CliError(f"{shown(segment)!r} is not a valid id: {ID_RULE}")
        return self.api_url + path

    def call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        management: bool,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """One request; the parsed JSON body (None for an empty one)."""
        cred = self.credential()
        url = self.url(path) + (f"?{urllib.parse.urlencode(query)}" if query else "")
        hdrs = {
            "Authorization": f"Bearer {cred.value}",
            "Accept": "application/json",
            "User-Agent": f"nvcf-mono-cli/{__version__}",
            **(headers or {}),
        }
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=hdrs, method=method)
        limit = timeout if timeout is not None else self.timeout
        try:
            with self._opener.open(request, timeout=limit) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            raise self._http_error(err, cred, management) from None
        except urllib.error.URLError as err:
            raise self._unreachable(err.reason, limit) from None
        except (TimeoutError, ConnectionError) as err:
            raise self._unreachable(err, limit) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise CliError(f"{method} {url}: the answer is not JSON: {raw[:200]!r}", 1) from None

    def get(self, path: str, *, management: bool = False, **kw: Any) -> Any:
        return self.call("GET", path, management=management, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Any:
        return self.call("POST", path, body=body, management=True, **kw)

    def put(self, path: str, body: Any = None, **kw: Any) -> Any:
        return self.call("PUT", path, body=body, management=True, **kw)

    def patch(self, path: str, body: Any = None, **kw: Any) -> Any:
        return self.call("PATCH", path, body=body, management=True, **kw)

    def delete(self, path: str, **kw: Any) -> Any:
        return self.call("DELETE", path, management=True, **kw)

    def download(self, path: str, dest: Path) -> int:
        """Stream ``path`` into the file ``dest`` (written whole or not at all); its size."""
        cred = self.credential()
        request = urllib.request.Request(
            self.url(path),
            headers={"Authorization": f"Bearer {cred.value}", "User-Agent": f"nvcf-mono-cli/{__version__}"},
            method="GET",
        )
        return self.fetch_into(request, dest, what=path)

    def fetch_into(self, request: urllib.request.Request, dest: Path, *, what: str) -> int:
        """The answer to ``request`` into the file ``dest``; its size. An error status is the API's error."""
        try:
            # The client's own opener: its proxies, and never a redirect that would carry the bearer elsewhere.
            with self._opener.open(request, timeout=self.timeout) as resp:
                return save_body(resp, dest, what=what)
        except urllib.error.HTTPError as err:
            raise self._http_error(err, self.credential(), False) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            raise CliError(f"download of {what} failed: {err}", 1) from None

    def _unreachable(self, reason: object, timeout: float) -> CliError:
        where = f"the API at {self.api_url} (from {self.url_origin})"
        if isinstance(reason, TimeoutError):
            return CliError(f"no answer from {where} within {timeout:g}s (raise it with --timeout)", 1)
        if isinstance(reason, ConnectionRefusedError):
            lines = [
                f"cannot connect to {where}: connection refused.",
                "Is the platform running? Start it with `make up` or `nvcf-mono up`.",
            ]
            if self.url_origin.endswith(ENDPOINTS_FILE):
                lines.append(f"({self.url_origin} stays behind when the platform that wrote it stops.)")
            return CliError("\n".join(lines), 1)
        text = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
        return CliError(f"cannot connect to {where}: {text}", 1)

    def _http_error(self, err: urllib.error.HTTPError, cred: Credential, management: bool) -> CliError:
        try:
            raw = err.read()
        except OSError:
            raw = b""
        detail = ""
        try:
            doc = json.loads(raw) if raw else None
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            detail = str(doc.get("detail") or doc.get("title") or doc.get("message") or "")
        if not detail:
            detail = raw[:200].decode(errors="replace").strip() or str(err.reason)
        lines = [f"HTTP {err.code}: {detail}"]
        if err.code == 401:
            lines.append(f"The {cred.kind} from {cred.origin} was not accepted by {self.api_url}.")
        elif err.code == 403 and management and cred.kind == "API key":
            lines.append(
                f"This used the API key from {cred.origin}; management commands need a token with the "
                "scope: pass --token or set NVCF_TOKEN."
            )
        return CliError("\n".join(lines), 1)


def save_body(resp: Any, dest: Path, *, what: str) -> int:
    """An HTTP answer's body into the file ``dest``, written whole or not at all; its size.

    Short of its ``Content-Length`` (the connection broke) it is an error, and ``dest`` is left as it was.
    """
    partial = dest.with_name(f".{dest.name}.partial")
    received = 0
    expected = resp.headers.get("Content-Length")
    try:
        with partial.open("wb") as out:
            while chunk := resp.read(DOWNLOAD_CHUNK):
                out.write(chunk)
                received += len(chunk)
        if expected is not None and received != int(expected):
            raise CliError(f"download of {what} was cut short after {received} of {expected} bytes; try again", 1)
        os.replace(partial, dest)
    except (TimeoutError, ConnectionError) as err:
        raise CliError(f"download of {what} failed after {received} bytes: {err}", 1) from None
    except OSError as err:
        raise CliError(f"cannot write {dest}: {err.strerror or err}", 1) from None
    finally:
        partial.unlink(missing_ok=True)
    return received


def _state_dir(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[Path, str]:
    flag = getattr(args, "state_dir", None)
    if flag:
        return Path(flag), "--state-dir"
    for name in ("NVCF_MONO_STATE_DIR", "NVCF_MONO__STATE_DIR"):
        if environ.get(name):
            return Path(environ[name]), name
    return Path(DEFAULT_STATE_DIR), "the default state directory"


def _read_endpoints(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise CliError(f"cannot read {path}: {err.strerror or err}") from None
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise CliError(f"{path} is not valid JSON ({err}); restart the platform to rewrite it") from None
    if not isinstance(doc, dict):
        raise CliError(f"{path} is not an endpoints document; restart the platform to rewrite it")
    return doc


def _proxies(environ: Mapping[str, str], url: str) -> dict[str, str]:
    """Proxies from the given environment (urllib's own lookup would read the process's)."""
    found: dict[str, str] = {}
    for lower in (False, True):  # the lowercase variable wins, as in urllib
        for name, value in environ.items():
            if value and name.lower().endswith("_proxy") and (name.islower() == lower):
                found[name.lower().removesuffix("_proxy")] = value
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    bypass = [entry.strip().lower().lstrip(".") for entry in found.pop("no", "").split(",") if entry.strip()]
    if host in _LOOPBACK or any(e in ("*", host) or host.endswith("." + e) for e in bypass):
        return {}
    return found


def _same_url(a: str, b: str) -> bool:
    return a.rstrip("/").lower() == b.rstrip("/").lower()


def connect(args: argparse.Namespace, ctx: CliContext, *, invocation: bool = False) -> ApiClient:
    """The client the command line and environment describe; exit 2 when something is missing.

    Without --api-url or NVCF_API_URL, ``endpoints.json`` says where to go: its ``api_url`` for the
    management API, its ``invocation_url`` (an invocation node in a split deployment) for invocations.
    """
    env = ctx.environ
    state_dir, state_origin = _state_dir(args, env)
    endpoints_path = state_dir / ENDPOINTS_FILE
    state = _read_endpoints(endpoints_path)
    field = "invocation_url" if invocation else "api_url"
    state_url = state.get(field) if state else None
    if args.api_url:
        url, url_origin = args.api_url, "--api-url"
    elif env.get("NVCF_API_URL"):
        url, url_origin = env["NVCF_API_URL"], "env NVCF_API_URL"
    elif isinstance(state_url, str) and state_url:
        url, url_origin = state_url, str(endpoints_path)
    elif state is not None:
        what, peer = ("invocations", "peers.invocation_url") if invocation else ("the management API", "peers.api_url")
        raise CliError(
            f"{endpoints_path} is a {state.get('role', 'platform')} node's and does not say where {what} are "
            f"served: pass --api-url, or set {peer} on that node"
        )
    else:
        raise CliError(
            f"no API URL: pass --api-url, set NVCF_API_URL, or start the platform with `nvcf-mono up` "
            f"(it writes {endpoints_path}; {state_origin} has none)"
        )
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CliError(f"{url_origin} {url!r}: expected an http:// or https:// URL, e.g. http://127.0.0.1:8080")

    layers: list[tuple[str | None, str | None, str, str]] = [
        (args.token, args.api_key, "--token", "--api-key"),
        (env.get("NVCF_TOKEN"), env.get("NVCF_API_KEY"), "env NVCF_TOKEN", "env NVCF_API_KEY"),
    ]
    state_is_elsewhere = False
    ca_file: str | None = None
    if state is not None:
        creds = state.get("credentials")
        creds = creds if isinstance(creds, dict) else {}
        # Never send a local platform's credentials to some other server than its own nodes.
        ours = [state.get(name) for name in ("api_url", "invocation_url", "node_url")]
        if any(isinstance(known, str) and _same_url(known, url) for known in ours):
            origin = str(endpoints_path)
            layers.append((creds.get("admin_token"), creds.get("api_key"), origin, origin))
            ca = state.get("ca_file")
            ca_file = ca if isinstance(ca, str) and ca else None
        else:
            state_is_elsewhere = True
    token = api_key = None
    for tok, key, tok_origin, key_origin in layers:
        if tok or key:
            token = Credential(tok, "token", tok_origin) if tok else None
            api_key = Credential(key, "API key", key_origin) if key else None
            break
    if token is None and api_key is None:
        note = f" ({endpoints_path} is for {state_url}, not {url})" if state_is_elsewhere else ""
        raise CliError(f"no credentials for {url}: {_SOURCES}{note}")
    return ApiClient(
        url,
        url_origin,
        token=token,
        api_key=api_key,
        timeout=args.http_timeout,
        proxies=_proxies(env, url),
        ca_file=ca_file,
    )


# ---- argument helpers shared by the API commands ---------------------------------------------------


def for_account(path: str, account: str | None) -> str:
    """``/v2/nvcf/<rest>`` as the caller's own, or as ``account``'s (``/v2/nvcf/accounts/<account>/<rest>``,
    for super admins) when one is named.
    """
    return path.replace("/v2/nvcf/", f"/v2/nvcf/accounts/{account}/", 1) if account else path


def csv_list(text: str) -> list[str]:
    """An argparse type: ``a,b`` -> ``["a", "b"]`` (blanks dropped; ``""`` gives ``[]``)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def upper(text: str) -> str:
    """An argparse type for enum flags: NVCF's values are upper case, ``--function-type streaming`` works too."""
    return text.upper()


def key_value(flag: str, item: str) -> tuple[str, str]:
    """``KEY=VALUE`` -> ``(KEY, VALUE)``; anything else is a usage error (exit 2)."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise CliError(f"{flag} {item!r}: expected KEY=VALUE")
    return key.strip(), value


def merged_pairs(flag: str, items: list[str], existing: Any, key_name: str) -> list[dict[str, Any]]:
    """Merge ``K=V`` flags over a list of ``{key_name, value}`` from a file (same name: the flag wins)."""
    merged: dict[str, Any] = {}
    if isinstance(existing, list):
        for entry in existing:
            if isinstance(entry, dict) and key_name in entry:
                merged[str(entry[key_name])] = entry.get("value")
    for item in items:
        key, value = key_value(flag, item)
        merged[key] = value
    return [{key_name: k, "value": v} for k, v in merged.items()]


def read_input(flag: str, path: str, ctx: CliContext) -> bytes:
    """The bytes of a file named on the command line, ``-`` being standard input (exit 2 when unreadable)."""
    try:
        if path != "-":
            return Path(path).read_bytes()
        if ctx.stdin is None:
            raise CliError(f"{flag} -: there is no standard input to read")
        if ctx.stdin_read_by:
            raise CliError(f"{flag} -: standard input can be read once")
        ctx.stdin_read_by.append(flag)
        return ctx.stdin.read()
    except OSError as err:
        raise CliError(f"{flag} {path}: {err.strerror or err}") from None


def read_text(flag: str, path: str, ctx: CliContext) -> str:
    """A secret's text from a file named on the command line (``-``: standard input), without its final
    line break (what an editor or ``echo`` leaves); exit 2 when it cannot be read or is not UTF-8.
    """
    data = read_input(flag, path, ctx)
    try:
        return data.decode().removesuffix("\n").removesuffix("\r")
    except UnicodeDecodeError:
        raise CliError(f"{flag} {path}: is not UTF-8 text") from None


def read_json_object(flag: str, path: str, ctx: CliContext) -> dict[str, Any]:
    """A JSON object from a file named on the command line (exit 2 when it is not one)."""
    try:
        doc = json.loads(read_input(flag, path, ctx))
    except ValueError as err:
        raise CliError(f"{flag} {path}: not valid JSON: {err}") from None
    if not isinstance(doc, dict):
        raise CliError(f"{flag} {path}: expected a JSON object, got {type(doc).__name__}")
    return doc
