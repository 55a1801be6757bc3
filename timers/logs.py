"""Log lines of ``timers listen``: plain text or one JSON object per line.

Every line names its process: the pid, and the listener id (``host:pid:hex``) once the
listener exists; before that (and in the ``--processes`` supervisor) the role instead::

    2026-11-23 20:30:01,123 INFO [pid 4242 listener web1:4242:9f3c2a] timers.listener: …
    {"ts": "2026-11-23T20:30:01.123Z", "level": "INFO", "logger": "timers.listener",
     "message": "…", "pid": 4242, "role": "listener", "listener": "web1:4242:9f3c2a"}

(the JSON object is on one line). Structured fields a line carries (``extra=``: a fired
timer's ``id``, ``task``, ``lateness_ms`` …) become fields of its JSON object; an exception
becomes one string field, ``exception``, so a line never spans lines.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Literal

LOG_FORMAT_ENV = "TIMERS_LOG_FORMAT"
LogFormat = Literal["text", "json"]
FORMATS: tuple[LogFormat, ...] = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s [%(who)s] %(name)s: %(message)s"

_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message", "asctime", "who", "role", "listener"}


class Identity(logging.Filter):
    """Stamps each record with the role and the listener id of this process."""

    def __init__(self, role: str = "listener") -> None:
        super().__init__()
        self.role = role
        self.listener: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        record.role, record.listener = self.role, self.listener
        record.who = (f"pid {record.process} {self.role}"
                      + (f" {self.listener}" if self.listener else ""))
        return True


IDENTITY = Identity()
"""The identity of this process's log lines (one process, one listener)."""


def identify(listener_id: str) -> None:
    """From now on, lines of this process carry ``listener_id``."""
    IDENTITY.role, IDENTITY.listener = "listener", listener_id


class TextFormatter(logging.Formatter):
    """:data:`TEXT_FORMAT`, a line per event: a line break in the message (a timer id, an
    exception's text) is written as ``\\n``, so it cannot start a line of its own that
    reads as another event. A traceback still follows on the lines after."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return (super().formatMessage(record)
                .replace("\r", "\\r").replace("\n", "\\n"))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (ISO 8601, UTC), level, logger, message, pid, role,
    listener, the record's structured extras, and ``exception`` as one string."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
            "role": getattr(record, "role", None),
            "listener": getattr(record, "listener", None),
        }
        data.update((k, v) for k, v in record.__dict__.items()
                    if k not in _STANDARD and k not in data)
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            data["stack"] = self.formatStack(record.stack_info)
        return fit_on_one_write(data)


MAX_LINE_BYTES = 4095
"""A line and its newline fit in one atomic write to a pipe (``PIPE_BUF``, 4096 on Linux):
under ``--processes`` the children share one stderr, and a longer write may interleave
with another child's line."""
_SHORTENED = ("exception", "stack", "message")


def fit_on_one_write(data: dict[str, Any]) -> str:
    """``data`` as JSON of at most :data:`MAX_LINE_BYTES`, cutting the middle out of the
    longest of its exception, stack or message (a traceback's head and its last frames
    stay) and saying how much was cut."""
    line = json.dumps(data, default=str, ensure_ascii=False)
    for _ in range(4):
        excess = len(line.encode()) - MAX_LINE_BYTES
        if excess <= 0:
            return line
        field = max(_SHORTENED, key=lambda name: len(str(data.get(name) or "")))
        value = str(data.get(field) or "")
        keep = max(len(value) - excess * 2 - 60, 200)  # chars: the JSON may escape some
        if keep >= len(value):
            break
        head, tail = value[:keep // 3], value[len(value) - (keep - keep // 3):]
        data[field] = f"{head} … [{len(value) - keep} characters cut] … {tail}"
        line = json.dumps(data, default=str, ensure_ascii=False)
    return line


def configured_format(value: str | None = None) -> LogFormat:
    """``value`` if given, else ``$TIMERS_LOG_FORMAT``, else ``text``; ValueError (one
    line) for anything else."""
    chosen = (value or os.environ.get(LOG_FORMAT_ENV) or "text").strip().lower()
    for known in FORMATS:
        if chosen == known:
            return known
    source = "--log-format" if value else f"${LOG_FORMAT_ENV}"
    raise ValueError(f"{source} must be text or json, got {chosen!r}")


def configure(level: str, log_format: LogFormat = "text", role: str = "listener") -> None:
    """Log to stderr in ``log_format`` at ``level``, every line naming this process.

    Leaves logging alone if the root logger has handlers already (an app, or pytest)."""
    IDENTITY.role = role
    root = logging.getLogger()
    if root.handlers:
        return
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(IDENTITY)
    root.addHandler(handler)
    if log_format == "json":
        route_stray_output_to_logs()


def route_stray_output_to_logs() -> None:
    """What Python itself would write to stderr goes through logging instead, so under
    JSON every line is JSON: warnings (logger ``py.warnings``), an uncaught exception in
    the main thread or any thread, and an exception Python can only ignore (logger
    ``timers``, level CRITICAL or ERROR, the traceback in ``exception``)."""
    logging.captureWarnings(True)
    log = logging.getLogger("timers")

    def uncaught(kind: type[BaseException], value: BaseException,
                 tb: TracebackType | None) -> None:
        log.critical("uncaught %s: %s", kind.__name__, value, exc_info=(kind, value, tb))

    def in_thread(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is None or isinstance(args.exc_value, SystemExit):
            return
        log.critical("uncaught %s in thread %s: %s", args.exc_type.__name__,
                     args.thread.name if args.thread else "?", args.exc_value,
                     exc_info=(args.exc_type, args.exc_value, args.exc_traceback))

    def unraisable(args: sys.UnraisableHookArgs) -> None:
        value = args.exc_value
        log.error("%s: %s", args.err_msg or "exception ignored", value,
                  exc_info=(args.exc_type, value, args.exc_traceback) if value else None)

    sys.excepthook = uncaught
    threading.excepthook = in_thread
    sys.unraisablehook = unraisable
