"""The sub-health tracker's entries kept in the run directory across a daemon restart.

Without them a restarted hcsd starts every hold again: a degraded device turns healthy, is
scheduled on, and turns degraded again a hold time later. The file is written atomically
(temp file, fsync, rename, fsync the directory) when the counted signals change and at most
every `interval` seconds otherwise; a file that cannot be read or parsed is logged and
ignored (the holds start again, as they would without it).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from hcsd.fs import OsFileSystem, write_atomic

__all__ = ["SavedState"]

log = logging.getLogger(__name__)

_VERSION = 1


class SavedState:
    def __init__(self, path: str, *, interval: float = 60.0) -> None:
        self.path, self.interval = path, interval
        self._saved_at: float | None = None

    def load(self) -> Mapping[str, Any]:
        try:
            with open(self.path, "rb") as f:
                data = json.loads(f.read())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warning("health: ignoring sub-health state %s: %s", self.path, e)
            return {}
        if not isinstance(data, dict) or data.get("version") != _VERSION:
            log.warning("health: ignoring sub-health state %s: unknown format", self.path)
            return {}
        devices = data.get("devices", {})
        return devices if isinstance(devices, dict) else {}

    def save(self, snapshot: Mapping[str, Any], now: float, *, force: bool) -> None:
        if not force and self._saved_at is not None and now - self._saved_at < self.interval:
            return
        data = json.dumps({"version": _VERSION, "devices": snapshot}, sort_keys=True)
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            write_atomic(OsFileSystem(), self.path, data.encode())
        except OSError as e:
            log.warning("health: failed to save sub-health state %s: %s", self.path, e)
            return
        self._saved_at = now
