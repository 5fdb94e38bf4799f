"""``nvcf-mono invoke``: call a function through pexec, follow its 202s, print its response."""

from __future__ import annotations

import argparse
import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from email.message import Message
from pathlib import Path
from typing import Any

import attrs

from nvcf_mono import __version__
from nvcf_mono.cli.client import ApiClient, add_api_options, connect, positive_float, read_input, save_body
from nvcf_mono.cli.commands import help_of
from nvcf_mono.cli.context import CliContext, CliError
from nvcf_mono.cli.output import emit_json
from nvcf_mono.cli.progress import Progress

PEXEC = "/v2/nvcf/pexec"
DEFAULT_WAIT = 3600.0
#: What the platform waits for a response head when not told (pexec; SSE clients wait longer).
SERVER_POLL = 60
SERVER_STREAM_POLL = 1200
#: Slack on top of the poll window before a silent connection counts as lost.
READ_SLACK = 15.0
CHUNK = 64 * 1024
ERROR_BODY_LIMIT = 1024 * 1024


def _poll_seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole seconds, got {text!r}") from None
    if not 1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be between 1 and 3600, got {value}")
    return value


def register(sub: Any) -> None:
    """Add ``invoke``."""
    invoke = sub.add_parser(
        "invoke",
        help=help_of("invoke"),
        description="POST a body to a function through pexec and print the function's response body to stdout "
        "(bytes as they are). A 202 is followed by polling its status, with progress (wait reason, queue "
        "position, percent complete) on stderr. Exit 0 for a 2xx answer, 1 otherwise. With --json, stdout is "
        "one JSON object in exec's shape: reqId, status, httpStatus and response (the body as JSON, else as text, "
        "else as responseBase64).",
    )
    invoke.add_argument("function_id", metavar="FID")
    invoke.add_argument("--version", dest="version_id", metavar="VID", help="invoke this version (default: any)")
    invoke.add_argument(
        "-d",
        "--data",
        required=True,
        metavar="JSON|@FILE",
        help="the request body: JSON text, or @FILE for a file's bytes (sent as they are; @- reads standard input)",
    )
    invoke.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="send this request header too (repeatable), e.g. -H 'Content-Type: image/png'",
    )
    invoke.add_argument(
        "--poll-seconds",
        type=_poll_seconds,
        metavar="N",
        help="seconds the platform waits for the response before answering 202 (NVCF-POLL-SECONDS, 1-3600)",
    )
    invoke.add_argument(
        "--stream", action="store_true", help="ask for server-sent events and print them as they arrive"
    )
    invoke.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        type=Path,
        help="write the response body to FILE instead of stdout; a result too large to return directly "
        "(a 302 to its download) is downloaded there: a zip of the response and the function's output files",
    )
    invoke.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_WAIT,
        metavar="SECONDS",
        help=f"stop following a 202'd request after this long, exit 1 (default {DEFAULT_WAIT:g})",
    )
    add_api_options(invoke, timeout_flag="--http-timeout")
    invoke.set_defaults(func=_invoke)


def _body(data: str, ctx: CliContext) -> tuple[bytes, str]:
    """The body and its default Content-Type."""
    if data.startswith("@"):
        raw = read_input("--data", data[1:], ctx)  # @- is standard input
        try:
            json.loads(raw)
        except ValueError:
            return raw, "application/octet-stream"
        return raw, "application/json"
    try:
        json.loads(data)
    except ValueError as err:
        raise CliError(f"--data: not valid JSON ({err}); pass @FILE to send a file's bytes as they are") from None
    return data.encode(), "application/json"


def _headers(items: list[str]) -> list[tuple[str, str]]:
    out = []
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or not name.strip() or any(c.isspace() for c in name.strip()):
            raise CliError(f"--header {item!r}: expected NAME:VALUE, e.g. 'Content-Type: text/plain'")
        out.append((name.strip(), value.strip()))
    return out


