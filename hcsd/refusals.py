"""Why the node refuses a request, in one vocabulary from the allocator up to every front end.

A refusal is raised as a `Refusal` (or a subclass named by the layer that raises it: `NoFit` in
the allocator, the ledger's `OverCapacity`, `LedgerConflict`, `LedgerWriteError`) and stays one
all the way out; the service only puts who asked in front of its message (`about`). Its
reason is the label of `hcs_refusals_total{reason}`; whether it is temporary and which status
code the caller sees follow from the reason, in the one table below. gRPC (the local API) and
ttrpc (NRI) share gRPC's canonical code numbers, so the table's `Code` converts to either by
value.

Temporary means: the same request, retried later with nothing else changed, may succeed (a
full disk clears). Permanent means retrying the same request is pointless until the request or
the node's state changes (a smaller request, a released allocation, a healed device).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["METADATA_KEY", "RULES", "Code", "Reason", "Refusal", "Rule"]

# The gRPC trailing metadata entry that carries the reason to API clients (hcsctl, the front ends).
METADATA_KEY = "hcs-refusal"


class Code(enum.IntEnum):
    """The status codes refusals use, numbered as gRPC's canonical codes (ttrpc uses the same)."""

    INVALID_ARGUMENT = 3
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    UNAVAILABLE = 14


class Reason(enum.StrEnum):
    """The refusal's metric label; API clients get it too (METADATA_KEY)."""

    INVALID_REQUEST = "invalid_request"  # malformed request, annotation or container id
    BAD_ASSIGNMENT = "bad_assignment"  # forged, stale, or for another node or pod
    NO_MATCHING_DEVICE = "no_matching_device"  # allow-lists match nothing; device not here
    UNHEALTHY = "unhealthy"  # the matching devices are unhealthy or lost
    INSUFFICIENT_VRAM = "insufficient_vram"
    INSUFFICIENT_COMPUTE = "insufficient_compute"
    INSUFFICIENT_DEVICES = "insufficient_devices"
    NO_LINKED_SET = "no_linked_set"  # high-bandwidth asked, no peer-to-peer set has room
    UNKNOWN_TFLOPS = "unknown_tflops"  # a TFLOPS request on a model without the figure
    OVER_CAPACITY = "over_capacity"  # a decided allocation (assignment) no longer fits
    CONFLICT = "conflict"  # the container already holds a different allocation
    WRITE_FAILED = "write_failed"  # the ledger could not make the record durable
    PREPARE_FAILED = "prepare_failed"  # the container's files could not be prepared
    NOT_INJECTED = "not_injected"  # the runtime left hcsd's devices or quota edits out
    NO_ASSIGNMENT = "no_assignment"  # a pod's local request on a node in cluster mode
    RUNTIME_PROFILE = "runtime_profile"  # the container cannot run its profile here


@dataclass(frozen=True, slots=True)
class Rule:
    code: Code
    temporary: bool


_PERMANENT_NO_ROOM = Rule(Code.RESOURCE_EXHAUSTED, temporary=False)

# The one table: every front end takes its status code and temporary/permanent from here.
RULES: Mapping[Reason, Rule] = MappingProxyType(
    {
        Reason.INVALID_REQUEST: Rule(Code.INVALID_ARGUMENT, temporary=False),
        Reason.BAD_ASSIGNMENT: Rule(Code.INVALID_ARGUMENT, temporary=False),
        Reason.NO_MATCHING_DEVICE: _PERMANENT_NO_ROOM,
        Reason.UNHEALTHY: _PERMANENT_NO_ROOM,
        Reason.INSUFFICIENT_VRAM: _PERMANENT_NO_ROOM,
        Reason.INSUFFICIENT_COMPUTE: _PERMANENT_NO_ROOM,
        Reason.INSUFFICIENT_DEVICES: _PERMANENT_NO_ROOM,
        Reason.NO_LINKED_SET: _PERMANENT_NO_ROOM,
        Reason.UNKNOWN_TFLOPS: _PERMANENT_NO_ROOM,
        Reason.OVER_CAPACITY: _PERMANENT_NO_ROOM,
        Reason.CONFLICT: Rule(Code.ALREADY_EXISTS, temporary=False),
        Reason.WRITE_FAILED: Rule(Code.UNAVAILABLE, temporary=True),
        Reason.PREPARE_FAILED: _PERMANENT_NO_ROOM,
        # The node's runtime set-up, not the request, is wrong: retrying cannot help.
        Reason.NOT_INJECTED: Rule(Code.FAILED_PRECONDITION, temporary=False),
        # The pod may not ask this node directly: only the scheduler's assignment gives it
        # devices (node.mode = "cluster").
        Reason.NO_ASSIGNMENT: Rule(Code.PERMISSION_DENIED, temporary=False),
        # The image is not the profile's, the runtime cannot replace the command, the code
        # is not mounted: the pod or the node must change first.
        Reason.RUNTIME_PROFILE: Rule(Code.FAILED_PRECONDITION, temporary=False),
    }
)


class Refusal(Exception):
    """A request the node will not serve: a reason from `Reason` and a message with figures.

    `str()` is the message alone (what the gRPC status carries beside the reason);
    `describe()` adds the reason and, for temporary refusals, that a retry may succeed, for
    transports that carry text only (NRI, the front ends' stderr) and for log lines.
    """

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = Reason(reason)
        self.message = message

    @property
    def rule(self) -> Rule:
        return RULES[self.reason]

    @property
    def code(self) -> Code:
        return self.rule.code

    @property
    def temporary(self) -> bool:
        return self.rule.temporary

    def about(self, subject: str) -> Refusal:
        """The same refusal with `subject: ` (who asked, `ns/pod/container`) before the text."""
        return Refusal(self.reason, f"{subject}: {self.message}")

    def describe(self) -> str:
        retry = "; temporary, retry" if self.temporary else ""
        return f"{self.message} (refused: {self.reason.value}{retry})"

    @classmethod
    def parse(cls, reason: str, message: str) -> Refusal | None:
        """A refusal received from hcsd; None for a reason this side does not know."""
        try:
            return cls(Reason(reason), message)
        except ValueError:
            return None
