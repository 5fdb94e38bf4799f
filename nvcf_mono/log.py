"""Logging to stderr, as text for people or JSON lines for collectors.

Every line written while a task serves one invocation names it: the invocation node and the worker
bind the request id, function and version to the task (:func:`bind`, a context variable each task
copies), and a filter on the handler puts them on the record. Text lines end with them in brackets;
JSON lines carry them as fields, with whatever ``extra`` fields the call gave.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import IO, Any, final

from nvcf_mono.config.model import LoggingSettings
from nvcf_mono.printable import one_line

#: The invocation the current task serves: (request id, function id, function version id).
_serving: contextvars.ContextVar[tuple[str, str, str] | None] = contextvars.ContextVar("nvcf_serving", default=None)
#: What every LogRecord has: anything else on one came from ``extra``.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "taskName"}


def bind(request_id: str, function_id: str, version_id: str) -> contextvars.Token[tuple[str, str, str] | None]:
    """Name the invocation this task serves in its log lines (until :func:`unbind`)."""
    return _serving.set((request_id, function_id, version_id))


def unbind(token: contextvars.Token[tuple[str, str, str] | None]) -> None:
    _serving.reset(token)


class RequestContext(logging.Filter):
    """Puts the task's invocation on each record (unless the call named one in ``extra``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        serving = _serving.get()
        if serving is not None and not hasattr(record, "request_id"):
            record.request_id, record.function_id, record.function_version_id = serving
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the invocation's and ``extra`` fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in doc:
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    r"""The classic line, ending with the invocation it was written for: ``[request … function … version …]``.

    A message is kept on its one line: what it quotes (an instance's last output, a tenant's header,
    a server's error text) may hold line breaks, and a line starting with a timestamp and a level
    there would read as the platform's own. They are escaped (``\n``); a traceback still follows
    on lines of its own.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = one_line(record.message)
        line = super().formatMessage(record)
        request_id = getattr(record, "request_id", None)
        if request_id is None:
            return line
        function_id = getattr(record, "function_id", "")
        version_id = getattr(record, "function_version_id", "")
        return f"{line} [request {request_id} function {function_id} version {version_id}]"


TEXT_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s"


def configure_logging(settings: LoggingSettings, *, stream: IO[str] | None = None) -> None:
    """Install one stderr handler on the root logger (replacing earlier ones from this function)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_nvcf_mono", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler._nvcf_mono = True  # type: ignore[attr-defined]
    handler.addFilter(RequestContext())
    if settings.format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter(TEXT_FORMAT, datefmt="%Y-%m-%d %H:%M:%S"))
    root.addHandler(handler)
    root.setLevel(settings.level)
    for name, level in settings.levels.items():
        logging.getLogger(name).setLevel(level)
    # Library chatter that would drown the platform's own logs at INFO.
    for noisy in ("aiohttp.access", "nats.aio.client"):
        # (The platform's own access log is nvcf_mono.access, sampled by logging.access_log.)
        if noisy not in settings.levels:
            logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


def plugin_logger(name: str) -> logging.Logger:
    """The logger of one plugin."""
    return logging.getLogger(f"nvcf_mono.plugin.{name}")


@final
class Throttle:
    """Lines a peer can cause at will (a hostile worker, a flood of bad connections), kept to a few.

    The first ``burst`` lines are written; after that, one per ``interval`` seconds, saying how many
    were left out since the last. The log still shows that it happens and how often, not one line per
    message: a peer that sends thousands a second must not fill the disk or spend the node's CPU on
    formatting.
    """

    __slots__ = ("_dropped", "_interval", "_left", "_next")

    def __init__(self, *, burst: int = 5, interval: float = 60.0) -> None:
        self._interval = interval
        self._left = burst
        self._next = 0.0
        self._dropped = 0

    def log(self, logger: logging.Logger, level: int, msg: str, *args: object) -> bool:
        """Write the line unless the throttle holds it back; True when it was written."""
        if self._left > 0:
            self._left -= 1
        else:
            now = time.monotonic()
            if now < self._next:
                self._dropped += 1
                return False
            self._next = now + self._interval
        if self._left == 0 and not self._next:
            self._next = time.monotonic() + self._interval
        if self._dropped:
            msg = f"{msg} (and {self._dropped} more like it left out of the log)"
            self._dropped = 0
        logger.log(level, msg, *args)
        return True
