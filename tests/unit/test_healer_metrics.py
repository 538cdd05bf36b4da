"""hcs-controller's counters exist at 0 from its start, so the first eviction is an increase."""

from __future__ import annotations

from hcsd.cluster.healer_metrics import HealerMetrics


def test_the_labelled_counters_start_at_zero() -> None:
    registry = HealerMetrics().registry
    for labels in (
        {"result": "evicted", "reason": "HCSDeviceFailed"},
        {"result": "evicted", "reason": "HCSDeviceDegraded"},
        {"result": "blocked", "reason": "HCSDeviceFailed"},
        {"result": "opted_out", "reason": "HCSDeviceFailed"},
    ):
        assert registry.get_sample_value("hcs_controller_evictions_total", labels) == 0.0
    for action in ("taint", "untaint"):
        assert registry.get_sample_value("hcs_controller_taints_total", {"action": action}) == 0
    assert registry.get_sample_value("hcs_controller_api_errors_total", {"action": "evict"}) == 0
