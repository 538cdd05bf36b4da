"""Logging to stderr in the form journald reads best.

Under systemd (JOURNAL_STREAM is set) each line starts with a `<N>` syslog priority, which the
journal turns into the entry's priority and strips; it adds its own timestamps, so we don't.
On a terminal, lines carry a time and a level word instead.
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["configure_logging", "set_level"]

_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}


class JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        priority = _PRIORITY.get(record.levelno, 6)
        text = super().format(record)
        # One entry per record: continuation lines keep the same priority.
        return "\n".join(f"<{priority}>{line}" for line in text.splitlines())


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM"):
        handler.setFormatter(JournalFormatter("%(message)s"))
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)-7s %(message)s", "%H:%M:%S")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    set_level(level)
    logging.getLogger("grpc").setLevel(logging.WARNING)


def set_level(level: str) -> None:
    logging.getLogger().setLevel(level.upper())
