"""Which kernel lines are worth parsing: the one table, for Python and for the kernel filters.

A vendor's fault line starts with its marker: `NVRM: Xid (PCI:…)` from NVIDIA's driver, or a
device prefix `<driver> <bus id>: ` (dev_printk) naming the driver (`amdgpu`, `devdrv…`,
`cambricon…`), or PCIe AER's `AER:` after the reporting port's prefix. A needle is therefore
looked for only where it may stand, never anywhere in the line: the kernel prints text that
users control (a segfault line ends with the faulting file's name, which can be
`NVRM: Xid (PCI:0000:17:00): 79, …`), and a needle found in such text must not reach the
parser. `Place` says where each may stand:
- START: at the start of the message;
- AFTER_DEVICE: right after the first ": " within `DEVICE_PREFIX_MAX` bytes (the device prefix).
On kernels before 6.0 the `printk:console` tracepoint sees the console's text, which starts
with `[seconds.micro]` (and `[caller]` with CONFIG_PRINTK_CALLER): `message_start` skips
those; no user text can come before them.

bpf/kmsg_needles.h is generated from this table (`python -m hcsd.contract.kmsg_needles >
bpf/kmsg_needles.h`); bpf/kmsg.bpf.c and the bcc program use the C matcher it holds, and
`needle_of` below is the same algorithm for the /dev/kmsg reader. tests/contract/
test_kmsg_needles.py fails when the header is stale.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass

__all__ = [
    "NEEDLES",
    "Needle",
    "Place",
    "device_end",
    "message_start",
    "needle_of",
    "render_header",
    "render_matcher",
]

DEVICE_PREFIX_MAX = 64  # bytes in which a device prefix must end with ": "
CONSOLE_GROUPS = 2  # "[time]" and "[caller]"
CONSOLE_GROUP_MAX = 24  # bytes from "[" to "]"
_CONSOLE_GROUP_BYTES = frozenset(b" 0123456789.TC")
NEEDLE_MAX = 15  # bytes


class Place(enum.IntFlag):
    START = 1
    AFTER_DEVICE = 2


@dataclass(frozen=True, slots=True)
class Needle:
    text: bytes
    place: Place
    source: str  # whose lines: for the reader of the table


NEEDLES: tuple[Needle, ...] = (
    Needle(b"NVRM: Xid", Place.START, "nvidia"),
    Needle(b"amdgpu", Place.START, "hygon (amdgpu-derived driver)"),
    Needle(b"AER:", Place.START | Place.AFTER_DEVICE, "PCIe AER, after the port's prefix"),
    Needle(b"davinci", Place.START, "ascend"),
    Needle(b"devdrv", Place.START, "ascend"),
    Needle(b"cambricon", Place.START, "cambricon"),
    Needle(b"cndrv", Place.START, "cambricon"),
)


def _skip_group(text: bytes, position: int) -> int:
    """After a "[…]" group of digits, spaces, '.', 'T' or 'C' at `position`; else `position`."""
    if position >= len(text) or text[position] != ord("["):
        return position
    for offset in range(1, CONSOLE_GROUP_MAX + 1):
        index = position + offset
        if index >= len(text):
            return position
        if text[index] == ord("]"):
            return index + 1
        if text[index] not in _CONSOLE_GROUP_BYTES:
            return position
    return position


def message_start(text: bytes) -> int:
    """Where the message proper begins in console text: after "[time]" and "[caller]"."""
    position = 0
    for _ in range(CONSOLE_GROUPS):
        position = _skip_group(text, position)
    if position and position < len(text) and text[position] == ord(" "):
        position += 1
    return position


def device_end(text: bytes, start: int) -> int:
    """Where the text after a `<driver> <device>: ` prefix begins; 0 when there is none."""
    for offset in range(DEVICE_PREFIX_MAX):
        index = start + offset
        if index + 1 >= len(text):
            break
        if text[index] == ord(":") and text[index + 1] == ord(" "):
            return index + 2
    return 0


def needle_of(text: bytes, start: int = 0) -> int:
    """1 + the index of the needle standing where it may in `text` (message from `start`);
    0 when none does. The same algorithm as `hcs_kmsg_needle` in bpf/kmsg_needles.h."""
    device = device_end(text, start)
    for index, needle in enumerate(NEEDLES):
        size = len(needle.text)
        if Place.START in needle.place and text[start : start + size] == needle.text:
            return index + 1
        if (
            Place.AFTER_DEVICE in needle.place
            and device
            and text[device : device + size] == needle.text
        ):
            return index + 1
    return 0


# --- C ------------------------------------------------------------------------------------------


def _compare(position: str, needle: bytes) -> str:
    """C: the bytes of `needle` at `position` of msg (masked into the buffer)."""
    checks = [f"{position} + {len(needle)} <= len"]
    checks += [f"HCS_KMSG_AT(msg, {position} + {k}) == '{chr(b)}'" for k, b in enumerate(needle)]
    return " &&\n\t    ".join(checks)


def render_matcher() -> str:
    """The C matcher: plain C for both libbpf (bpf/kmsg.bpf.c) and bcc. Loops are unrolled
    (`#pragma unroll`), so kernels without bounded-loop support (before 5.3) accept it. Needs
    HCS_MSG_MAX (a power of two) defined first; msg must hold HCS_MSG_MAX bytes."""
    tests = []
    for index, needle in enumerate(NEEDLES):
        label = needle.text.decode()
        if Place.START in needle.place:
            tests.append(
                f'\t/* "{label}" at the start: {needle.source} */\n'
                f"\tif ({_compare('start', needle.text)})\n\t\treturn {index + 1};"
            )
        if Place.AFTER_DEVICE in needle.place:
            tests.append(
                f'\t/* "{label}" after a device prefix: {needle.source} */\n'
                f"\tif (device && {_compare('device', needle.text)})\n\t\treturn {index + 1};"
            )
    group_bytes = " || ".join(
        f"c == '{chr(b)}'" for b in sorted(_CONSOLE_GROUP_BYTES) if not chr(b).isdigit()
    )
    groups = "\n".join(["\tposition = hcs_skip_group(msg, len, position);"] * CONSOLE_GROUPS)
    return f"""#define HCS_KMSG_AT(msg, i) ((msg)[(i) & (HCS_MSG_MAX - 1)])
