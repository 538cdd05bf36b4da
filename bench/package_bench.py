"""Package figures: sizes of the built .deb/.rpm, and start->READY and idle RSS of the
installed service as measured on the VM by tests/e2e/test_vm.py (bench/out/e2e_vm.json).

Run `make package` and `pytest tests/e2e/test_vm.py` first; missing inputs are reported, not
invented. Writes bench/out/package.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench/out"


def main() -> int:
    result: dict[str, object] = {"packages": {}}
    for path in sorted((REPO / "dist").glob("hcsd*")):
        if path.suffix in (".deb", ".rpm"):
            result["packages"][path.name] = path.stat().st_size  # type: ignore[index]
            print(f"{path.name}: {path.stat().st_size / 1e6:.1f} MB")
    if not result["packages"]:
        print("no packages in dist/: run make package")
    vm = OUT / "e2e_vm.json"
    if vm.exists():
        figures = json.loads(vm.read_text())
        keep = ("start_to_ready_ms", "idle_rss_kib", "security", "accel", "kernel", "systemd")
        result["vm"] = {k: figures.get(k) for k in keep}
        print(
            f"VM ({figures.get('accel')}): start->READY {figures.get('start_to_ready_ms')} ms, "
            f"idle RSS {figures.get('idle_rss_kib')} KiB, "
            f"systemd-analyze security {figures.get('security')}"
        )
    else:
        print("no VM figures: run pytest tests/e2e/test_vm.py")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "package.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
