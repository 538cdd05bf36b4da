"""docs/metrics.md lists exactly what hcsd and the extender export: the rules and the dashboard
depend on those names, so a name cannot change or appear without the document saying so."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from prometheus_client.metrics_core import Metric

from hcsd.cluster.extender import Extender
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
ROW = re.compile(r"^\| `([a-z_:]+)` \| (gauge|counter|histogram) \|", re.M)


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


def test_the_extender_exports_what_the_document_lists() -> None:
    keys = Keyring({"k1": b"k" * 32}, "k1")
    extender = Extender(Kube.__new__(Kube), lambda: keys, ProfileDatabase.load())
    server = serve(extender, "127.0.0.1", 0)
    try:
        found = exported(server.registry.collect())
    finally:
        server.server_close()
    assert found == documented("hcs-scheduler-extender (per replica)")
