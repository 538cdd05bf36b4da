"""What the runtime's NRI can do, from what Configure says about it.

`ConfigureRequest.NRI_version` exists only from NRI v0.12 (containerd 2.3): older runtimes
leave it empty, and then the runtime's own name and version tell. The argv adjustment
(`ContainerAdjustment.args`, field 9) came with NRI v0.10 (containerd 2.2); a runtime before
it skips the field as unknown and runs the image's own command, so hcsd must know. Anything
it cannot tell counts as old: the safe side (a profile that replaces the command is refused,
never run with the wrong one).
"""

from __future__ import annotations

__all__ = ["ARGS_NRI", "argv_adjustable", "at_least"]

ARGS_NRI = (0, 10)  # the first NRI with ContainerAdjustment.args
# Runtimes that send no NRI_version, by the first of their versions that vendors NRI v0.10+.
_RUNTIMES_WITH_ARGS = {"containerd": (2, 2)}


def at_least(version: str, minimum: tuple[int, int]) -> bool:
    """`v0.12.0` >= (0, 10)? An empty or odd version counts as old (the safe side)."""
    parts = version.strip().lstrip("v").split(".")
    try:
        return (int(parts[0]), int(parts[1])) >= minimum
    except (ValueError, IndexError):
        return False


def argv_adjustable(nri_version: str, runtime_name: str, runtime_version: str) -> bool:
    """Whether the runtime applies `ContainerAdjustment.args`."""
    if nri_version:
        return at_least(nri_version, ARGS_NRI)
    first = _RUNTIMES_WITH_ARGS.get(runtime_name.strip())
    return first is not None and at_least(runtime_version, first)
