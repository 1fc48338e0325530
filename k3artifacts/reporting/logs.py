"""The ``k3artifacts`` logger on stderr, as text lines or JSON lines.

Library modules log with :mod:`logging` (a retried download, a hub that does not answer) and
know nothing of where it goes; a command points the ``k3artifacts`` logger at stderr here.
Structured fields ride in ``extra={"k3a": {...}}`` and become keys of the JSON object.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from k3artifacts.net.redact import redact_text

LOG_FORMATS = ("text", "json")
_HANDLER_NAME = "k3a-stderr"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and the record's fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        doc.update(getattr(record, "k3a", None) or {})
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, sort_keys=True, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%S%z")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (click's test runner swaps it), with
    the credentials of any URL in a line removed (an S3 endpoint's password, a presigned
    CDN link's signature)."""

    def __init__(self) -> None:
        super().__init__()
        self.set_name(_HANDLER_NAME)

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def configure_logging(log_format: str = "text", level: int = logging.INFO) -> None:
    """Send the ``k3artifacts`` logger to stderr in ``log_format``; idempotent."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {log_format!r}")
    logger = logging.getLogger("k3artifacts")
    handler = next((h for h in logger.handlers if h.get_name() == _HANDLER_NAME), None)
    if handler is None:
        handler = _StderrHandler()
        logger.addHandler(handler)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logger.setLevel(level)
    # Our records are shown here once; the root logger (a Prefect worker's) keeps its own.
    logger.propagate = False
