"""Kubernetes time formats: `Time` (seconds) and `MicroTime` (Leases), both UTC with a Z."""

from __future__ import annotations

import datetime as dt

__all__ = ["micro_time", "parse_time", "rfc3339"]


def rfc3339(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> float | None:
    """Unix seconds of either format; None for an empty or malformed value."""
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
