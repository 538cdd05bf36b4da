"""The kernel-line prefilter: one table in Python, the same decisions in C.

bpf/kmsg_needles.h (used by bpf/kmsg.bpf.c and the bcc program) is generated from
hcsd/contract/kmsg_needles.py; here it must be current, and its matcher, compiled for user
space, must decide every line as `needle_of` does.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from hcsd.contract.kmsg_needles import NEEDLES, message_start, needle_of, render_header
from hcsd.health.parsing import parse_kernel_line

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "bpf" / "kmsg_needles.h"
MSG_MAX = 256


def test_the_checked_in_header_is_current() -> None:
    assert HEADER.read_text() == render_header(), (
        "bpf/kmsg_needles.h is stale: run "
        "`.venv/bin/python -m hcsd.contract.kmsg_needles > bpf/kmsg_needles.h`"
    )


@pytest.fixture(scope="module")
def c_matcher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("cc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("no C compiler")
    program = tmp_path_factory.mktemp("needles") / "needles"
    subprocess.run(
        [
            compiler,
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wno-unknown-pragmas",  # gcc does not know clang's `#pragma unroll`
            f"-I{ROOT / 'bpf'}",
            "-o",
            str(program),
            str(Path(__file__).with_name("needles_host.c")),
        ],
        check=True,
    )
    return program


def corpus() -> list[bytes]:
    """Real lines, forged ones, console prefixes, and random lines built from the bytes the
    matcher looks at."""
    real = [
        b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
        b"pcieport 0000:00:03.1: AER: Corrected error received: 0000:81:00.0",
        b"AER: Corrected error received: 0000:81:00.0",
        b"amdgpu 0000:81:00.0: amdgpu: GPU reset begin!",
        b"devdrv_driver 0000:c1:00.0: device heartbeat lost",
        b"davinci0 0000:c1:00.0: device is down",
        b"cambricon_drv 0000:b1:00.0: card is down",
        b"cndrv 0000:b1:00.0: fatal",
    ]
    lines = list(real)
    for line in real:
        lines += [
            b"[   12.345678] " + line,
            b"[   12.345678][  T1234] " + line,
            b"[   12.345678][     C3] " + line,
            b"[12.3]" + line,
            b"[ 1.2][ C3][ 4.5] " + line,  # only two groups are the console's
            b"[ 1.x] " + line,
            b" " + line,
            b"victim[4242]: segfault at 0 ip 1 sp 2 error 6 in " + line + b"[5555+1000]",
            b" in " + line + b"[5555+1000]",
            b"x" * 70 + b": " + line,  # the device prefix ends too late
            line[:-1],
            line[: len(line) // 2],
        ]
    for needle in NEEDLES:
        text = needle.text
        lines += [text, text[:-1], b"dev 0000:00:00.0: " + text, b"a: b: " + text]
    rng = random.Random(1234)
    alphabet = b"NVRM: Xidamgpuer AERdvincbo[]0123456789.TC: x"
    for _ in range(3000):
        pieces = [rng.choice(NEEDLES).text if rng.random() < 0.3 else b"" for _ in range(3)]
        noise = bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 24)))
        lines.append(noise.join(pieces) + noise[: rng.randrange(0, 8)])
    lines.append(b"N" * 400)  # longer than the kernel filter keeps
    return [line for line in lines if b"\n" not in line]


def python_decision(line: bytes) -> int:
    kept = line[: MSG_MAX - 1]
    return needle_of(kept, message_start(kept))


def test_the_c_matcher_decides_as_python_does(c_matcher: Path) -> None:
    lines = corpus()
    result = subprocess.run(
        [str(c_matcher)], input=b"\n".join(lines) + b"\n", capture_output=True, check=True
    )
    c_decisions = [int(value) for value in result.stdout.split()]
    assert len(c_decisions) == len(lines)
    differ = [
        (line, c, python_decision(line))
        for line, c in zip(lines, c_decisions, strict=True)
        if c != python_decision(line)
    ]
    assert differ == []
    assert sum(1 for c in c_decisions if c) > 100  # the corpus exercises matches too


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(b"NVRM: Xid (PCI:0000:3b:00): 79, x", 1, id="xid-at-start"),
        pytest.param(b"[   12.345678] NVRM: Xid (PCI:0000:3b:00): 79", 1, id="console-time"),
        pytest.param(b"[   12.345678][  T1234] AER: x", 3, id="console-time-and-caller"),
        pytest.param(b"pcieport 0000:00:03.1: AER: Corrected", 3, id="aer-after-port"),
        pytest.param(b"victim[1]: segfault at 0 in NVRM: Xid (PCI:0000:3b:00): 79", 0, id="sf"),
        pytest.param(b" in NVRM: Xid (PCI:0000:3b:00): 79, x[5555+1000]", 0, id="continuation"),
        pytest.param(b"usb 1-1: Product: NVRM: Xid (PCI:0000:3b:00): 79", 0, id="after-device"),
        pytest.param(b"victim[1]: amdgpu 0000:81:00.0: amdgpu: GPU reset begin!", 0, id="amd"),
    ],
)
def test_needles_stand_only_where_vendors_put_them(line: bytes, expected: int) -> None:
    assert python_decision(line) == expected


def test_every_needle_line_the_filter_passes_is_parsed_from_the_message_start() -> None:
    """What the eBPF source hands the parser: the text after the console's prefix."""
    line = b"[   12.345678] NVRM: Xid (PCI:0000:3b:00): 48, DBE"
    event = parse_kernel_line(line[message_start(line) :], 1.0)
    assert event is not None and event.code == "xid-48"
    assert parse_kernel_line(line, 1.0) is None  # the prefix is not skipped by the parser