@attrs.frozen
class _Answer:
    """One HTTP answer, whatever its status, with its body still to read."""

    status: int
    headers: Message
    body: Any  # a file-like with read() and read1()

    def close(self) -> None:
        self.body.close()


def _open(
    client: ApiClient, method: str, path: str, *, body: bytes | None, headers: Mapping[str, str], timeout: float
) -> _Answer:
    url = client.url(path)
    request = urllib.request.Request(url, data=body, headers=dict(headers), method=method)
    try:
        resp = client._opener.open(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        return _Answer(err.code, err.headers, err)  # a 4xx/5xx (or an unfollowed 302) is an answer too
    except urllib.error.URLError as err:
        raise client._unreachable(err.reason, timeout) from None
    except (TimeoutError, ConnectionError) as err:
        raise client._unreachable(err, timeout) from None
    return _Answer(resp.status, resp.headers, resp)


def _waiting(headers: Message) -> str:
    """What a 202 says about the request: why it waits, where it is in the queue, how far it got."""
    parts = [headers.get("NVCF-WAIT-REASON") or "in progress"]
    position = headers.get("NVCF-QUEUE-POSITION")
    if position:
        parts.append(f"position {position} in the queue")
    percent = headers.get("NVCF-PERCENT-COMPLETE")
    if percent:
        parts.append(f"{percent}% complete")
    return ", ".join(parts)


def _write(ctx: CliContext, data: bytes, *, flush: bool) -> None:
    """Bytes to stdout as they are (decoded only when stdout has no byte buffer, e.g. in tests)."""
    buffer = getattr(ctx.stdout, "buffer", None)
    if buffer is None:
        ctx.stdout.write(data.decode(errors="replace"))
        if flush:
            ctx.stdout.flush()
        return
    ctx.stdout.flush()
    buffer.write(data)
    if flush:
        buffer.flush()


def _invoke(args: argparse.Namespace, ctx: CliContext) -> int:
    if args.output is not None and args.json:
        raise CliError("invoke: --output writes the body to a file and --json prints an envelope: choose one")
    body, content_type = _body(args.data, ctx)
    extra = _headers(args.header)
    client = connect(args, ctx, invocation=True)
    cred = client.credential()
    common = {
        "Authorization": f"Bearer {cred.value}",
        "User-Agent": f"nvcf-mono-cli/{__version__}",
        "Accept": "text/event-stream" if args.stream else "*/*",
    }
    if args.poll_seconds is not None:
        common["NVCF-POLL-SECONDS"] = str(args.poll_seconds)
    headers = {**common, "Content-Type": content_type}
    for name, value in extra:
        headers = {k: v for k, v in headers.items() if k.lower() != name.lower()}
        headers[name] = value
    window = args.poll_seconds or (SERVER_STREAM_POLL if args.stream else SERVER_POLL)
    timeout = max(args.http_timeout, window + READ_SLACK)
    path = f"{PEXEC}/functions/{args.function_id}"
    if args.version_id:
        path += f"/versions/{args.version_id}"
    deadline = time.monotonic() + args.timeout
    answer = _open(client, "POST", path, body=body, headers=headers, timeout=timeout)
    progress = Progress(ctx.stderr)
    request_id = answer.headers.get("NVCF-REQID") or ""
    try:
        while answer.status == 202:
            request_id = answer.headers.get("NVCF-REQID") or ""
            answer.body.read()
            answer.close()
            if not request_id:
                raise CliError("HTTP 202 without an NVCF-REQID header: the request cannot be followed", 1)
            progress.show(f"request {request_id}: {_waiting(answer.headers)}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CliError(
                    f"request {request_id} is still running after {args.timeout:g}s; it goes on: fetch its result "
                    f"with GET {PEXEC}/status/{request_id}",
                    1,
                )
            poll = {k: v for k, v in common.items() if k != "NVCF-POLL-SECONDS"}
            poll["NVCF-POLL-SECONDS"] = str(max(1, min(window, int(remaining))))
            answer = _open(client, "GET", f"{PEXEC}/status/{request_id}", body=None, headers=poll, timeout=timeout)
        progress.close()
        return _finish(client, ctx, args, answer)
    except KeyboardInterrupt:
        progress.close()
        if request_id:
            print(
                f"stopped following request {request_id}; fetch its result with GET {PEXEC}/status/{request_id}",
                file=ctx.stderr,
            )
        raise
    finally:
        progress.close()
        answer.close()


def _finish(client: ApiClient, ctx: CliContext, args: argparse.Namespace, answer: _Answer) -> int:
    """Print the final answer; 0 for 2xx (and NVCF's 302 to a large result), else CliError (exit 1)."""
    status = answer.status
    request_id = answer.headers.get("NVCF-REQID") or ""
    media = (answer.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
    if status == 302:
        location = answer.headers.get("Location") or ""
        if args.output is not None:
            # The link is its own authorization: it goes without the bearer.
            link = urllib.request.Request(location, headers={"User-Agent": f"nvcf-mono-cli/{__version__}"})
            size = client.fetch_into(link, args.output, what=f"the large result of request {request_id}")
            print(f"request {request_id}: saved {args.output} ({size} bytes, a zip of the result)", file=ctx.stderr)
            return 0
        note = f"request {request_id}: the result is too large to return directly; download it from this URL"
        print(note, file=ctx.stderr)
        if args.json:
            emit_json(ctx, _envelope(answer, b"", reference=location))
        else:
            _write(ctx, location.encode() + b"\n", flush=True)
        return 0
    if 200 <= status < 300 and args.output is not None:
        size = save_body(answer.body, args.output, what=f"the response of request {request_id}")
        print(f"request {request_id}: saved {args.output} ({size} bytes)", file=ctx.stderr)
        return 0
    if 200 <= status < 300:
        if args.json:
            emit_json(ctx, _envelope(answer, answer.body.read()))
            return 0
        last = b""
        while chunk := answer.body.read1(CHUNK):
            _write(ctx, chunk, flush=args.stream)
            last = chunk
        # On a terminal, end the line (the prompt would follow the body); piped, the bytes are as they are.
        _write(ctx, b"\n" if last and not last.endswith(b"\n") and ctx.stdout.isatty() else b"", flush=True)
        return 0
    raw = answer.body.read(ERROR_BODY_LIMIT)
    if args.json:
        emit_json(ctx, _envelope(answer, raw))
    elif media != "application/problem+json" and raw:
        _write(ctx, raw, flush=True)  # the function's own error answer
    detail = _detail(raw, media) or f"the function answered {status}"
    lines = [f"HTTP {status}: {detail}" + (f" (request {request_id})" if request_id else "")]
    cred = client.credential()
    if status == 401:
        lines.append(f"The {cred.kind} from {cred.origin} was not accepted by {client.api_url}.")
    elif status == 403 and cred.kind == "API key":
        lines.append(
            f"The API key from {cred.origin} needs the invoke_function scope and this function among its resources."
        )
    raise CliError("\n".join(lines), 1)


def _detail(raw: bytes, media: str) -> str:
    if "json" in media:
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            text = doc.get("detail") or doc.get("title") or doc.get("message") or doc.get("error")
            if text:
                return str(text)
    if media.startswith("text/") or "json" in media:
        return raw[:200].decode(errors="replace").strip()
    return ""


def _envelope(answer: _Answer, raw: bytes, *, reference: str | None = None) -> dict[str, Any]:
    """``--json``: the answer in exec's shape, plus the HTTP status."""
    doc: dict[str, Any] = {
        "reqId": answer.headers.get("NVCF-REQID"),
        "status": answer.headers.get("NVCF-STATUS"),
        "httpStatus": answer.status,
    }
    if reference is not None:
        doc["responseReference"] = reference
    elif raw:
        try:
            doc["response"] = json.loads(raw)
        except ValueError:
            try:
                doc["response"] = raw.decode()
            except UnicodeDecodeError:
                doc["responseBase64"] = base64.b64encode(raw).decode()
    return {k: v for k, v in doc.items() if v is not None}
