"""Run hcsd code with the capabilities its systemd unit gives it, and no others.

The tests run as root with every capability; hcsd under its unit has only those named in
`CapabilityBoundingSet=` (systemd/hcsd.service): no CAP_DAC_OVERRIDE, no CAP_FOWNER. A file
operation that works for the tests' root can fail for the daemon (a directory a container made
read-only), so the tests of such operations take the unit's set from the unit file itself:
`as_unit` runs a function in a forked child whose effective and permitted sets are cut down
to it, and `setpriv_prefix` starts a whole hcsd that way.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import re
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["UnitCapabilityError", "as_unit", "setpriv_prefix", "unit_capabilities"]

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "systemd" / "hcsd.service"
# linux/capability.h
NUMBERS = {
    "CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_DAC_READ_SEARCH": 2, "CAP_FOWNER": 3,
    "CAP_FSETID": 4, "CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_MKNOD": 27,
    "CAP_SYS_ADMIN": 21, "CAP_SYSLOG": 34, "CAP_PERFMON": 38, "CAP_BPF": 39,
}  # fmt: skip
_VERSION_3 = 0x20080522
T = TypeVar("T")


class UnitCapabilityError(Exception):
    """The function failed in the child; the message is its traceback."""


def unit_capabilities() -> list[str]:
    """The names in the unit's CapabilityBoundingSet= (e.g. CAP_CHOWN)."""
    found = re.search(r"^CapabilityBoundingSet=(.*)$", UNIT.read_text(), re.MULTILINE)
    assert found is not None, f"no CapabilityBoundingSet= in {UNIT}"
    return found.group(1).split()


def setpriv_prefix() -> list[str]:
    """A command prefix that runs a program with the unit's bounding set (root's effective set
    after exec is then exactly that set) and nothing inheritable."""
    kept = ",".join(f"+{name.removeprefix('CAP_').lower()}" for name in unit_capabilities())
    return ["setpriv", "--inh-caps=-all", f"--bounding-set=-all,{kept}", "--"]


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _keep_only(names: list[str]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    header = _Header(_VERSION_3, 0)
    data = (_Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    keep = [0, 0]
    for name in names:
        word, bit = divmod(NUMBERS[name], 32)
        keep[word] |= 1 << bit
    for word in (0, 1):
        data[word].effective &= keep[word]
        data[word].permitted &= keep[word]
        data[word].inheritable = 0
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def as_unit(function: Callable[[], T], *, without: tuple[str, ...] = ()) -> T:
    """`function()` in a forked child with the unit's capabilities only (less `without`); its
    (picklable) result, or UnitCapabilityError with the child's traceback."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_end)
        try:
            _keep_only([c for c in unit_capabilities() if c not in without])
            outcome: tuple[bool, object] = (True, function())
        except BaseException:
            outcome = (False, traceback.format_exc())
        with os.fdopen(write_end, "wb") as pipe:
            pickle.dump(outcome, pipe)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    ok, value = pickle.loads(data)
    if not ok:
        raise UnitCapabilityError(str(value))
    return value  # type: ignore[no-any-return]
