"""The metrics bench's node, and its memory measurement, with nothing imported that loads
prometheus_client: `python bench/metrics_node.py old|new` runs in a fresh interpreter, takes
its resident memory with hcsd's own modules and the service in place, then imports and
renders one scrape with the renderer named, and prints what that added. bench.common and the
test harness import prometheus_client themselves, so they are not imported here: a baseline
taken after them would leave the library's import out of the figure.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hcsd.discovery import discover_all  # noqa: E402
from hcsd.discovery.backends.simulated import SimulatedBackend  # noqa: E402
from hcsd.ledger import Ledger  # noqa: E402
from hcsd.model import Request, Vendor  # noqa: E402
from hcsd.service import NodeService  # noqa: E402

__all__ = ["MODELS", "OLD_COMMIT", "node_file", "old_renderer", "service"]

OLD_COMMIT = "8b2f4dc"
MODELS = (
    [("nvidia", "A100-SXM4-80GB", "80Gi", 312)] * 8
    + [("ascend", "Ascend910B3", "64Gi", 313)] * 4
    + [("cambricon", "MLU370-X8", "48Gi", 96)] * 4
)


def node_file(path: Path) -> Path:
    lines = []
    for index, (vendor, model, vram, tflops) in enumerate(MODELS):
        lines += [
            "[[device]]",
            f'uuid = "DEV-{index:04d}-0000-0000-000000000000"',
            f'vendor = "{vendor}"',
            f'model = "{model}"',
            f"index = {index}",
            f'pci_bus_id = "0000:{0x17 + index:02x}:00.0"',
            f'vram = "{vram}"',
            f"tflops_fp16 = {tflops}",
            f'nodes = ["/dev/bench{index}:240:{index}"]',
            "",
        ]
    path.write_text("\n".join(lines))
    return path


def service(directory: Path) -> NodeService:
    inventory = discover_all("bench", [SimulatedBackend(node_file(directory / "node.toml"))])
    ledger = Ledger(str(directory / "state"))
    ledger.open()
    node = NodeService(inventory, ledger)
    for vendor in (Vendor.NVIDIA, Vendor.ASCEND, Vendor.CAMBRICON):
        for n in range(sum(1 for m in MODELS if m[0] == vendor.value) * 2):
            node.allocate(
                Request(f"{vendor.value}-{n}", vram_bytes=2**30, vendors=frozenset({vendor}))
            )
    return node


def old_renderer() -> types.ModuleType:
    """The last hand-rendered `hcsd/daemon/metrics.py`, read from git under another name."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{OLD_COMMIT}:hcsd/daemon/metrics.py"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    module = types.ModuleType("hcsd_old_metrics")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"{OLD_COMMIT}:hcsd/daemon/metrics.py", "exec"), module.__dict__)
    return module


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def measure(which: str) -> dict[str, int]:
    """RSS added by importing the renderer and rendering once; the import alone for "new"."""
    # What hcsd imports anyway, whichever renderer it has: only the renderer's own cost counts.
    import hcsd.daemon.serving
    import hcsd.health.watching
    import hcsd.sections
    import hcsd.watchdog.metric_families  # noqa: F401

    assert "prometheus_client" not in sys.modules, "the baseline would hold the library"
    with tempfile.TemporaryDirectory() as directory:
        node = service(Path(directory))
        before = rss_kib()
        if which == "old":
            old_renderer().render_metrics(node)
            return {"rss_delta_kib": rss_kib() - before}
        from hcsd.daemon.metrics import exposition, registry
        from hcsd.telemetry import Telemetry

        imported = rss_kib()
        exposition(registry(node, telemetry=Telemetry()))
        return {"rss_delta_kib": rss_kib() - before, "import_kib": imported - before}


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1])))
