"""Structured JSON logs. Lines about a notification carry its id (``extra={"notification_id": ...}``);
message bodies, phone numbers and email addresses are never logged at INFO."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

_FIELDS = ("notification_id", "event_id", "tenant_id", "channel", "provider")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in _FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = str(value)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line)


def setup_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aiokafka", "uvicorn.access", "faststream"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
