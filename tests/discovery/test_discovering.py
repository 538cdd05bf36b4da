"""The daemon's side of discovery: `auto`, factories from config keys, real backends over fakes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hcsd.daemon.config import Config, ConfigError, load_config
from hcsd.daemon.discovering import build_backends, expand_auto, plan
from hcsd.discovery import discover_all
from tests.fakes import Function, make_sysfs
from tests.fakes.nodes import nvidia_node


def _config(tmp_path: Path, **discovery: object) -> Path:
    lines = ["[discovery]"]
    for key, value in discovery.items():
        rendered = f'"{value}"' if isinstance(value, str) else str(value).lower()
        if isinstance(value, list):
            rendered = "[" + ", ".join(f'"{v}"' for v in value) + "]"
        lines.append(f"{key} = {rendered}")
    path = tmp_path / "hcsd.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_auto_runs_the_vendors_on_the_bus(tmp_path: Path) -> None:
    sysfs = make_sysfs(
        tmp_path / "sys",
        [
            Function("0000:17:00.0", 0x10DE, 0x20B2),
            Function("0000:3d:00.0", 0x1D94, 0x6210, class_code=0x038000),
            Function("0000:00:00.0", 0x1D94, 0x1450, class_code=0x060000),  # a CPU bridge
        ],
    )
    config = load_config(str(_config(tmp_path, backends=["auto"], sysfs=str(sysfs))))
    assert expand_auto(config.discovery) == ["nvidia", "hygon"]
    assert [b.name for b in build_backends(config.discovery)] == ["nvidia", "hygon"]


def test_auto_on_a_node_without_accelerators_runs_nothing(tmp_path: Path) -> None:
    config = load_config(str(_config(tmp_path, backends=["auto"], sysfs=str(tmp_path))))
    assert build_backends(config.discovery) == []


def test_auto_is_the_default() -> None:
    """The packaged conffile is rendered from the defaults: a fresh install runs `auto`."""
    assert Config().discovery.backends == ("auto",)


def test_auto_says_why_each_vendor_does_not_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One info line and one note per vendor not on the bus: a node with zero devices says
    why (`hcsctl status` shows the notes)."""
    sysfs = make_sysfs(tmp_path / "sys", [Function("0000:3d:00.0", 0xCABC, 0x0590)])
    config = load_config(str(_config(tmp_path, backends=["auto"], sysfs=str(sysfs))))
    with caplog.at_level(logging.INFO, logger="hcsd.daemon.discovering"):
        chosen = plan(config.discovery)
    assert chosen.names == ("cambricon",)
    assert chosen.notes == tuple(
        f"{vendor}: not run, no {product} on the PCI bus (vendor {vid}, display or "
        f"accelerator class, in {sysfs})"
        for vendor, product, vid in [
            ("nvidia", "NVIDIA GPU", "0x10de"),
            ("ascend", "Huawei Ascend NPU", "0x19e5"),
            ("hygon", "Hygon DCU", "0x1d94"),
        ]
    )
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert lines == ["discovery: auto found cambricon on the PCI bus"] + [
        f"discovery: {note}" for note in chosen.notes
    ]


def test_named_backends_need_no_notes(tmp_path: Path) -> None:
    """A vendor named beside `auto` is not reported missing; without `auto`, nothing is."""
    config = load_config(str(_config(tmp_path, backends=["nvidia", "auto"], sysfs=str(tmp_path))))
    chosen = plan(config.discovery)
    assert chosen.names == ("nvidia",)
    assert [n.split(":")[0] for n in chosen.notes] == ["ascend", "hygon", "cambricon"]
    config = load_config(str(_config(tmp_path, backends=["auto", "hygon"], sysfs=str(tmp_path))))
    assert [n.split(":")[0] for n in plan(config.discovery).notes] == [
        "nvidia",
        "ascend",
        "cambricon",
    ]
    config = load_config(str(_config(tmp_path, backends=["simulated"])))
    assert plan(config.discovery).notes == ()


def test_unknown_backend_names_the_available_ones(tmp_path: Path) -> None:
    """Refused when the file is read (`hcsd --check-config` too), not when discovery starts."""
    with pytest.raises(
        ConfigError,
        match=r"discovery.backends: expected a list of: simulated, nvidia, ascend, hygon, "
        r"cambricon, auto, got \['nvidai'\]",
    ):
        load_config(str(_config(tmp_path, backends=["nvidai"])))


def test_real_backends_over_fakes_from_the_config_file(
    tmp_path: Path, devfs: Path, fake_libs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The simulated node as "real backends over fakes": only the config file differs."""
    node = nvidia_node(tmp_path, count=4)
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(node.config))
    path = _config(
        tmp_path,
        backends=["auto"],
        sysfs=str(node.sysfs),
        dev_root=str(node.dev),
        nvml_library=str(fake_libs / "libnvidia-ml.so.1"),
    )
    backends = build_backends(load_config(str(path)).discovery)
    try:
        inventory = discover_all("node", backends)
    finally:
        for backend in backends:
            backend.close()
    assert inventory.backends == ("nvidia",)
    assert [d.model for d in inventory.devices] == ["A100-SXM4-80GB"] * 4
