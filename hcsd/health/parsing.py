"""Kernel log lines → HealthEvent (device by PCI bus id, code, severity).

Every line is hostile until proven otherwise: bounded length, decoded with replacement, and a
bus id is accepted only in full `DDDD:BB:DD.F` form, so a garbled line can be dropped but never
attributed to the wrong device. Patterns match at the start of the message only (`re.match`):
the kernel prints text users control, such as the name of the file a process segfaulted in
(`foo[1]: segfault at 0 … in NVRM: Xid (PCI:0000:17:00): 79, …[…]`), and a vendor's marker
inside such text is not a fault. A /dev/kmsg record counts only with the kernel's own
facility: user space (root included) writes with another (LOG_USER at least).

NVIDIA Xid lines name the bus as `PCI:0000:3b:00` (no function); the function is 0.
Other vendors' patterns come from a table that the config can extend.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hcsd.health.events import HealthEvent, Severity
from hcsd.health.xid import xid_severity

__all__ = [
    "DEFAULT_RULES",
    "LineRule",
    "compile_rules",
    "kmsg_text",
    "parse_kernel_line",
    "parse_kmsg_record",
]

MAX_LINE = 1024
_BUS = r"(?P<bus>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])"
# An ECC error the hardware did not correct, in the words drivers use for it, either side of
# "ecc".
_UNCORRECTED = (
    r"(?:(?:multi|double)[- ]?bit|uncorrect|non-?correct).*ecc"
    r"|ecc.*(?:(?:multi|double)[- ]?bit|uncorrect|non-?correct)"
)
_PCI = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
_XID = re.compile(
    r"NVRM: Xid \(PCI:(?P<bus>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?\): "
    r"(?P<xid>[0-9]{1,4})\b"
)
# The port that reports (`pcieport 0000:00:03.1: `) comes first on every kernel that has one.
_AER = re.compile(
    r"(?:[\w.-]+ " + _PCI + r": )?"
    r"AER: (?P<kind>Corrected|Uncorrected \(Non-Fatal\)|Uncorrected \(Fatal\)|"
    r"Multiple Corrected|Multiple Uncorrected \(Non-Fatal\)|Multiple Uncorrected \(Fatal\))"
    r" error (?:received|message received from): (?:id=[0-9a-fA-F]+ )?" + _BUS
)


@dataclass(frozen=True, slots=True)
class LineRule:
    """A configurable pattern: lines matching `pattern` (with a `bus` group) from their start
    become events."""

    vendor: str
    code: str
    severity: Severity
    pattern: re.Pattern[str]


DEFAULT_RULES: tuple[LineRule, ...] = (
    LineRule(
        "hygon",
        "gpu-reset",
        Severity.DEGRADING,
        re.compile(r"amdgpu " + _BUS + r": amdgpu: GPU reset begin"),
    ),
    LineRule(
        "hygon",
        "ring-timeout",
        Severity.DEGRADING,
        re.compile(r"amdgpu " + _BUS + r": .*ring \S+ timeout"),
    ),
    LineRule(
        "hygon",
        "gpu-reset-failed",
        Severity.FATAL,
        re.compile(r"amdgpu " + _BUS + r": .*(?:GPU reset|ASIC reset).*failed"),
    ),
    LineRule(
        "hygon",
        "ras-uncorrectable",
        Severity.FATAL,
        re.compile(r"amdgpu " + _BUS + r": .*uncorrectable hardware error"),
    ),
    LineRule(
        "ascend",
        "device-fault",
        Severity.FATAL,
        re.compile(
            r"(?:devdrv|davinci)\S* " + _BUS + r": .*(?:heartbeat lost|device (?:is )?down)"
        ),
    ),
    # An ECC line that says the error was not corrected (multi-bit, double-bit,
    # uncorrectable) is fatal; the rules below it would take any ECC line as a correction.
    LineRule(
        "ascend",
        "hbm-ecc-uncorrectable",
        Severity.FATAL,
        re.compile(r"(?:devdrv|davinci)\S* " + _BUS + r": .*(?:hbm|HBM).*(?:" + _UNCORRECTED + ")"),
    ),
    LineRule(
        "ascend",
        "hbm-ecc",
        Severity.CORRECTABLE,
        re.compile(r"(?:devdrv|davinci)\S* " + _BUS + r": .*(?:hbm|HBM).*ecc"),
    ),
    LineRule(
        "cambricon",
        "device-fault",
        Severity.FATAL,
        re.compile(r"cambricon\S* " + _BUS + r": .*(?:heartbeat lost|card (?:is )?down|fatal)"),
    ),
    LineRule(
        "cambricon",
        "ecc-uncorrectable",
        Severity.FATAL,
        re.compile(r"cambricon\S* " + _BUS + r": .*(?:" + _UNCORRECTED + ")", re.IGNORECASE),
    ),
    LineRule(
        "cambricon",
        "ecc",
        Severity.CORRECTABLE,
        re.compile(r"cambricon\S* " + _BUS + r": .*ecc", re.IGNORECASE),
    ),
)


def _clean(raw: bytes | str) -> str:
    if isinstance(raw, bytes):
        raw = raw[:MAX_LINE].decode("utf-8", errors="replace")
    text = raw[:MAX_LINE]
    # Control characters other than tab would let a crafted line forge log lines of ours.
    return "".join(c if c >= " " or c == "\t" else "?" for c in text)


def parse_kernel_line(
    raw: bytes | str,
    now: float,
    *,
    source: str = "",
    rules: Sequence[LineRule] = DEFAULT_RULES,
) -> HealthEvent | None:
    """Classify one kernel message text (no syslog prefix); None when it is not ours."""
    line = _clean(raw)
    if (match := _XID.match(line)) is not None:
        xid = int(match["xid"])
        return HealthEvent(
            bus_id=(match["bus"] + ".0").lower(),
            vendor="nvidia",
            code=f"xid-{xid}",
            severity=xid_severity(xid),
            message=line[:300],
            time=now,
            source=source,
        )
    if (match := _AER.match(line)) is not None:
        kind = match["kind"]
        severity = (
            Severity.CORRECTABLE
            if "Corrected" in kind
            else Severity.FATAL
            if "(Fatal)" in kind
            else Severity.DEGRADING
        )
        code = {Severity.CORRECTABLE: "aer-correctable", Severity.FATAL: "aer-fatal"}.get(
            severity, "aer-nonfatal"
        )
        return HealthEvent(match["bus"].lower(), "pci", code, severity, line[:300], now, source)
    for rule in rules:
        if (match := rule.pattern.match(line)) is not None:
            return HealthEvent(
                match["bus"].lower(), rule.vendor, rule.code, rule.severity, line[:300], now, source
            )
    return None


def kmsg_text(record: bytes) -> bytes | None:
    """The message of a /dev/kmsg record the kernel itself printed, or None.

    A record is `prio,seq,usec,flags[,...];text\\n[ KEY=value\\n...]`; prio is facility * 8 +
    level, and only the kernel's facility (0) is the kernel's: /dev/kmsg gives lines written
    from user space another."""
    head, sep, rest = record.partition(b";")
    if not sep or len(head) > 64:
        return None
    prio = head.split(b",", 1)[0]
    if not prio.isdigit() or len(prio) > 4 or int(prio) >> 3 != 0:
        return None
    return rest.split(b"\n", 1)[0]


def parse_kmsg_record(
    record: bytes, now: float, *, rules: Sequence[LineRule] = DEFAULT_RULES
) -> HealthEvent | None:
    """One /dev/kmsg record (see `kmsg_text`) as an event; None when it is not ours."""
    text = kmsg_text(record)
    if text is None:
        return None
    return parse_kernel_line(text, now, source="kmsg", rules=rules)


def compile_rules(entries: Iterable[Mapping[str, str]]) -> tuple[LineRule, ...]:
    """Rules from config entries {vendor, code, severity, pattern}; the pattern needs `bus`."""
    rules = []
    for position, entry in enumerate(entries):
        missing = sorted({"vendor", "code", "severity", "pattern"} - set(entry))
        if missing:
            raise ValueError(f"health rule #{position}: missing key(s) {', '.join(missing)}")
        try:
            pattern = re.compile(entry["pattern"])
            severity = Severity[entry["severity"].upper()]
            if "bus" not in pattern.groupindex:
                raise ValueError("the pattern needs a (?P<bus>...) group")
            rules.append(LineRule(entry["vendor"], entry["code"], severity, pattern))
        except (KeyError, re.error, ValueError) as e:
            raise ValueError(f"health rule #{position}: {e}") from e
    return tuple(rules)
