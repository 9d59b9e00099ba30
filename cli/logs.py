"""`serve --log-format`: how the server's log lines look.

text (the default) is for people: time, logger, level, message. json is for collectors:
one object per line with `time` (RFC 3339, UTC), `level`, `logger`, `event` (a short
stable name: start, stop, connection_open, connection_close, session_expired, claim,
sever, release, attach, exclusive_grant, txn_begin, txn_commit, txn_abort, txn_timeout,
recovery, refused_frame; `message` when a line has none) and
`message`, plus whatever the line knows of `connection`, `client`, `operation`,
`topic`, `group`, `resource`, `generation`, `txn_id`, `error` and `duration_ms`.
Record values and tokens are never logged.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Final

FIELDS: Final = (
    "event",
    "connection",
    "client",
    "address",
    "operation",
    "topic",
    "group",
    "resource",
    "generation",
    "txn_id",
    "error",
    "duration_ms",
)
FORMATS: Final = ("text", "json")


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": "message",
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(log_format: str, verbose: bool) -> None:
    """Log to stderr as log_format says; json logs INFO and up (the events), text only
    warnings unless verbose."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonLines())
        level = logging.INFO
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, handlers=[handler], force=True)
