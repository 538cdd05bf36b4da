"""Path-list variables are merged into the container's own value, never replaced.

An NRI env adjustment (like a CDI `env` entry) replaces the variable: a container whose image
sets `LD_LIBRARY_PATH=/opt/conda/lib` (conda, NGC) would lose it and no longer find its own
libraries. For the variables that are `:`-separated search paths, hcsd's directories go first
and the container's follow; duplicates keep their first place, and empty elements are dropped:
an empty element in `LD_LIBRARY_PATH` or `PATH` means the working directory, a place the
container's user may control.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

__all__ = ["PATH_LISTS", "join_paths", "merged_env"]

# The variables hcsd (or a vendor CDI spec it reuses) may set that are `:`-separated search
# paths. The vendors' single-directory settings (ASCEND_HOME_PATH, NEUWARE_HOME, ROCM_PATH)
# are not lists and are replaced as usual.
PATH_LISTS = frozenset({"LD_LIBRARY_PATH", "PATH", "PYTHONPATH"})


def join_paths(*values: str) -> str:
    """The elements of `values` in order, each once, without empty ones."""
    seen: dict[str, None] = {}
    for value in values:
        for element in value.split(":"):
            if element:
                seen.setdefault(element, None)
    return ":".join(seen)


def merged_env(
    ours: Sequence[tuple[str, str]], container_env: Iterable[str] | Mapping[str, str]
) -> list[tuple[str, str]]:
    """`ours` with each path list's value prepended to the container's own (`KEY=VALUE`
    strings as NRI carries them, or a mapping); other variables are ours as they are."""
    if isinstance(container_env, Mapping):
        theirs = dict(container_env)
    else:
        theirs = dict(e.partition("=")[::2] for e in container_env)
    return [
        (key, join_paths(value, theirs.get(key, "")) if key in PATH_LISTS else value)
        for key, value in ours
    ]
