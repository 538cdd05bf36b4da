"""What the node daemon's parts measure about themselves, for the metrics endpoint to export.

One `Telemetry` per daemon, handed to the API server, the NRI plugin and the measurer: latency
histograms of the gRPC API and of the NRI hooks, whether the NRI plugin is registered with its
runtime, and how device measurements ended. These belong to no registry until the metrics
endpoint registers this object, so two daemons in one process (tests) never share or clash
over a name.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import Counter, Histogram
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["LATENCY_BUCKETS", "Telemetry"]

# From 100 µs (a cached GetNode) to 10 s (a CreateContainer waiting on the ledger's fsync
# behind a slow disk): hooks past the top bucket are already failing the runtime's timeout.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)  # fmt: skip


class Telemetry(Collector):
    def __init__(self) -> None:
        self.api = Histogram(
            "hcs_api_request_duration_seconds",
            "Time to answer one unary gRPC API call, by method.",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=None,
        )
        self.nri = Histogram(
            "hcs_nri_hook_duration_seconds",
            "Time to answer one NRI call from the runtime, by hook.",
            ["hook"],
            buckets=LATENCY_BUCKETS,
            registry=None,
        )
        self.measurements = Counter(
            "hcs_measurements",
            "Device measurements (the FP16 GEMM fingerprint) by outcome: measured, skipped "
            "(allocated, not healthy, no measurement for the vendor), failed (library, device "
            "or time limit; the log says which) or aborted (an allocation took the device).",
            ["outcome"],
            registry=None,
        )
        # Sessions registered with the runtime now (hcsd's own connection and the
        # pre-launched relay's run side by side); None: NRI is off, nothing to say.
        self.nri_sessions: int | None = None

    @property
    def nri_registered(self) -> bool:
        return bool(self.nri_sessions)

    @contextmanager
    def timed(self, histogram: Histogram, label: str) -> Iterator[None]:
        """Observe the time the block took, whether it returns or raises."""
        started = time.perf_counter()
        try:
            yield
        finally:
            histogram.labels(label).observe(time.perf_counter() - started)

    def collect(self) -> Iterator[Metric]:
        yield from self.api.collect()
        yield from self.nri.collect()
        yield from self.measurements.collect()
        if self.nri_sessions is not None:
            yield GaugeMetricFamily(
                "hcs_nri_registered",
                "1 while hcsd is registered as an NRI plugin with the container runtime "
                "(through any of its sessions).",
                value=1 if self.nri_sessions > 0 else 0,
            )
