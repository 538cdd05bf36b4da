"""The extender's Prometheus metrics: counters and latency histograms, rendered on scrape."""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Sequence

__all__ = ["Histogram", "Metrics"]

_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Histogram:
    def __init__(self, buckets: Sequence[float] = _BUCKETS) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.total += seconds
        self.count += 1

    def render(self, name: str, labels: str = "") -> list[str]:
        out, running = [], 0
        sep = "," if labels else ""
        for bound, count in zip(self.buckets, self.counts, strict=False):
            running += count
            out.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {running}')
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        suffix = "{" + labels + "}" if labels else ""
        out.append(f"{name}_sum{suffix} {self.total!r}")
        out.append(f"{name}_count{suffix} {self.count}")
        return out


class Metrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.refusals: Counter[str] = Counter()
        self.binds: Counter[str] = Counter()
        self.latency: dict[str, Histogram] = {}
        self.scheduling = Histogram()  # first filter of a pod -> its binding written

    def observe(self, verb: str, seconds: float) -> None:
        with self.lock:
            self.requests[verb] += 1
            self.latency.setdefault(verb, Histogram()).observe(seconds)

    def render(self, gauges: dict[str, float]) -> str:
        with self.lock:
            out = [
                "# HELP hcs_extender_requests_total Extender calls by verb.",
                "# TYPE hcs_extender_requests_total counter",
            ]
            out += [
                f'hcs_extender_requests_total{{verb="{v}"}} {n}'
                for v, n in sorted(self.requests.items())
            ]
            out += [
                "# HELP hcs_extender_request_seconds Time to answer one call, by verb.",
                "# TYPE hcs_extender_request_seconds histogram",
            ]
            for verb, histogram in sorted(self.latency.items()):
                out += histogram.render("hcs_extender_request_seconds", f'verb="{verb}"')
            out += [
                "# HELP hcs_extender_scheduling_seconds"
                " From a pod's first filter call to its Binding.",
                "# TYPE hcs_extender_scheduling_seconds histogram",
                *self.scheduling.render("hcs_extender_scheduling_seconds"),
                "# HELP hcs_extender_refusals_total Nodes refused for a pod, by reason.",
                "# TYPE hcs_extender_refusals_total counter",
            ]
            out += [
                f'hcs_extender_refusals_total{{reason="{r}"}} {n}'
                for r, n in sorted(self.refusals.items())
            ]
            out += [
                "# HELP hcs_extender_binds_total Binds by result.",
                "# TYPE hcs_extender_binds_total counter",
            ]
            out += [
                f'hcs_extender_binds_total{{result="{r}"}} {n}'
                for r, n in sorted(self.binds.items())
            ]
            for name, value in sorted(gauges.items()):
                out += [f"# TYPE {name} gauge", f"{name} {value!r}"]
        return "\n".join(out) + "\n"
