"""Logging to stderr in the form journald reads best.

Under systemd (JOURNAL_STREAM is set) each line starts with a `<N>` syslog priority, which the
journal turns into the entry's priority and strips; it adds its own timestamps, so we don't.
On a terminal, lines carry a time and a level word instead.

Messages often carry text from outside (annotations, container names, kernel lines): control
characters in them are escaped, so one record is always one line and a crafted value cannot
forge a log entry. A message repeated in a burst is written a few times a minute
(`hcsd.logs.RepeatLimiter`).
"""

from __future__ import annotations

import logging
import os
import sys

from hcsd.logs import RepeatLimiter

__all__ = ["configure_logging", "escape_controls", "set_level"]

_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}

_ESCAPES = {
    code: {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(chr(code), f"\\x{code:02x}")
    for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))
} | {0x2028: "\\u2028", 0x2029: "\\u2029"}


def escape_controls(text: str) -> str:
    """`text` with C0/C1 control characters and Unicode line separators escaped."""
    return text.translate(_ESCAPES)


class _EscapingFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)


class JournalFormatter(_EscapingFormatter):
    def format(self, record: logging.LogRecord) -> str:
        priority = _PRIORITY.get(record.levelno, 6)
        text = super().format(record)
        # One entry per record: continuation lines (a traceback) keep the same priority.
        return "\n".join(f"<{priority}>{line}" for line in text.splitlines())


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM"):
        handler.setFormatter(JournalFormatter("%(message)s"))
    else:
        handler.setFormatter(
            _EscapingFormatter("%(asctime)s %(levelname)-7s %(message)s", "%H:%M:%S")
        )
    handler.addFilter(RepeatLimiter(handler.handle))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    set_level(level)
    logging.getLogger("grpc").setLevel(logging.WARNING)


def set_level(level: str) -> None:
    logging.getLogger().setLevel(level.upper())
