"""`hcsd --open-device-nodes PATH…`: open device nodes the way discovery's vendor libraries do,
and say for each whether it opened.

Run as an `ExecStartPre=` of hcsd.service (a drop-in), it runs in the unit itself, in the
unit's device cgroup and under its namespaces and capability bounding set, so it answers the
question a vendor library would otherwise answer with a vague error during discovery: does the
unit's `DeviceAllow=` let hcsd open this node? (docs/packaging.md, "Device access").
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence

__all__ = ["open_device_nodes"]


def open_device_nodes(paths: Sequence[str], say: Callable[[str], None] = print) -> int:
    """Open each path read-write (non-blocking, then closed at once) and report one line per
    path: `open PATH (char MAJOR:MINOR): ok` or the error. Returns 0 when every one opened."""
    failed = 0
    for path in paths:
        try:
            info = os.stat(path)
            kind = "char" if stat.S_ISCHR(info.st_mode) else "not a char device"
            what = f"{kind} {os.major(info.st_rdev)}:{os.minor(info.st_rdev)}"
        except OSError as e:
            say(f"open {path}: {e.strerror or e}")
            failed += 1
            continue
        try:
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError as e:
            say(f"open {path} ({what}): {e.strerror or e}")
            failed += 1
            continue
        os.close(fd)
        say(f"open {path} ({what}): ok")
    return 1 if failed else 0
