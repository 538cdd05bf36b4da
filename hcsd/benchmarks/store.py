"""The measured-figures file: `{uuid: {"tflops_fp16": …, context…, "checksum": …}}`.

`hcsd.profiles.fingerprint.parse_measured` reads it (the figures; the context is skipped), so
any reader of that format keeps working. Written whole, the way the ledger writes its snapshot
(temp file in the same directory → fsync → rename → fsync the directory): a crash at any
instant leaves the old file or the new one, never a torn one. Each entry carries a CRC-32 of
its own JSON; a file that fails to parse or check is an error with a name (`MeasurementError`),
never silently emptied: it is moved aside (the first free `<file>.corrupt[.N]`, so an earlier
copy is kept) with an error line, and the devices keep their profile figures until measured
again. Not UTF-8, NaN or Infinity, or hcsd's own fields without a checksum count as corrupt;
a file that cannot be read at all (a directory in its place, permissions) is logged and left.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from typing import Any

from hcsd.benchmarks.records import Measurement
from hcsd.fs import FileSystem, OsFileSystem, write_atomic
from hcsd.profiles.fingerprint import MeasurementError, parse_measured

__all__ = ["MeasuredStore"]

log = logging.getLogger(__name__)

#: Fields only hcsd's own measurement writes (Measurement.record): with them, a checksum.
_OWN_FIELDS = frozenset({"library", "iterations", "seconds", "size", "at", "measured_at"})


def _checksum(entry: dict[str, Any]) -> int:
    body = {k: v for k, v in entry.items() if k != "checksum"}
    return zlib.crc32(json.dumps(body, sort_keys=True).encode())


class MeasuredStore:
    def __init__(self, path: str, fs: FileSystem | None = None) -> None:
        self.path = path
        self.fs = fs or OsFileSystem()
        self._entries: dict[str, dict[str, Any]] = {}

    def load(self) -> dict[str, Measurement]:
        """The measurements on file; a missing file is simply empty. Nothing here raises:
        an unreadable file is logged (and left alone), a corrupt one is logged and moved aside
        to the first free `<file>.corrupt[.N]`; the devices then keep their profile figures."""
        try:
            data = self.fs.read(self.path)
        except OSError as e:
            log.error("measure: failed to read %s: %s; devices keep their profile figures",
                      self.path, e.strerror or e)  # fmt: skip
            return {}
        if data is None:
            return {}
        try:
            found, self._entries = self._parse(data)
        except MeasurementError as e:
            self._move_aside(e)
            return {}
        return found

    def _move_aside(self, error: MeasurementError) -> None:
        aside = f"{self.path}.corrupt"
        number = 0
        while os.path.lexists(aside):
            number += 1
            aside = f"{self.path}.corrupt.{number}"
        try:
            os.replace(self.path, aside)
        except OSError as e:
            log.error("measure: %s; failed to move it aside to %s: %s; devices keep their "
                      "profile figures", error, aside, e.strerror or e)  # fmt: skip
            return
        log.error("measure: %s; moved to %s, devices keep their profile figures", error, aside)

    def _parse(self, data: bytes) -> tuple[dict[str, Measurement], dict[str, dict[str, Any]]]:
        figures = parse_measured(data, self.path)  # the format's checks, in one place
        raw = json.loads(data)  # parsed and checked above: valid UTF-8 JSON, finite figures
        found = {}
        for uuid in figures:
            entry = raw[uuid]
            # An entry of only figures was written by hand (the format predates hcsd's
            # measurement): taken as it is. One with hcsd's own fields must carry its checksum.
            if "checksum" not in entry and set(entry) & _OWN_FIELDS:
                raise MeasurementError(f"{self.path}: {uuid}: hcsd's fields but no checksum")
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
