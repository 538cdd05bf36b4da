"""hcsd's CreateContainer handling as the runtime sees it, on a 20-device simulated node.

A runtime peer (the same mux/ttrpc layers, playing containerd's side) drives the real plugin
over a socketpair: CreateContainer with `hcs.io/vram`, then StopContainer and RemoveContainer,
10,000 times. Reported: in-plugin handling time (p50/p99; target p99 < 5 ms), the round trip
seen by the peer, and resident memory after warm-up vs after all cycles (target: no growth).
The ledger is real (fsync'd journal in a temporary directory).
"""

from __future__ import annotations

import asyncio
import gc
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import summary_us, write_result
from bench.idle import rss_bytes
from hcsd.discovery import discover_all
from hcsd.discovery.backends.simulated import SimulatedBackend
from hcsd.ledger import Ledger
from hcsd.runtime.injector import Injector, InjectorSettings
from hcsd.runtime.nri.mux import Mux
from hcsd.runtime.nri.plugin import NriPlugin
from hcsd.runtime.nri.ttrpc import Client, Server
from hcsd.runtime.nri.v1alpha1 import api_pb2 as api
from hcsd.runtime.settings import RuntimeSection
from hcsd.service import NodeService

CYCLES = 10_000
WARMUP = 1_000
DEVICES = 20


def node_file(directory: Path) -> Path:
    lines = ['[shared_nodes]\nnvidia = ["/dev/nvidiactl:195:255", "/dev/nvidia-uvm:235:0"]\n']
    for i in range(DEVICES):
        lines.append(
            f'[[device]]\nuuid = "GPU-bench-{i:04d}"\nvendor = "nvidia"\nmodel = "H100-SXM5-80GB"\n'
            f'index = {i}\npci_bus_id = "0000:{i + 16:02x}:00.0"\nvram = "80Gi"\n'
            f'tflops_fp16 = 989\nnodes = ["/dev/nvidia{i}:195:{i}"]\n'
        )
    for i in range(0, DEVICES, 2):
        lines.append(
            f'[[link]]\na = "GPU-bench-{i:04d}"\nb = "GPU-bench-{i + 1:04d}"\n'
            'kind = "nvlink"\ngbps = 450\n'
        )
    path = directory / "node.toml"
    path.write_text("\n".join(lines))
    return path


async def run() -> dict[str, object]:
    directory = Path(tempfile.mkdtemp(prefix="hcs-nri-bench-"))
    inventory = discover_all("bench", [SimulatedBackend(node_file(directory))])
    ledger = Ledger(str(directory / "state"))
    ledger.open()
    service = NodeService(inventory, ledger)
    (directory / "libhcs.so").write_bytes(b"x")
    injector = Injector(
        service,
        InjectorSettings(
            "bench",
            str(directory / "run"),
            RuntimeSection(libhcs_path=str(directory / "libhcs.so")),
        ),
    )
    plugin = NriPlugin(injector)
    ours, theirs = socket.socketpair()
    session = asyncio.create_task(plugin.session(*await asyncio.open_unix_connection(sock=ours)))
    reader, writer = await asyncio.open_unix_connection(sock=theirs)
    mux = Mux(reader, writer)
    to_plugin, from_plugin = mux.open(1), mux.open(2)

    async def register(payload: bytes) -> bytes:
        return api.Empty().SerializeToString()

    server = Server(
        {("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin"): register},
        lambda data: mux.send(2, data),
    )
    client = Client(lambda data: mux.send(1, data))
    tasks = [
        asyncio.create_task(mux.run()),
        asyncio.create_task(server.serve(from_plugin)),
        asyncio.create_task(client.receive(to_plugin)),
    ]
    await asyncio.wait_for(plugin.connected.wait(), 5)

    async def call(method: str, request: api.ContainerRequest) -> bytes:
        return await client.call(
            "nri.pkg.api.v1alpha1.Plugin", method, request.SerializeToString(), timeout=2
        )

    round_trips: list[float] = []
    rss_after_warmup = rss_half = 0
    for i in range(CYCLES + WARMUP):
        request = api.ContainerRequest(
            pod=api.PodSandbox(id=f"sb-{i}", name=f"pod-{i}", namespace="bench", uid=f"uid-{i}"),
            container=api.Container(
                id=f"ctr-{i:08d}", name="main", annotations={"hcs.io/vram": f"{1 + i % 16}Gi"}
            ),
        )
        started = time.perf_counter()
        await call("CreateContainer", request)
        if i >= WARMUP:
            round_trips.append(time.perf_counter() - started)
        await call("StopContainer", request)
        await call("RemoveContainer", request)
        if i == WARMUP - 1:
            plugin.create_seconds.clear()
            gc.collect()
            rss_after_warmup = rss_bytes_self()
        if i == WARMUP + CYCLES // 2:
            gc.collect()
            rss_half = rss_bytes_self()
    gc.collect()
    rss_end = rss_bytes_self()
    in_plugin = list(plugin.create_seconds)
    for task in tasks:
        task.cancel()
    mux.close()
    await asyncio.gather(session, return_exceptions=True)
    ledger.close()
    return {
        "devices": DEVICES,
        "cycles": CYCLES,
        "create_in_plugin": summary_us(in_plugin),
        "create_round_trip": summary_us(round_trips),
        "rss_after_warmup_mb": round(rss_after_warmup / 1e6, 2),
        "rss_halfway_mb": round(rss_half / 1e6, 2),
        "rss_after_cycles_mb": round(rss_end / 1e6, 2),
        "rss_growth_second_half_mb": round((rss_end - rss_half) / 1e6, 2),
        "rss_growth_mb": round((rss_end - rss_after_warmup) / 1e6, 2),
        "allocations_left": len(service.allocations()),
        "target_p99_us": 5000,
    }


def rss_bytes_self() -> int:
    import os

    return rss_bytes(os.getpid())


def main() -> dict[str, object]:
    result = asyncio.run(run())
    inside = result["create_in_plugin"]
    assert isinstance(inside, dict)
    result["meets_target"] = inside["p99_us"] < 5000 and float(str(result["rss_growth_mb"])) < 2
    path = write_result("nri", result)
    trip = result["create_round_trip"]
    assert isinstance(trip, dict)
    print(
        f"NRI CreateContainer on a {DEVICES}-device node ({CYCLES} cycles): in-plugin p50 "
        f"{inside['p50_us']} us, p99 {inside['p99_us']} us; round trip p50 {trip['p50_us']} us, "
        f"p99 {trip['p99_us']} us; RSS {result['rss_after_warmup_mb']} -> "
        f"{result['rss_halfway_mb']} (halfway) -> {result['rss_after_cycles_mb']} MB "
        f"(the in-plugin timing list itself holds {CYCLES} floats) -> {path}"
    )
    return result


if __name__ == "__main__":
    main()
