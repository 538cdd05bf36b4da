"""hcs-syncer's kubelet DRA plugin between a real kube-apiserver and a real hcsd, called as
kubelet calls it (its gRPC services on its sockets): registration, prepare and unprepare in
both API versions, a replaced claim, kill -9 of the syncer and of hcsd between calls.

The claim's allocation is written through the status subresource, as kube-scheduler writes
it; tests/kubelet/test_dra.py runs the same path with kube-scheduler and kubelet."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from hcsd.api.client import Client
from hcsd.cluster.kube import KubeError
from hcsd.cluster.kubeletplugin.plugin import PluginPaths
from hcsd.cluster.kubeletplugin.wire import (
    dra_health_v1alpha1_pb2,
    dra_v1_pb2,
    dra_v1beta1_pb2,
    registration_v1_pb2,
)
from hcsd.contract import dra
from tests.cluster.controlplane import ControlPlane
from tests.cluster.test_dra_slices import NODE as TWO_A100S
from tests.harness.daemon import Daemon
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.slow

NODE = "test-node"  # the harness hcsd's node name
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


class Kubelet:
    """What kubelet sends on the plugin's sockets."""

    def __init__(self, paths: PluginPaths) -> None:
        self.paths = paths

    def _call(self, socket: str, method: str, request: Any, answer: Any) -> Any:
        with grpc.insecure_channel(f"unix:{socket}") as channel:
            call = channel.unary_unary(
                method,
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=answer.FromString,
            )
            return call(request, timeout=30)

    def info(self) -> Any:
        return self._call(
            self.paths.registration,
            "/pluginregistration.Registration/GetInfo",
            registration_v1_pb2.InfoRequest(),
            registration_v1_pb2.PluginInfo,
        )

    def notify(self, registered: bool, error: str = "") -> None:
        self._call(
            self.paths.registration,
            "/pluginregistration.Registration/NotifyRegistrationStatus",
            registration_v1_pb2.RegistrationStatus(plugin_registered=registered, error=error),
            registration_v1_pb2.RegistrationStatusResponse,
        )

    def prepare(self, claim: dict[str, Any], wire: Any = dra_v1_pb2, uid: str = "") -> Any:
        meta = claim["metadata"]
        request = wire.NodePrepareResourcesRequest(
            claims=[wire.Claim(namespace="default", name=meta["name"], uid=uid or meta["uid"])]
        )
        return self._call(
            self.paths.endpoint,
            f"/{wire.DESCRIPTOR.package}.DRAPlugin/NodePrepareResources",
            request,
            wire.NodePrepareResourcesResponse,
        )

    def unprepare(self, claim: dict[str, Any], wire: Any = dra_v1_pb2) -> Any:
        meta = claim["metadata"]
        request = wire.NodeUnprepareResourcesRequest(
            claims=[wire.Claim(namespace="default", name=meta["name"], uid=meta["uid"])]
        )
        return self._call(
            self.paths.endpoint,
            f"/{wire.DESCRIPTOR.package}.DRAPlugin/NodeUnprepareResources",
            request,
            wire.NodeUnprepareResourcesResponse,
        )


class Syncer:
    """hcs-syncer with --kubelet-plugin as a process of this test's own."""

    def __init__(self, plane: ControlPlane, hcsd: Daemon, kubelet_dir: Path, log: Path) -> None:
        self.command = [
            sys.executable, "-m", "hcsd.cluster.syncer_cli", "--node-name", NODE,
            "--socket", hcsd.socket, "--kubeconfig", str(plane.syncer_config(NODE)),
            "--kubelet-plugin", "--kubelet-dir", str(kubelet_dir),
        ]  # fmt: skip
        self.paths = PluginPaths.of(str(kubelet_dir))
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        wait_for(self.serving, "the plugin's registration socket to answer", timeout=30)

    def serving(self) -> bool:
        """Someone answers on the registration socket (a stale one refuses connections)."""
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(self.paths.registration)
        except OSError:
            return False
        finally:
            probe.close()
        return True

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.process is not None
        self.process.send_signal(sig)
        return self.process.wait(15)


@pytest.fixture
def hcsd(tmp_path: Path) -> Iterator[Daemon]:
    libhcs = tmp_path / "libhcs.so"
    libhcs.write_bytes(b"placeholder: the claim's files are checked, not the library")
    daemon = Daemon(tmp_path / "hcsd", settings={"runtime": {"nri": False, "libhcs_path": libhcs}})
    daemon.start()
    yield daemon
    daemon.close()


