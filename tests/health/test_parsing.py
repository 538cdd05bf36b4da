from __future__ import annotations

import pytest

from hcsd.health.events import Severity
from hcsd.health.parsing import DEFAULT_RULES, compile_rules, parse_kernel_line, parse_kmsg_record

KNOWN_LINES = [
    pytest.param(
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
        "0000:3b:00.0",
        "xid-79",
        Severity.FATAL,
        id="xid-79-fatal",
    ),
    pytest.param(
        "NVRM: Xid (PCI:0000:3B:00): 13, Graphics SM Warp Exception",
        "0000:3b:00.0",
        "xid-13",
        Severity.APPLICATION,
        id="xid-13-app",
    ),
    pytest.param(
        "NVRM: Xid (PCI:0000:17:00): 92, High single-bit ECC error rate",
        "0000:17:00.0",
        "xid-92",
        Severity.CORRECTABLE,
        id="xid-92",
    ),
    pytest.param(
        "NVRM: Xid (PCI:0000:17:00): 999, something new",
        "0000:17:00.0",
        "xid-999",
        Severity.DEGRADING,
        id="unknown-xid-counts",
    ),
    pytest.param(
        "pcieport 0000:00:03.1: AER: Corrected error received: 0000:81:00.0",
        "0000:81:00.0",
        "aer-correctable",
        Severity.CORRECTABLE,
        id="aer-cor",
    ),
    pytest.param(
        "pcieport 0000:00:03.1: AER: Uncorrected (Fatal) error received: 0000:81:00.0",
        "0000:81:00.0",
        "aer-fatal",
        Severity.FATAL,
        id="aer-fatal",
    ),
    pytest.param(
        "pcieport 0000:00:03.1: AER: Uncorrected (Non-Fatal) error received: 0000:81:00.0",
        "0000:81:00.0",
        "aer-nonfatal",
        Severity.DEGRADING,
        id="aer-nonfatal",
    ),
    pytest.param(
        "amdgpu 0000:81:00.0: amdgpu: GPU reset begin!",
        "0000:81:00.0",
        "gpu-reset",
        Severity.DEGRADING,
        id="amdgpu-reset",
    ),
    pytest.param(
        "amdgpu 0000:81:00.0: [drm:amdgpu_job_timedout] *ERROR* ring gfx timeout",
        "0000:81:00.0",
        "ring-timeout",
        Severity.DEGRADING,
        id="ring-timeout",
    ),
    pytest.param(
        "amdgpu 0000:81:00.0: amdgpu: GPU reset(2) failed",
        "0000:81:00.0",
        "gpu-reset-failed",
        Severity.FATAL,
        id="reset-failed",
    ),
    pytest.param(
        "devdrv_driver 0000:c1:00.0: device heartbeat lost",
        "0000:c1:00.0",
        "device-fault",
        Severity.FATAL,
        id="ascend-heartbeat",
    ),
    pytest.param(
        "cambricon_drv 0000:b1:00.0: card is down",
        "0000:b1:00.0",
        "device-fault",
        Severity.FATAL,
        id="cambricon-down",
    ),
    pytest.param(
        "devdrv_driver 0000:c1:00.0: HBM single-bit ecc error corrected",
        "0000:c1:00.0",
        "hbm-ecc",
        Severity.CORRECTABLE,
        id="ascend-hbm-ecc",
    ),
    pytest.param(
        "devdrv_driver 0000:c1:00.0: HBM multi-bit ecc error",
        "0000:c1:00.0",
        "hbm-ecc-uncorrectable",
        Severity.FATAL,
        id="ascend-hbm-ecc-multi-bit",
    ),
    pytest.param(
        "cambricon_drv 0000:b1:00.0: uncorrectable ECC error on channel 2",
        "0000:b1:00.0",
        "ecc-uncorrectable",
        Severity.FATAL,
        id="cambricon-ecc-uncorrectable",
    ),
    pytest.param(
        "amdgpu 0000:81:00.0: amdgpu: uncorrectable hardware error detected",
        "0000:81:00.0",
        "ras-uncorrectable",
        Severity.FATAL,
        id="amdgpu-ras",
    ),
    pytest.param(
        "cambricon_drv 0000:b1:00.0: ECC error on channel 2",
        "0000:b1:00.0",
        "ecc",
        Severity.CORRECTABLE,
        id="cambricon-ecc",
    ),
    pytest.param(
        "AER: Multiple Corrected error received: 0000:81:00.0",
        "0000:81:00.0",
        "aer-correctable",
        Severity.CORRECTABLE,
        id="aer-without-port",
    ),
]


@pytest.mark.parametrize(("line", "bus", "code", "severity"), KNOWN_LINES)
def test_known_lines(line: str, bus: str, code: str, severity: Severity) -> None:
    event = parse_kernel_line(line, 1.0)
    assert event is not None
    assert (event.bus_id, event.code, event.severity) == (bus, code, severity)


def test_every_default_rule_has_a_known_line() -> None:
    codes = {param.values[2] for param in KNOWN_LINES}
    assert {rule.code for rule in DEFAULT_RULES} <= codes


def segfault_line(file_name: str) -> str:
    """What the kernel prints when a process faults in code mapped from `file_name`."""
    return (
        "victim[4242]: segfault at 0 ip 000055d0c0de1139 sp 00007ffc2b1e0f30 error 6 in "
        f"{file_name}[55d0c0de1000+1000] likely on CPU 3 (core 1, socket 0)"
    )


