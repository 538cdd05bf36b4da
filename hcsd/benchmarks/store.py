"""The measured-figures file: `{uuid: {"tflops_fp16": …, context…, "checksum": …}}`.

`hcsd.profiles.fingerprint.load_measured` reads it (the figures; the context is skipped), so
any reader of that format keeps working. Written whole, the way the ledger writes its snapshot
(temp file in the same directory → fsync → rename → fsync the directory): a crash at any
instant leaves the old file or the new one, never a torn one. Each entry carries a CRC-32 of
its own JSON; a file that fails to parse or check is an error with a name (`MeasurementError`),
never silently emptied: it is moved aside (`<file>.corrupt`) with an error line, and the
devices keep their profile figures until measured again.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from pathlib import Path
from typing import Any

from hcsd.benchmarks.records import Measurement
from hcsd.fs import FileSystem, OsFileSystem, write_atomic
from hcsd.profiles.fingerprint import MeasurementError, load_measured

__all__ = ["MeasuredStore"]

log = logging.getLogger(__name__)


def _checksum(entry: dict[str, Any]) -> int:
    body = {k: v for k, v in entry.items() if k != "checksum"}
    return zlib.crc32(json.dumps(body, sort_keys=True).encode())


class MeasuredStore:
    def __init__(self, path: str, fs: FileSystem | None = None) -> None:
        self.path = path
        self.fs = fs or OsFileSystem()
        self._entries: dict[str, dict[str, Any]] = {}

    def load(self) -> dict[str, Measurement]:
        """The measurements on file; a corrupt file is moved aside and reported (an empty
        result then), a missing one is simply empty."""
        if self.fs.read(self.path) is None:
            return {}
        try:
            found, self._entries = self._read()
        except MeasurementError as e:
            aside = f"{self.path}.corrupt"
            log.error("measure: %s; moved to %s, devices keep their profile figures", e, aside)
            os.replace(self.path, aside)
            return {}
        return found

    def _read(self) -> tuple[dict[str, Measurement], dict[str, dict[str, Any]]]:
        figures = load_measured(Path(self.path))  # the format's checks, in one place
        raw = json.loads(self.fs.read(self.path) or b"{}")
        found = {}
        for uuid in figures:
            entry = raw[uuid]
            # An entry without a checksum was written by hand (the format predates hcsd's
            # measurement): taken as it is. One with a checksum must match it.
            if "checksum" in entry and entry["checksum"] != _checksum(entry):
                raise MeasurementError(f"{self.path}: {uuid}: checksum mismatch")
            try:
                found[uuid] = Measurement.from_record(uuid, entry)
            except (KeyError, TypeError, ValueError) as e:
                raise MeasurementError(f"{self.path}: {uuid}: malformed entry: {e}") from e
        return found, {uuid: raw[uuid] for uuid in found}

    def put(self, measurement: Measurement) -> None:
        """Record (or replace) a device's measurement and write the file whole."""
        entry = measurement.record()
        entry["checksum"] = _checksum(entry)
        entries = {**self._entries, measurement.uuid: entry}
        data = json.dumps(entries, indent=1, sort_keys=True).encode() + b"\n"
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, mode=0o755, exist_ok=True)
        write_atomic(self.fs, self.path, data, mode=0o644)
        self._entries = entries