@pytest.fixture
def syncer(plane: ControlPlane, hcsd: Daemon, tmp_path: Path) -> Iterator[Syncer]:
    kubelet_dir = Path(tempfile.mkdtemp(prefix="hcs-kl-", dir="/tmp"))  # short socket paths
    running = Syncer(plane, hcsd, kubelet_dir, tmp_path / "syncer.log")
    try:
        running.start()
        yield running
    finally:
        if running.process is not None and running.process.poll() is None:
            running.stop()
        shutil.rmtree(kubelet_dir, ignore_errors=True)


@pytest.fixture
def claim(plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A ResourceClaim allocated 16Gi and 30% of nvidia-0 on this node, as the scheduler
    writes it (a share of a device with multiple allocations)."""
    admin = plane.kube()
    name = f"claim-{request.node.name.replace('_', '-')[:40].lower().strip('-')}"
    created = admin.create(
        CLAIMS,
        {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": dra.CLASS_ANY,
                "capacity": {"requests": {"memory": "16Gi", "compute": "30"}},
            }}]}},
        },
    )  # fmt: skip
    created["status"] = {
        "allocation": {
            "devices": {
                "results": [{
                    "request": "gpu", "driver": dra.DRIVER, "pool": NODE, "device": "nvidia-0",
                    "shareID": "7e0f4a2c-1d3b-4e5f-8a9b-0c1d2e3f4a5b",
                    "consumedCapacity": {"memory": "16Gi", "compute": "30"},
                }],
            },
        },
    }  # fmt: skip
    allocated = admin.replace(f"{CLAIMS}/{name}/status", created)
    yield allocated
    try:
        admin.request("DELETE", f"{CLAIMS}/{name}")
    except KubeError as e:
        if not e.not_found:
            raise
    admin.close()


def held(hcsd: Daemon) -> dict[str, Any]:
    with Client(hcsd.socket) as client:
        return {a.container_id: a for a in client.allocations()}


def test_kubelet_registers_the_driver(syncer: Syncer) -> None:
    info = Kubelet(syncer.paths).info()
    assert info.type == "DRAPlugin"
    assert info.name == dra.DRIVER
    assert info.endpoint == syncer.paths.endpoint
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert syncer.paths.endpoint.endswith("/plugins/compute.hcs.io/dra.sock")
    assert syncer.paths.registration.endswith("/plugins_registry/compute.hcs.io-reg.sock")
    Kubelet(syncer.paths).notify(False, "no such version")
    assert syncer.stop() == 0  # a clean stop unregisters: the socket goes first
    assert not Path(syncer.paths.registration).exists()
    assert not Path(syncer.paths.endpoint).exists()
    assert "did not register the DRA plugin compute.hcs.io: no such version" in (
        syncer.log.read_text()
    )


def test_prepare_and_unprepare_in_both_versions(
    syncer: Syncer, hcsd: Daemon, claim: dict[str, Any]
) -> None:
    kubelet = Kubelet(syncer.paths)
    uid = claim["metadata"]["uid"]
    answer = kubelet.prepare(claim).claims[uid]
    assert answer.error == ""
    (device,) = answer.devices
    assert list(device.request_names) == ["gpu"]
    assert (device.pool_name, device.device_name) == (NODE, "nvidia-0")
    assert list(device.cdi_device_ids) == [f"compute.hcs.io/claim={uid}-nvidia-0"]
    assert device.share_id == "7e0f4a2c-1d3b-4e5f-8a9b-0c1d2e3f4a5b"
    grants = held(hcsd)[f"claim-{uid}"].grants
    assert [(g.vram_bytes, g.compute_percent) for g in grants] == [(16 * 2**30, 30)]
    # kubelet may ask again (its restart, ours): the same answer, in either version
    assert kubelet.prepare(claim).claims[uid] == answer
    beta = kubelet.prepare(claim, dra_v1beta1_pb2).claims[uid]
    assert [list(d.cdi_device_ids) for d in beta.devices] == [list(device.cdi_device_ids)]
    assert kubelet.unprepare(claim, dra_v1beta1_pb2).claims[uid].error == ""
    assert f"claim-{uid}" not in held(hcsd)
    assert kubelet.unprepare(claim).claims[uid].error == ""  # again: nothing held, no error


def test_a_replaced_claim_is_not_prepared(
    syncer: Syncer, hcsd: Daemon, claim: dict[str, Any]
) -> None:
    stale = "11111111-2222-4333-8444-555555555555"
    answer = Kubelet(syncer.paths).prepare(claim, uid=stale).claims[stale]
    assert "it was replaced" in answer.error
    assert not answer.devices
    assert not held(hcsd)


def test_kill_9_of_the_syncer_and_of_hcsd(
    syncer: Syncer, hcsd: Daemon, claim: dict[str, Any]
) -> None:
    kubelet = Kubelet(syncer.paths)
    uid = claim["metadata"]["uid"]
    first = kubelet.prepare(claim).claims[uid]
    syncer.stop(signal.SIGKILL)  # its sockets stay behind, nobody answering
    assert Path(syncer.paths.registration).exists()
    syncer.start()  # replaces the stale sockets
    assert kubelet.prepare(claim).claims[uid] == first
    assert hcsd.process is not None
    hcsd.process.kill()
    hcsd.process.wait()
    failed = kubelet.prepare(claim).claims[uid]  # hcsd down: an error kubelet retries
    assert failed.error.startswith("failed to prepare: ") and hcsd.socket in failed.error
    Path(hcsd.socket).unlink(missing_ok=True)
    hcsd.start()
    assert kubelet.prepare(claim).claims[uid] == first  # the ledger kept the claim
    assert kubelet.unprepare(claim).claims[uid].error == ""
    assert not held(hcsd)


def test_a_second_live_instance_refuses_to_start(
    syncer: Syncer, plane: ControlPlane, hcsd: Daemon, tmp_path: Path
) -> None:
    kubelet_dir = Path(syncer.paths.registration).parent.parent
    second = Syncer(plane, hcsd, kubelet_dir, tmp_path / "second.log")
    with open(second.log, "ab") as log:
        code = subprocess.run(
            second.command, check=False, stdout=log, stderr=subprocess.STDOUT, timeout=60
        )
    assert code.returncode != 0
    assert "another instance serves" in second.log.read_text()
    assert Kubelet(syncer.paths).info().name == dra.DRIVER  # the first still serves


def test_kubelet_watches_the_devices_health(plane: ControlPlane, tmp_path: Path) -> None:
    """kubelet's health stream (v1alpha1 NodeWatchResources) on the DRA socket: every device
    of the pool, Healthy; a fatal ECC count makes nvidia-0 Unhealthy until hcsd's quiet period
    passes; hcsd gone, every device is Unknown."""
    node_file = tmp_path / "node.toml"
    node_file.write_text(TWO_A100S.format(errors=0))
    daemon = Daemon(
        tmp_path / "hcsd",
        node_file=node_file,
        settings={"health": {"quiet_period": 3.0, "tick_interval": 0.2, "aer_poll_interval": 0.2}},
    )
    daemon.start()
    kubelet_dir = Path(tempfile.mkdtemp(prefix="hcs-kl-", dir="/tmp"))
    running = Syncer(plane, daemon, kubelet_dir, tmp_path / "syncer.log")
    wire = dra_health_v1alpha1_pb2
    try:
        running.start()
        with grpc.insecure_channel(f"unix:{running.paths.endpoint}") as channel:
            watch = channel.unary_stream(
                "/v1alpha1.DRAResourceHealth/NodeWatchResources",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=wire.NodeWatchResourcesResponse.FromString,
            )
            stream = iter(watch(wire.NodeWatchResourcesRequest(), timeout=60))

            def until(health: dict[str, int]) -> Any:
                for message in stream:
                    seen = {d.device.device_name: d.health for d in message.devices}
                    if seen == health:
                        return message
                raise AssertionError(f"the stream ended before {health}")

            healthy = wire.HEALTHY
            first = until({"nvidia-0": healthy, "nvidia-1": healthy})
            assert {d.device.pool_name for d in first.devices} == {NODE}
            assert all(d.health_check_timeout_seconds == 30 for d in first.devices)
            node_file.write_text(TWO_A100S.format(errors=1))
            sick = until({"nvidia-0": wire.UNHEALTHY, "nvidia-1": healthy})
            assert sick.devices[0].message == "hcsd: unhealthy"
            until({"nvidia-0": healthy, "nvidia-1": healthy})  # recovered after the quiet period
            daemon.close()
            gone = until({"nvidia-0": wire.UNKNOWN, "nvidia-1": wire.UNKNOWN})
            assert gone.devices[0].message == "hcsd does not answer"
    finally:
        if running.process is not None and running.process.poll() is None:
            running.stop()
        shutil.rmtree(kubelet_dir, ignore_errors=True)
        daemon.close()
