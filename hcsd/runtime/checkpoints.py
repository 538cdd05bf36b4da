"""The newest complete checkpoint in a directory a tenant controls, found without trusting it.

A pod names its checkpoint directory (`hcs.io/checkpoint-path`); hcsd, as root on the host,
looks into the host side of that mount when the pod's container is created (hcsd/runtime/
resume.py). Everything in it was written by the tenant: names, links, file types, sizes, the
number of entries. So the directory is read through its descriptor only: entries are listed
with `scandir` on the descriptor, never joined into paths; a candidate directory is opened
`O_DIRECTORY|O_NOFOLLOW` relative to it; a marker counts only as a regular file seen with
`lstat` semantics (no link followed, nothing opened); a pointer file is read through
`dirfd.read_file` (regular files only, at most `max_pointer_bytes`). No other file is opened.

What counts as complete (`[runtime.checkpoints]`, docs/runtime.md "Checkpoint resume"):

- a pointer file (`latest`, as DeepSpeed writes it after a save) naming an entry of the same
  directory: one name, no `/`, not `.` or `..`, an existing directory or regular file. A
  pointer that names anything else (a path, a link, something missing) is ignored and logged;
  a valid one wins over the scan, since the framework wrote it when the save was done;
- else the numbered directory (`step-*`, `checkpoint-*`, `global_step*`) holding a completion
  marker (`COMPLETE`, or the `.metadata` that torch.distributed.checkpoint renames into place
  last), newest by the numbers in its name compared in turn (`step-10` after `step-9`; mtimes
  are never used: a copy or a restore changes them).

A directory with more than `max_entries` entries is not judged at all: resuming from an entry
that only looks newest among those seen could go back in training without anyone noticing.
At most `max_checked` directories, newest first, are opened to look for a marker: a tenant's
thousands of unfinished directories cost a few milliseconds, not a second of root's time.

The work per name is bounded too: a name with more than MAX_GROUPS numbers, or a number longer
than MAX_DIGITS digits, is not a candidate (`step-9-9-…-9` with a hundred groups would make
every comparison a long one), and the newest `max_checked` are picked with a heap, never by
sorting every candidate. Entries a mount in the container covers (`shadowed`) are not what the
container sees there: they are neither candidates nor a pointer's target.
"""

from __future__ import annotations

import fnmatch
import heapq
import os
import re
import stat
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from hcsd.runtime.dirfd import opened_dir, read_file
from hcsd.sections import Section, checks, setting

__all__ = ["MAX_TIMEOUT", "CheckpointError", "CheckpointSection", "newest_complete", "numbers_of"]

_NUMBER = re.compile(r"[0-9]+")
NAME_MAX = 255
MAX_GROUPS = 8  # numbers in a checkpoint's name (`step-10-of-3` has two)
MAX_DIGITS = 20  # digits in one of them (a 64-bit step counter has at most 20)
# Upper bounds of the settings: past them a scan is no longer "a few milliseconds"
MAX_ENTRIES = 1_000_000
MAX_CHECKED = 10_000
MAX_POINTER_BYTES = 64 * 1024
MAX_TIMEOUT = 1.0  # the runtime waits 2 s for the whole CreateContainer


class CheckpointError(ValueError):
    """The tenant's directory cannot be judged as it is (more entries than allowed): permanent
    until the tenant changes it, so the creation goes on without resume. Failures to read
    (unreadable, removed, an I/O error) stay OSErrors: they may pass."""


def _file_name(value: Any) -> str:
    """One entry name (a marker, a pointer, a pattern): never a path."""
    if not isinstance(value, str) or not value or "/" in value or value in (".", ".."):
        raise ValueError
    if len(value) > NAME_MAX or not value.isprintable():
        raise ValueError
    return value


