"""The self-healing cluster: the kubelet cluster with health watching on, short clocks, and
hcs-controller running, for tests/kubelet/test_self_healing.py.

What differs from `kubelet_cluster` (cluster.py), and why:

- **Node names and PCI addresses of their own.** The nodes are `heal-gpu` and `heal-npu`
  (the cgroup roots and Node objects are named after them, so this cluster runs beside the
  others). Their simulated devices get random PCI domains: the tests write kernel lines to
  /dev/kmsg, which is the machine's, and every hcsd on this host that watches the kernel
  (other tests', other checkouts') reads them. A line naming 0000:17:00.0, the address the
  other kubelet clusters' devices have, would fail their devices; and their crafted lines
  (tests/health writes Xid 79 for 0000:17:00) must not fail ours.
- **hcsd watches the kernel through eBPF** (`health.source = "ebpf"`, bpf/build): the
  /dev/kmsg reader takes only lines the kernel printed (a line written from user space has
  another facility), so a crafted line is seen through the printk tracepoint only. The
  quiet period, the sub-health hold and recovery, and the polls are seconds, not minutes.
- **A fake sysfs per node** (`discovery.sysfs`): the simulated device's PCI function with its
  link, which a test down-trains (`set_link_width`) for the sub-health signal
  `pcie-link-width`; hcsd never reads the host's /sys for these devices.
- **hcs-controller runs** as a host process (cluster.start_controller) with the flags of
  `controller_flags`: a round every 0.5 s, a 1 s debounce (`--min-bad-seconds`, 10 s
  shipped), the taint off 2 s after recovery (300 s shipped).
"""

from __future__ import annotations

import json
import secrets
import ssl
import threading
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

from hcsd.api.client import ApiError, Client
from hcsd.api.v1 import hcsd_pb2 as pb
from tests.fakes import Function, make_sysfs
from tests.harness.daemon import Settings
from tests.harness.kubecluster import hcs
from tests.harness.kubecluster.cluster import KubeletCluster
from tests.harness.kubecluster.vendors import ASCEND, NVIDIA, VendorNode

GPU, NPU = "heal-gpu", "heal-npu"
#: hcsd's health settings on both nodes (seconds): a fatal fault keeps a device unhealthy
#: for QUIET_PERIOD, long enough that the Job's replacement (created ~10 s after the evicted
#: pod ended, the Job controller's back-off) is placed while the failed node is still out.
QUIET_PERIOD = 30.0
SUBHEALTH_HOLD = 2.0
SUBHEALTH_RECOVERY = 2.0
POLL = 0.5  # health.aer_poll_interval: the vendor counters' and sub-health's poll
CONTROLLER_QUIET = 2.0  # hcs-controller's --quiet-seconds before a taint goes
MIN_BAD = 1.0  # hcs-controller's --min-bad-seconds
LINK_SPEED = "16.0 GT/s PCIe"
LINK_WIDTH = 16
PCI_IDS = {"nvidia": (0x10DE, 0x20B2, 0x030200), "ascend": (0x19E5, 0xD802, 0x120000)}


def unique_addresses(count: int) -> list[str]:
    """`count` PCI addresses in distinct random domains (module docstring: /dev/kmsg is the
    machine's). Domains 0x1000-0xfffe: no real machine here has one that high."""
    domains: set[int] = set()
    while len(domains) < count:
        domains.add(0x1000 + secrets.randbelow(0xEFFF))
    return [f"{domain:04x}:17:00.0" for domain in sorted(domains)]


def vendors() -> dict[str, VendorNode]:
    gpu, npu = unique_addresses(2)
    return {GPU: replace(NVIDIA, pci_bus_id=gpu), NPU: replace(ASCEND, pci_bus_id=npu)}


def sysfs_of(work: Path, node: str) -> Path:
    return work / f"sysfs-{node}"


def make_node_sysfs(work: Path, node: str, vendor: VendorNode) -> Path:
    """The device's PCI function, its link at its maximum (x16, Gen4)."""
    vendor_id, device_id, class_code = PCI_IDS[vendor.vendor]
    function = Function(vendor.pci_bus_id, vendor_id, device_id, class_code,
                        speed=LINK_SPEED, width=LINK_WIDTH)  # fmt: skip
    return make_sysfs(sysfs_of(work, node), [function])