#define HCS_KMSG_INLINE static inline __attribute__((always_inline))
#define HCS_NEEDLE_COUNT {len(NEEDLES)}

/* After a "[...]" group of digits, spaces, '.', 'T' or 'C' at position; else position. */
HCS_KMSG_INLINE unsigned int
hcs_skip_group(const char *msg, unsigned int len, unsigned int position)
{{
	if (position >= len || HCS_KMSG_AT(msg, position) != '[')
		return position;
#pragma unroll
	for (unsigned int offset = 1; offset <= {CONSOLE_GROUP_MAX}; offset++) {{
		unsigned int index = position + offset;
		if (index >= len)
			return position;
		char c = HCS_KMSG_AT(msg, index);
		if (c == ']')
			return index + 1;
		if (!((c >= '0' && c <= '9') || {group_bytes}))
			return position;
	}}
	return position;
}}

/* Where the message proper begins: after the console's "[time]" and "[caller]" groups. */
HCS_KMSG_INLINE unsigned int hcs_message_start(const char *msg, unsigned int len)
{{
	unsigned int position = 0;
{groups}
	if (position && position < len && HCS_KMSG_AT(msg, position) == ' ')
		position++;
	return position;
}}

/* Where the text after a "<driver> <device>: " prefix begins; 0 when there is none. */
HCS_KMSG_INLINE unsigned int
hcs_device_end(const char *msg, unsigned int len, unsigned int start)
{{
#pragma unroll
	for (unsigned int offset = 0; offset < {DEVICE_PREFIX_MAX}; offset++) {{
		unsigned int index = start + offset;
		if (index + 1 >= len)
			break;
		if (HCS_KMSG_AT(msg, index) == ':' && HCS_KMSG_AT(msg, index + 1) == ' ')
			return index + 2;
	}}
	return 0;
}}

/* 1 + the index of the needle standing where it may; 0 when none does. `positions` (2 entries)
 * is where the two offsets pass through memory: in eBPF, a per-CPU map's value, so the verifier
 * sees one unknown offset instead of following each possible one as its own path (which
 * would run past its instruction limit). */
HCS_KMSG_INLINE unsigned int
hcs_kmsg_needle(const char *msg, unsigned int len, volatile unsigned int *positions)
{{
	positions[0] = hcs_message_start(msg, len);
	unsigned int start = positions[0];
	positions[1] = hcs_device_end(msg, len, start);
	unsigned int device = positions[1];
{chr(10).join(tests)}
	return 0;
}}
"""


def render_header() -> str:
    """bpf/kmsg_needles.h."""
    return f"""/* Generated from the table in hcsd/contract/kmsg_needles.py: do not edit.
 * Regenerate with `python -m hcsd.contract.kmsg_needles > bpf/kmsg_needles.h`;
 * tests/contract/test_kmsg_needles.py fails when it is stale. Include after kmsg.h. */
#ifndef HCS_KMSG_NEEDLES_H
#define HCS_KMSG_NEEDLES_H

{render_matcher()}
#endif
"""


def _check_table() -> None:
    for needle in NEEDLES:
        if not 0 < len(needle.text) <= NEEDLE_MAX or not needle.text.isascii():
            raise ValueError(f"needle {needle.text!r}: 1..{NEEDLE_MAX} ASCII bytes")
        if b"'" in needle.text or b"\\" in needle.text or b"*/" in needle.text:
            raise ValueError(f"needle {needle.text!r} would need escaping in C")


_check_table()

if __name__ == "__main__":
    sys.stdout.write(render_header())
