"""The node's RDMA fabric domain from a fake sysfs tree with the kernel's layout
(tests.fakes.rdma): InfiniBand subnets, RoCE, ports not active, the setting."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from hcsd.contract.names import FABRIC_DOMAIN
from hcsd.daemon.config import ConfigError, load_config
from hcsd.daemon.fabric_watch import rescan_fabric, watch_fabric
from hcsd.discovery import Inventory
from hcsd.discovery.fabric import DEFAULT_PREFIX, Fabric, Port, discover_fabric, read_ports
from hcsd.discovery.settings import DiscoverySection
from hcsd.ledger import Ledger
from hcsd.service import NodeService
from tests.fakes.rdma import FakePort, make_rdma


def test_an_infiniband_port_names_its_subnet(tmp_path: Path) -> None:
    gid = "fec0:0000:0000:0001:0002:c903:0031:7a51"
    sysfs = make_rdma(tmp_path, [FakePort("mlx5_0", gid0=gid)])
    fabric = discover_fabric(sysfs)
    assert fabric == Fabric(
        "ib:fec0:0000:0000:0001", "infiniband",
        (Port("mlx5_0", 1, "InfiniBand", "200 Gb/sec (4X HDR)", subnet="fec0:0000:0000:0001"),),
    )  # fmt: skip
    assert fabric.ports[0].describe() == (
        "mlx5_0/1 InfiniBand 200 Gb/sec (4X HDR) subnet fec0:0000:0000:0001"
    )


def test_the_default_prefix_is_a_domain_with_a_warning(tmp_path: Path) -> None:
    fabric = discover_fabric(make_rdma(tmp_path, [FakePort("mlx5_0")]))
    assert fabric.domain == f"ib:{DEFAULT_PREFIX}"
    (note,) = fabric.notes
    assert "default" in note and "discovery.fabric_domain" in note


@pytest.mark.parametrize(
    "state", [pytest.param("1: DOWN", id="down"), pytest.param("2: INIT", id="init"),
              pytest.param("3: ARMED", id="armed")],
)  # fmt: skip
def test_ports_not_active_are_not_counted(tmp_path: Path, state: str) -> None:
    sysfs = make_rdma(tmp_path, [
        FakePort("mlx5_0", state=state, gid0="fec0:0000:0000:0001:0002:c903:0031:7a51"),
        FakePort("mlx5_1", pci="0000:5e:00.0", gid0="fec0:0000:0000:0002:0002:c903:0031:7a52"),
    ])  # fmt: skip
    fabric = discover_fabric(sysfs)
    assert fabric.domain == "ib:fec0:0000:0000:0002"
    waits = [n for n in fabric.notes if "not ACTIVE yet" in n]
    if state == "1: DOWN":
        assert waits == []  # unplugged: nothing will change by itself
    else:
        assert waits and f"mlx5_0/1 {state[3:]}" in waits[0] and "every 30 s" in waits[0]


def test_a_port_waiting_for_the_subnet_manager_is_noted_without_a_domain(tmp_path: Path) -> None:
    sysfs = make_rdma(tmp_path, [FakePort("mlx5_0", state="2: INIT")])
    fabric = discover_fabric(sysfs)
    assert fabric.domain == "" and fabric.ports == ()
    assert fabric.notes == ("RDMA ports mlx5_0/1 INIT are not ACTIVE yet (the subnet manager "
                            "has not brought them up): read again every 30 s",)  # fmt: skip


def test_ports_on_several_subnets_name_them_all(tmp_path: Path) -> None:
    sysfs = make_rdma(tmp_path, [
        FakePort("mlx5_1", pci="0000:5e:00.0", gid0="fec0:0000:0000:0002:0002:c903:0031:7a52"),
        FakePort("mlx5_0", gid0="fec0:0000:0000:0001:0002:c903:0031:7a51"),
    ])  # fmt: skip
    fabric = discover_fabric(sysfs)
    assert fabric.domain == "ib:fec0:0000:0000:0001/fec0:0000:0000:0002"
    assert [p.device for p in fabric.ports] == ["mlx5_0", "mlx5_1"]
    assert "2 subnets (fec0:0000:0000:0001, fec0:0000:0000:0002)" in fabric.notes[0]


def test_many_rails_are_named_by_a_hash_that_fits(tmp_path: Path) -> None:
    gids = [f"fec0:0000:0000:000{i}:0002:c903:0031:7a5{i}" for i in range(1, 5)]
    ports = [FakePort(f"mlx5_{i}", pci=f"0000:{i}e:00.0", gid0=g) for i, g in enumerate(gids)]
    domain = discover_fabric(make_rdma(tmp_path, ports)).domain
    assert domain.startswith("ib:4-subnets-") and len(domain) <= 64
    assert FABRIC_DOMAIN.fullmatch(domain)
    two = discover_fabric(make_rdma(tmp_path / "two", ports[:2])).domain
    assert FABRIC_DOMAIN.fullmatch(two) and len(two) <= 64
    again = discover_fabric(make_rdma(tmp_path / "other", list(reversed(ports)))).domain
    assert again == domain  # the order the kernel lists them in does not matter


def test_roce_needs_the_operator_and_shows_its_netdev(tmp_path: Path) -> None:
    sysfs = make_rdma(tmp_path, [
        FakePort("mlx5_0", link_layer="Ethernet", ndev="ens1f0", rate="100 Gb/sec (4X EDR)",
                 gid0="fe80:0000:0000:0000:0a5c:2cff:fe01:0203"),
        FakePort("mlx5_1", pci="0000:5e:00.0", link_layer="Ethernet", net="ens2f0",
                 gid0="fe80:0000:0000:0000:0a5c:2cff:fe01:0204"),
    ])  # fmt: skip
    fabric = discover_fabric(sysfs)
    assert (fabric.domain, fabric.source) == ("", "")
    assert [p.netdev for p in fabric.ports] == ["ens1f0", "ens2f0"]  # ndevs/0, then device/net
    assert [p.subnet for p in fabric.ports] == ["", ""]  # a link-local GID names no fabric
    assert "mlx5_0/1 (ens1f0), mlx5_1/1 (ens2f0)" in fabric.notes[0]
    named = discover_fabric(sysfs, "roce-pod-a")
    assert (named.domain, named.source, named.ports) == ("roce-pod-a", "config", fabric.ports)


def test_roce_picks_the_netdev_of_its_own_port(tmp_path: Path) -> None:
    """A dual-port device whose GIDs name no netdev: each port is matched through dev_port."""
    sysfs = make_rdma(tmp_path, [
        FakePort("mlx5_0", number=1, link_layer="Ethernet", net="ens1f0", dev_port="0"),
        FakePort("mlx5_0", number=2, link_layer="Ethernet", net="ens1f1", dev_port="1"),
    ])  # fmt: skip
    assert [p.netdev for p in discover_fabric(sysfs).ports] == ["ens1f0", "ens1f1"]


def test_the_setting_wins_over_discovery(tmp_path: Path) -> None:
    sysfs = make_rdma(tmp_path, [FakePort("mlx5_0")])
    assert discover_fabric(sysfs, "ib-west").domain == "ib-west"


def test_no_rdma_device_no_domain(tmp_path: Path) -> None:
    fabric = discover_fabric(tmp_path)
    assert (fabric.domain, fabric.ports) == ("", ())
    assert fabric.notes == ("no active RDMA port: the node has no fabric domain",)


@pytest.mark.parametrize(
    "gid", [pytest.param("0000:0000:0000:0000:0000:0000:0000:0000", id="empty-slot"),
            pytest.param("garbage", id="garbled"), pytest.param("", id="unreadable")],
)  # fmt: skip
def test_a_gid_without_a_subnet_names_none(tmp_path: Path, gid: str) -> None:
    sysfs = make_rdma(tmp_path, [FakePort("mlx5_0", gid0=gid)])
    assert read_ports(sysfs)[0].subnet == ""
    assert discover_fabric(sysfs).domain == ""


@pytest.mark.parametrize(
    ("value", "ok"),
    [pytest.param("", True, id="empty"), pytest.param("ib:fec0:0000:0000:0001", True, id="ib"),
     pytest.param("roce/pod-a_1.x", True, id="roce"), pytest.param("-a", False, id="dash"),
     pytest.param("a b", False, id="space"), pytest.param("a\nb", False, id="newline"),
     pytest.param("x" * 65, False, id="long")],
)  # fmt: skip
def test_the_setting_takes_names_only(tmp_path: Path, value: str, ok: bool) -> None:
    path = tmp_path / "hcsd.toml"
    path.write_text(f"[discovery]\nfabric_domain = {value!r}\n".replace("'", '"'))
    if ok:
        assert load_config(str(path)).discovery.fabric_domain == value
    else:
        with pytest.raises(ConfigError, match="fabric_domain"):
            load_config(str(path))


def test_a_port_that_comes_up_after_start_gives_the_node_its_domain(
    tmp_path: Path, ledger: Ledger
) -> None:
    """At boot the port waits in INIT; the periodic read finds it ACTIVE and the service (what
    GetNode reports, so what the syncer writes) takes the new fabric."""
    gid = "fec0:0000:0000:0001:0002:c903:0031:7a51"
    make_rdma(tmp_path, [FakePort("mlx5_0", state="2: INIT", gid0=gid)])
    service = NodeService(Inventory("node", (), (), fabric=discover_fabric(tmp_path)), ledger)
    assert service.fabric.domain == "" and "not ACTIVE yet" in service.fabric.notes[0]
    assert rescan_fabric(service, tmp_path) is False  # nothing moved
    state = tmp_path / "devices/pci0000:00/0000:3b:00.0/infiniband/mlx5_0/ports/1/state"
    state.write_text("4: ACTIVE\n")  # the subnet manager swept the fabric
    assert rescan_fabric(service, tmp_path) is True
    assert service.fabric.domain == "ib:fec0:0000:0000:0001" and service.fabric.notes == ()


def test_the_daemon_reads_the_ports_again_on_its_own(tmp_path: Path, ledger: Ledger) -> None:
    make_rdma(tmp_path, [FakePort("mlx5_0", state="3: ARMED")])
    service = NodeService(Inventory("node", (), (), fabric=discover_fabric(tmp_path)), ledger)
    state = tmp_path / "devices/pci0000:00/0000:3b:00.0/infiniband/mlx5_0/ports/1/state"
    state.write_text("4: ACTIVE\n")

    async def watch_briefly() -> None:
        settings = DiscoverySection(sysfs=str(tmp_path))
        task = asyncio.create_task(watch_fabric(service, settings, every=0.01))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if service.fabric.domain:
                break
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(watch_briefly())
    assert service.fabric.domain == f"ib:{DEFAULT_PREFIX}"
