"""Path-list variables are merged into the container's own value, never replaced.

An NRI env adjustment (like a CDI `env` entry) replaces the variable: a container whose image
sets `LD_LIBRARY_PATH=/opt/conda/lib` (conda, NGC) would lose it and no longer find its own
libraries. For the variables that are `:`-separated search paths, hcsd's directories go first
and the container's value follows exactly as it was: its elements (empty ones, `.`, relative
paths, glibc's `;` separator in LD_LIBRARY_PATH) mean what the tenant meant, and leaving them
alone keeps the merge linear in the value's length whatever its shape. hcsd's own part has
each directory once and no empty element (an empty element means the working directory, which
hcsd never means to add). A value that already begins with hcsd's part is left as it is, so a
second merge changes nothing.
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
        (key, _prepend(join_paths(value), theirs.get(key, "")) if key in PATH_LISTS else value)
        for key, value in ours
    ]


def _prepend(ours: str, theirs: str) -> str:
    """`ours` then the container's value untouched (once: not again before itself)."""
    if not ours or theirs == ours or theirs.startswith(ours + ":"):
        return theirs or ours
    return f"{ours}:{theirs}" if theirs else ours
