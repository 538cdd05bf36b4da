"""The measured fingerprint: a short dense-FP16 GEMM per device through the vendor's own math
library, its figures recorded on the node and winning over the profile's.

`libraries` loads a vendor library and binds its symbols (ctypes, declarations written from
the vendors' headers); `timing` is the vendor-neutral loop; one module per vendor (`nvidia`,
`hygon`, `ascend`) sets up the device and issues the calls; `worker` runs one measurement in
a process of its own and `running` starts and bounds that process; `records` and `store` are
what a measurement leaves behind (device attributes, the measured-figures file).
"""

from hcsd.benchmarks.records import (
    MEASURED_ATTRIBUTES,
    Measure,
    Measurement,
    Outcome,
    apply_measurement,
    measured_ratio,
)
from hcsd.benchmarks.settings import MeasureSection

__all__ = [
    "MEASURED_ATTRIBUTES",
    "Measure",
    "MeasureSection",
    "Measurement",
    "Outcome",
    "apply_measurement",
    "measured_ratio",
]
