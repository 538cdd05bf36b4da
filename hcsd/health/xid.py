"""NVIDIA Xid codes and what each says about the device.

From NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors) and the device plugin's
default of ignoring application Xids. Codes not listed are DEGRADING: an unknown Xid is still a
driver-reported fault, and counting it is safer than ignoring it.
"""

from __future__ import annotations

from hcsd.health.events import Severity

__all__ = ["xid_severity"]

# The application's fault, not the device's (NVIDIA's device plugin skips these by default).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

FATAL_XIDS = frozenset(
    {
        48,  # double-bit ECC error
        64,  # row remapping failed
        74,  # NVLink error
        79,  # GPU has fallen off the bus
        95,  # uncontained ECC error
        119,  # GSP RPC timeout
        120,  # GSP error
        140,  # unrecovered ECC error
    }
)

CORRECTABLE_XIDS = frozenset(
    {
        63,  # row remapping recorded (the page was retired: correctable, but counts)
        92,  # high single-bit ECC error rate
        94,  # contained ECC error
    }
)


def xid_severity(xid: int) -> Severity:
    if xid in APPLICATION_XIDS:
        return Severity.APPLICATION
    if xid in FATAL_XIDS:
        return Severity.FATAL
    if xid in CORRECTABLE_XIDS:
        return Severity.CORRECTABLE
    return Severity.DEGRADING
