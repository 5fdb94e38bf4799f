"""Logging to stderr, as text for people or JSON lines for collectors."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import IO, Any

from nvcf_mono.config.model import LoggingSettings


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg (and exc when there is a traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


TEXT_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s"


def configure_logging(settings: LoggingSettings, *, stream: IO[str] | None = None) -> None:
    """Install one stderr handler on the root logger (replacing earlier ones from this function)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_nvcf_mono", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler._nvcf_mono = True  # type: ignore[attr-defined]
    if settings.format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT, datefmt="%Y-%m-%d %H:%M:%S"))
    root.addHandler(handler)
    root.setLevel(settings.level)
    for name, level in settings.levels.items():
        logging.getLogger(name).setLevel(level)
    # Library chatter that would drown the platform's own logs at INFO.
    for noisy in ("aiohttp.access", "nats.aio.client"):
        if noisy not in settings.levels:
            logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


def plugin_logger(name: str) -> logging.Logger:
    """The logger of one plugin."""
    return logging.getLogger(f"nvcf_mono.plugin.{name}")
