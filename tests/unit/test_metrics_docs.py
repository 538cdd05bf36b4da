"""docs/metrics.md lists exactly what hcsd and the extender export: the rules and the dashboard
depend on those names, so a name cannot change or appear without the document saying so. Both
the families and the sample names a scraper reads (a histogram's `_bucket`, the library's
`_created`) are compared with it."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from hcsd.cluster.extender import Extender
from hcsd.cluster.healer_metrics import HealerMetrics
from hcsd.cluster.http import serve
from hcsd.cluster.kube import Kube
from hcsd.contract.keyring import Keyring
from hcsd.daemon.metrics import registry
from hcsd.discovery import Inventory
from hcsd.health.settings import HealthSection
from hcsd.health.watching import HealthWatcher
from hcsd.ledger import Ledger
from hcsd.profiles.database import ProfileDatabase
from hcsd.service import NodeService
from hcsd.telemetry import Telemetry
from hcsd.watchdog import Watchdog
from hcsd.watchdog.settings import WatchdogSection
from hcsd.watchdog.watchdog import Policy, WatchdogSettings

DOC = Path(__file__).parents[2] / "docs" / "metrics.md"
STANDARD = ("process_", "python_")  # prometheus_client's own collectors, listed in prose
ROW = re.compile(r"^\| `([a-z][a-z0-9_:]*)` \| (gauge|counter|histogram) \|", re.M)


def documented(section: str) -> dict[str, str]:
    text = DOC.read_text()
    part = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return dict(ROW.findall(part))


def exported(families: Iterable[Metric]) -> dict[str, str]:
    """Names as a scraper sees them: counters with `_total`, info with `_info`."""
    found = {}
    for family in families:
        if family.name.startswith(STANDARD):
            continue
        if family.type == "counter":
            found[family.name + "_total"] = "counter"
        elif family.type == "info":
            found[family.name + "_info"] = "gauge"
        else:
            found[family.name] = family.type
    return found


# The sample names each documented type may render, besides the name itself; `_created` is
# prometheus_client's (the document says so in its preamble).
SUFFIXES = {
    "counter": ("_created",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
}


def rendered_samples(found: CollectorRegistry) -> set[str]:
    """The sample names in the classic text body, as Prometheus stores them."""
    text = generate_latest(found).decode()
    return {
        s.name
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.startswith(STANDARD)
    }


def allowed(section: str) -> set[str]:
    names = set()
    for name, kind in documented(section).items():
        base = name.removesuffix("_total")
        names.add(name)
        names.update(base + suffix for suffix in SUFFIXES[kind])
    return names


def test_the_documented_created_samples_are_what_the_library_renders() -> None:
    assert "`<name>_created`" in DOC.read_text()


def test_hcsd_exports_what_the_document_lists(mixed_inventory: Inventory, ledger: Ledger) -> None:
    service = NodeService(mixed_inventory, ledger)
    watcher = HealthWatcher(service, HealthSection(), sysfs="/nonexistent")
    section = WatchdogSection()
    settings = WatchdogSettings(1.0, section.tolerance(), Policy.WARN)
    vram = Watchdog([], service.allocations, lambda v: None, settings)
    telemetry = Telemetry()
    telemetry.nri_sessions = 0
    found = registry(service, watcher, vram, telemetry)
    assert exported(found.collect()) == documented("hcsd (per node)")
    assert rendered_samples(found) - allowed("hcsd (per node)") == set()


def test_the_extender_exports_what_the_document_lists() -> None:
    keys = Keyring({"k1": b"k" * 32}, "k1")
    extender = Extender(Kube.__new__(Kube), lambda: keys, ProfileDatabase.load())
    server = serve(extender, "127.0.0.1", 0)
    try:
        found = exported(server.registry.collect())
        samples = rendered_samples(server.registry)
    finally:
        server.server_close()
    section = "hcs-scheduler-extender (per replica)"
    assert found == documented(section)
    assert samples - allowed(section) == set()


def test_the_controller_exports_what_the_document_lists() -> None:
    metrics = HealerMetrics()
    # labelled families show their samples once a child exists
    metrics.evictions.labels("evicted", "HCSDeviceFailed").inc()
    metrics.conditions.labels("HCSDeviceFailed").inc()
    metrics.taints.labels("taint").inc()
    metrics.errors.labels("evict").inc()
    section = "hcs-controller (per replica)"
    assert exported(metrics.registry.collect()) == documented(section)
    assert rendered_samples(metrics.registry) - allowed(section) == set()