def _file_names(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise ValueError
    return tuple(_file_name(v) for v in value)


file_names = checks.Check(
    "a list of file names (no '/', not '.' or '..', at most 255 printable characters)",
    _file_names,
)


def _up_to(high: int) -> checks.Check[int]:
    def convert(value: Any) -> int:
        number = checks.positive_int(value)
        if number > high:
            raise ValueError
        return number

    return checks.Check(f"a positive integer up to {high:_}".replace("_", ","), convert)


def _timeout(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError
    if not 0 < value <= MAX_TIMEOUT:
        raise ValueError
    return float(value)


timeout_seconds = checks.Check(
    f"a number of seconds in (0, {MAX_TIMEOUT:g}] (the runtime waits 2 s for the whole creation)",
    _timeout,
)


@dataclass(frozen=True, slots=True)
class CheckpointSection(Section):
    """Checkpoint resume: how hcsd finds the newest complete checkpoint in the directory a
    pod names with hcs.io/checkpoint-path, and how much of it it may look at."""

    enabled: bool = setting(
        True,
        "Inject HCS_RESUME_FROM and HCS_RESUME_STATUS into containers that hold devices and "
        "name their checkpoint directory with hcs.io/checkpoint-path.",
        checks.boolean,
    )
    directories: tuple[str, ...] = setting(
        ("step-*", "checkpoint-*", "global_step*"),
        "Name patterns (shell globs) of numbered checkpoint directories; the newest is the "
        "one whose numbers, compared in turn, are largest.",
        file_names,
    )
    markers: tuple[str, ...] = setting(
        ("COMPLETE", ".metadata"),
        "Files that mark a checkpoint directory complete (any one, a regular file): the "
        "training script's own marker, and torch.distributed.checkpoint's .metadata.",
        file_names,
    )
    pointers: tuple[str, ...] = setting(
        ("latest",),
        "Pointer files naming the newest checkpoint (an entry of the same directory), as "
        "DeepSpeed's `latest`; a valid one wins over the directory scan.",
        file_names,
    )
    max_entries: int = setting(
        10_000,
        "Entries of the checkpoint directory looked at; a directory with more is not judged "
        "(HCS_RESUME_STATUS=unknown, a warning is logged).",
        _up_to(MAX_ENTRIES),
    )
    max_checked: int = setting(
        100,
        "Checkpoint directories looked into for a marker, newest first; when none of them is "
        "complete the older ones are not looked at (HCS_RESUME_STATUS=none, a warning is "
        "logged).",
        _up_to(MAX_CHECKED),
    )
    max_pointer_bytes: int = setting(
        4096, "Largest pointer file read; a larger one is ignored.", _up_to(MAX_POINTER_BYTES)
    )
    timeout: float = setting(
        0.5,
        "Seconds a container's creation waits for the scan (a hung network file system); "
        "past it the container gets HCS_RESUME_STATUS=unknown. Later scans of the same mount "
        "source do not start while that one hangs; the others do, up to a few hung at once.",
        timeout_seconds,
    )


def newest_complete(
    dir_fd: int, settings: CheckpointSection, shadowed: Collection[str] = ()
) -> tuple[str | None, list[str]]:
    """The name of the newest complete checkpoint in the directory (None: none), and what was
    wrong on the way (ignored pointers), as log text with names escaped. `shadowed`: the
    entries a mount in the container covers, never an answer.

    Raises CheckpointError when the directory cannot be judged at all.
    """
    problems: list[str] = []
    for pointer in settings.pointers:
        if pointer in shadowed:
            problems.append(f"pointer {pointer}: a mount in the container covers it, ignored")
            continue
        named, problem = _pointed(dir_fd, pointer, settings.max_pointer_bytes)
        if named is not None and named in shadowed:
            problem = (
                f"pointer {pointer}: {named!r} is covered by a mount in the container, ignored"
            )
        elif named is not None:
            return named, problems
        if problem:
            problems.append(problem)
    candidates, count = _candidates(dir_fd, settings, shadowed)
    for _, name in heapq.nlargest(settings.max_checked, candidates):
        if _complete(dir_fd, name, settings.markers):
            return name, problems
    if count > settings.max_checked:
        problems.append(
            f"none of the newest {settings.max_checked} checkpoint directories is complete; "
            "the older ones were not looked at (runtime.checkpoints.max_checked)"
        )
    return None, problems


def _pointed(dir_fd: int, pointer: str, limit: int) -> tuple[str | None, str]:
    """The entry a pointer file names, or None and why not ("" when there is no pointer)."""
    data = read_file(dir_fd, pointer, limit + 1)
    if data is None:
        return None, ""
    try:
        name = _pointer_name(data, limit)
    except ValueError as e:
        return None, f"pointer {pointer}: {e}, ignored"
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as e:
        return None, f"pointer {pointer}: {name!r}: {e.strerror}, ignored"
    if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
        return None, f"pointer {pointer}: {name!r} is not a directory or a file, ignored"
    return name, ""


def _pointer_name(data: bytes, limit: int) -> str:
    """The one name a pointer's text holds; ValueError says why it holds none."""
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    try:
        name = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    try:
        return _file_name(name)
    except ValueError:
        raise ValueError(f"{name[:80]!r} is not one name in its directory") from None


def _candidates(
    dir_fd: int, settings: CheckpointSection, shadowed: Collection[str]
) -> tuple[list[tuple[tuple[int, ...], str]], int]:
    """The numbered directories matching a pattern, with their numbers, and how many."""
    found = []
    seen = 0
    with os.scandir(dir_fd) as entries:  # on a duplicate of the descriptor, rewound after
        for entry in entries:
            seen += 1
            if seen > settings.max_entries:
                raise CheckpointError(
                    f"failed to judge the directory: more than {settings.max_entries} entries "
                    "(runtime.checkpoints.max_entries)"
                )
            name = entry.name
            if name in shadowed or not _matches(name, settings.directories):
                continue
            numbers = numbers_of(name)
            if numbers and entry.is_dir(follow_symlinks=False):
                found.append((numbers, name))
    return found, len(found)


def numbers_of(name: str) -> tuple[int, ...] | None:
    """The numbers in a checkpoint's name, in order; None (not a candidate) for an unprintable
    name, one with none, more than MAX_GROUPS of them, or one longer than MAX_DIGITS."""
    if not name.isprintable():
        return None
    numbers: list[int] = []
    for match in _NUMBER.finditer(name):
        text = match.group()
        if len(numbers) == MAX_GROUPS or len(text) > MAX_DIGITS:
            return None
        numbers.append(int(text))
    return tuple(numbers) or None


def _complete(dir_fd: int, name: str, markers: tuple[str, ...]) -> bool:
    """Whether directory `name` (never through a link) holds a marker as a regular file."""
    try:
        with opened_dir(name, dir_fd) as fd:
            for marker in markers:
                try:
                    info = os.stat(marker, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode):
                    return True
    except OSError:
        return False  # swapped for a link or removed since the listing, unreadable
    return False


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