@pytest.mark.parametrize(("line", "bus", "code", "severity"), KNOWN_LINES)
def test_a_fault_line_inside_user_controlled_text_is_no_fault(
    line: str, bus: str, code: str, severity: Severity
) -> None:
    """Any process can name a file after a fault line and segfault in it: the kernel then
    prints the name inside its segfault line (and the console tracepoint sees the ` in …`
    continuation on its own). Other kernel lines start with a process name."""
    for text in (
        segfault_line(line),
        f" in {line}[55d0c0de1000+1000]",
        f"victim[4242]: {line}",
        f"usb 1-1: Product: {line}",
    ):
        assert parse_kernel_line(text, 1.0) is None, text
        assert parse_kmsg_record(f"6,1,2,-;{text}\n".encode(), 1.0) is None, text


@pytest.mark.parametrize(
    "prio",
    [
        pytest.param(1 * 8 + 3, id="user"),
        pytest.param(3 * 8 + 6, id="daemon"),
        pytest.param(23 * 8 + 7, id="local7"),
    ],
)
def test_kmsg_records_written_from_user_space_are_no_fault(prio: int) -> None:
    """/dev/kmsg gives what user space (root included) writes a facility other than the
    kernel's; only the kernel's own lines count."""
    record = f"{prio},5,6,-;NVRM: Xid (PCI:0000:3b:00): 79, off the bus\n".encode()
    assert parse_kmsg_record(record, 1.0) is None


@pytest.mark.parametrize(
    "line",
    [
        pytest.param("", id="empty"),
        pytest.param("usb 1-1: new high-speed USB device", id="unrelated"),
        pytest.param("NVRM: Xid (PCI:0000:3b", id="truncated-xid"),
        pytest.param("NVRM: Xid (PCI:zzzz:3b:00): 79", id="bad-bus"),
        pytest.param("NVRM: Xid (PCI:0000:3b:00):", id="no-code"),
        pytest.param("amdgpu 0000:81:00: amdgpu: GPU reset begin!", id="bus-without-function"),
        pytest.param("pcieport AER: Corrected error received: garbage", id="aer-garbage"),
    ],
)
def test_partial_or_garbled_lines_are_not_attributed(line: str) -> None:
    assert parse_kernel_line(line, 1.0) is None


def test_hostile_lines_do_not_crash_or_forge_log_lines() -> None:
    huge = "A" * 10_000_000 + "NVRM: Xid (PCI:0000:3b:00): 79"
    assert parse_kernel_line(huge, 1.0) is None  # beyond the bounded prefix: not looked at
    binary = bytes(range(256)) * 100
    assert parse_kernel_line(binary, 1.0) is None
    forged = b"NVRM: Xid (PCI:0000:3b:00): 79\n<3>hcsd: everything is fine\x1b[2J"
    event = parse_kernel_line(forged, 1.0)
    assert event is not None and "\n" not in event.message and "\x1b" not in event.message
    invalid_utf8 = b"NVRM: Xid (PCI:0000:3b:00): 48, DBE \xff\xfe"
    event = parse_kernel_line(invalid_utf8, 1.0)
    assert event is not None and event.code == "xid-48"
    assert parse_kernel_line(b"\xff\xfe" + invalid_utf8, 1.0) is None  # not at the start


@pytest.mark.parametrize(
    ("record", "code"),
    [
        pytest.param(
            b"3,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, off the bus\n", "xid-79", id="plain"
        ),
        pytest.param(
            b"3,1,2,-,caller=T1;NVRM: Xid (PCI:0000:3b:00): 74, NVLink\n"
            b" SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n",
            "xid-74",
            id="with-dict",
        ),
        pytest.param(b"no separator NVRM: Xid (PCI:0000:3b:00): 79", None, id="no-prefix"),
        pytest.param(b"x,1,2,-;NVRM: Xid (PCI:0000:3b:00): 79\n", None, id="bad-prio"),
        pytest.param(b"99999,1,2,-;NVRM: Xid (PCI:0000:3b:00): 79\n", None, id="huge-prio"),
        pytest.param(b"3" * 100 + b";NVRM: Xid (PCI:0000:3b:00): 79", None, id="long-prefix"),
    ],
)
def test_kmsg_records(record: bytes, code: str | None) -> None:
    event = parse_kmsg_record(record, 1.0)
    assert (event.code if event else None) == code


def test_configured_rules() -> None:
    rules = compile_rules(
        [
            {
                "vendor": "ascend",
                "code": "npu-overtemp",
                "severity": "degrading",
                "pattern": r"npu_temp (?P<bus>\S+): over temperature",
            }
        ]
    )
    event = parse_kernel_line("npu_temp 0000:c1:00.0: over temperature", 1.0, rules=rules)
    assert event is not None and event.code == "npu-overtemp"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        pytest.param(
            {"vendor": "x", "code": "c", "severity": "fatal", "pattern": "no bus"},
            "needs a",
            id="no-bus-group",
        ),
        pytest.param(
            {"vendor": "x", "code": "c", "severity": "awful", "pattern": "(?P<bus>x)"},
            "AWFUL",
            id="bad-severity",
        ),
        pytest.param(
            {"vendor": "x", "code": "c", "severity": "fatal", "pattern": "("},
            "missing",
            id="bad-regex",
        ),
        pytest.param({"vendor": "x"}, "code", id="missing-keys"),
    ],
)
def test_bad_rules_are_refused(entry: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=f"health rule #0: .*{message}"):
        compile_rules([entry])
