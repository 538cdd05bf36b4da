"""`quota.conf`: the per-container quota hcsd writes and libhcs reads (libhcs/src/config.c).

`key=value` lines, `#` comments, unknown keys ignored by libhcs (docs/libhcs.md):
  version=1
  container=<id>
  devices=N
  device.<i>.uuid=GPU-…            i = the ordinal the application sees
  device.<i>.vendor=nvidia
  device.<i>.vram_limit=<bytes>    1 .. 2**64-1
  device.<i>.compute_percent=<n>   1..100; 100: no compute limit
libhcs treats a file it cannot read as no quota at all (it never stops the application), so
the writer refuses anything libhcs would refuse or cut short: the limits below are libhcs's
(HCS_MAX_DEVICES, HCS_UUID_LEN, its line buffer and its read buffer). tests/contract/
test_quota_file.py has the real parser read what this module writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hcsd.model import Device, Grant

__all__ = ["DeviceQuota", "QuotaFileError", "quotas_of", "render", "render_quota"]

VERSION = 1
MAX_DEVICES = 16  # HCS_MAX_DEVICES
MAX_UUID_BYTES = 95  # HCS_UUID_LEN - 1: longer would be cut, and match no device
MAX_LINE_BYTES = 255  # config.c's line buffer is 256 with the terminating NUL
MAX_FILE_BYTES = 16383  # hcs_config_load reads at most this much
MAX_VRAM_LIMIT = 2**64 - 1  # uint64_t
HEADER = "# written by hcsd; read by libhcs"


class QuotaFileError(ValueError):
    """The quota cannot be written in a form libhcs reads as written."""


@dataclass(frozen=True, slots=True)
class DeviceQuota:
    """One device's line group, in the order the application sees the devices."""

    uuid: str
    vendor: str
    vram_limit: int
    compute_percent: int = 100  # 100: no compute limit


def quotas_of(grants: Sequence[Grant], devices: Sequence[Device]) -> tuple[DeviceQuota, ...]:
    """A container's grants with the devices they are on, as quota entries. A grant that
    reserves no compute share (0) is not throttled: 100."""
    return tuple(
        DeviceQuota(d.uuid, d.vendor.value, g.vram_bytes, g.compute_percent or 100)
        for g, d in zip(grants, devices, strict=True)
    )


def _text(what: str, value: str) -> str:
    if not value or not value.isprintable() or not value.isascii() or value != value.strip():
        raise QuotaFileError(f"{what} {value!r} cannot be written in quota.conf")
    return value


def _check(entry: DeviceQuota, ordinal: int) -> None:
    _text(f"device {ordinal} uuid", entry.uuid)
    _text(f"device {ordinal} vendor", entry.vendor)
    if len(entry.uuid.encode()) > MAX_UUID_BYTES:
        raise QuotaFileError(
            f"device uuid {entry.uuid!r} is longer than {MAX_UUID_BYTES} bytes, the most "
            "libhcs keeps"
        )
    if not 1 <= entry.vram_limit <= MAX_VRAM_LIMIT:
        raise QuotaFileError(
            f"device {entry.uuid}: VRAM limit {entry.vram_limit} is outside 1..{MAX_VRAM_LIMIT}"
        )
    if not 1 <= entry.compute_percent <= 100:
        raise QuotaFileError(
            f"device {entry.uuid}: compute share {entry.compute_percent} is outside 1..100"
        )


def render(container_id: str, quotas: Sequence[DeviceQuota]) -> str:
    """The file's text; QuotaFileError when libhcs would not read it as written."""
    _text("container id", container_id)
    if len(quotas) > MAX_DEVICES:
        raise QuotaFileError(
            f"{len(quotas)} devices in one container; libhcs enforces at most {MAX_DEVICES}"
        )
    lines = [HEADER, f"version={VERSION}", f"container={container_id}", f"devices={len(quotas)}"]
    for ordinal, entry in enumerate(quotas):
        _check(entry, ordinal)
        lines += [
            f"device.{ordinal}.uuid={entry.uuid}",
            f"device.{ordinal}.vendor={entry.vendor}",
            f"device.{ordinal}.vram_limit={entry.vram_limit}",
            f"device.{ordinal}.compute_percent={entry.compute_percent}",
        ]
    for line in lines:
        if len(line.encode()) > MAX_LINE_BYTES:
            raise QuotaFileError(f"quota.conf line {line[:40]!r}… is over {MAX_LINE_BYTES} bytes")
    text = "\n".join(lines) + "\n"
    if len(text.encode()) > MAX_FILE_BYTES:
        raise QuotaFileError(f"quota.conf would be over {MAX_FILE_BYTES} bytes")
    return text


def render_quota(container_id: str, grants: Sequence[Grant], devices: Sequence[Device]) -> str:
    """The file for a container's grants on these devices (one device per grant)."""
    return render(container_id, quotas_of(grants, devices))