def set_link_width(work: Path, node: str, vendor: VendorNode, width: int) -> None:
    """The link as the card trained it (the maximum stays): a down-trained card at < x16."""
    path = sysfs_of(work, node) / "bus" / "pci" / "devices" / vendor.pci_bus_id
    (path / "current_link_width").write_text(f"{width}\n")


def hcsd_settings(work: Path, node: str, bpf_dir: Path) -> Settings:
    return {
        "discovery": {"sysfs": str(sysfs_of(work, node))},
        "health": {
            "source": "ebpf",
            "bpf_dir": str(bpf_dir),
            "quiet_period": QUIET_PERIOD,
            "tick_interval": 0.2,
            "aer_poll_interval": POLL,
            "subhealth_hold": SUBHEALTH_HOLD,
            "subhealth_recovery": SUBHEALTH_RECOVERY,
        },
    }


def controller_flags(*, isolate_degraded: bool = False) -> list[str]:
    """The shipped policy (taint when all devices are bad, NoSchedule, the brakes' limits)
    with the test's clocks; `isolate_degraded`: the policy that evicts degraded devices' pods."""
    return [
        "--interval-seconds", "0.5", "--min-bad-seconds", str(MIN_BAD),
        "--quiet-seconds", str(CONTROLLER_QUIET), "--backoff-seconds", "0.5",
        *(["--isolate-degraded"] if isolate_degraded else []),
    ]  # fmt: skip


def xid_line(bus_id: str, xid: int = 79) -> str:
    """An NVIDIA driver's Xid line as the kernel prints it (hcsd/health/parsing.py reads
    `NVRM: Xid (PCI:<domain>:<bus>:<device>): <code>, ...`, function 0)."""
    return f"NVRM: Xid (PCI:{bus_id.rsplit('.', 1)[0]}): {xid}, pid=1, GPU has fallen off the bus."


class HealthWatch:
    """hcsd's API watch on one node, in a thread: each state the device was reported in, with
    the time it arrived (the device's current state first, then every change)."""

    def __init__(self, socket: str, uuid: str) -> None:
        self.client = Client(socket, timeout=5)
        self.uuid = uuid
        self.seen: list[tuple[float, int, dict[str, str]]] = []  # (monotonic, state, attributes)
        self._synced = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hcsd-watch", daemon=True)
        self._thread.start()
        if not self._synced.wait(10):
            raise AssertionError(f"hcsd's watch on {socket} did not start")

    def _run(self) -> None:
        try:
            for event in self.client.watch(send_initial=True):
                if event.kind == pb.Event.KIND_SYNCED:
                    self._synced.set()
                if event.HasField("device") and event.device.uuid == self.uuid:
                    device = event.device
                    self.seen.append(
                        (time.monotonic(), device.health_state, dict(device.attributes))
                    )
        except ApiError:
            return  # closed

    def wait(self, state: int, since: float, timeout: float) -> tuple[float, dict[str, str]]:
        """When the device was first reported in `state` at `since` or later, and its
        attributes then."""
        deadline = time.monotonic() + timeout
        while True:
            for at, seen, attributes in list(self.seen):
                if at >= since and seen == state:
                    return at, attributes
            if time.monotonic() > deadline:
                shown = [(round(at - since, 3), pb.HealthState.Name(s)) for at, s, _ in self.seen]
                raise AssertionError(
                    f"device {self.uuid} not {pb.HealthState.Name(state)} in {timeout:g} s: {shown}"
                )
            time.sleep(0.002)

    def close(self) -> None:
        self.client.close()


def extender_scores(
    cluster: KubeletCluster, pod: dict[str, Any], nodes: list[str]
) -> dict[str, int]:
    """The extender's prioritize verb for `pod` on `nodes` (0-10 each), called as
    kube-scheduler calls it: its client certificate over mutual TLS."""
    certs = cluster.control.work / "certs"
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    context.load_cert_chain(certs / "scheduler.crt", certs / "scheduler.key")
    request = urllib.request.Request(
        hcs.extender_url(cluster.extender) + "prioritize",
        data=json.dumps({"Pod": pod, "NodeNames": nodes}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        return {str(p["Host"]): int(p["Score"]) for p in json.load(answer)}
