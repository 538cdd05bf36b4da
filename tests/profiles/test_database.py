"""The shipped profile database: complete, sourced, and resolvable from vendor spellings."""

from __future__ import annotations

from pathlib import Path

import pytest

from hcsd.model import Vendor
from hcsd.profiles import FIGURES, ProfileDatabase, ProfileError, default_database
from hcsd.profiles.database import DEFAULT_GEMM_EFFICIENCY
from hcsd.profiles.fingerprint import rated_figures

REQUIRED = [
    "nvidia/A100-SXM4-40GB",
    "nvidia/A100-SXM4-80GB",
    "nvidia/A800-SXM4-80GB",
    "nvidia/H100-SXM5-80GB",
    "nvidia/H100-PCIe",
    "nvidia/H800-SXM5-80GB",
    "nvidia/H800-PCIe",
    "nvidia/H20",
    "nvidia/H200-SXM-141GB",
    "nvidia/L40S",
    "nvidia/L20",
    "nvidia/V100-SXM2-32GB",
    "nvidia/T4",
    "nvidia/A10",
    "ascend/Ascend910A",
    "ascend/Ascend910B1",
    "ascend/Ascend910B2",
    "ascend/Ascend910B3",
    "ascend/Ascend910B4",
    "ascend/Ascend310P3",
    "hygon/Z100",
    "hygon/Z100L",
    "hygon/K100",
    "hygon/K100-AI",
    "cambricon/MLU370-X4",
    "cambricon/MLU370-X8",
    "cambricon/MLU590",
]


@pytest.mark.parametrize("key", REQUIRED)
def test_every_required_model_is_present_with_sourced_figures(key: str) -> None:
    db = default_database()
    [profile] = db.find(key)
    assert profile.key == key
    assert profile.vram_bytes > 0
    assert profile.figure("tflops_fp16") > 0
    for name in profile.figures:
        assert profile.source_of(name)


def test_acu_is_one_percent_of_an_a100() -> None:
    db = default_database()
    assert db.acu_tflops == pytest.approx(3.12)
    [a100] = db.find("nvidia/A100-80G")
    assert db.acu(a100) == pytest.approx(100.0)


@pytest.mark.parametrize(
    ("vendor", "spelling", "model"),
    [
        pytest.param(Vendor.NVIDIA, "NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB", id="nvml-a100"),
        pytest.param(Vendor.NVIDIA, "NVIDIA H100 80GB HBM3", "H100-SXM5-80GB", id="nvml-h100"),
        pytest.param(Vendor.NVIDIA, "Tesla T4", "T4", id="nvml-t4"),
        pytest.param(Vendor.ASCEND, "910B3", "Ascend910B3", id="npu-smi-910b3"),
        pytest.param(Vendor.ASCEND, "310P3", "Ascend310P3", id="npu-smi-310p"),
        pytest.param(Vendor.HYGON, "K100_AI", "K100-AI", id="hy-smi-k100-ai"),
        pytest.param(Vendor.CAMBRICON, "MLU370-X8", "MLU370-X8", id="cnmon-x8"),
    ],
)
def test_vendor_spellings_resolve(vendor: Vendor, spelling: str, model: str) -> None:
    profile = default_database().lookup(vendor, spelling)
    assert profile is not None and profile.model == model


def test_a_family_prefix_lists_its_variants() -> None:
    models = [p.model for p in default_database().find("ascend/910B")]
    assert models == ["Ascend910B1", "Ascend910B2", "Ascend910B3", "Ascend910B4"]


def test_unknown_model_is_none_not_a_guess() -> None:
    assert default_database().lookup(Vendor.NVIDIA, "NVIDIA B300") is None


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "profiles.toml"
    path.write_text('[acu]\nreference = "nvidia/X"\n' + body)
    return path


GOOD = """
[[model]]
vendor = "nvidia"
model = "X"
vram = "1Gi"
tflops_fp16 = 10
tflops_bf16 = 10
tflops_fp32 = 1
tops_int8 = 20
source = "test"
confidence = "datasheet"
"""


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        pytest.param(('source = "test"', ""), "every figure needs a source", id="no-source"),
        pytest.param(("tops_int8 = 20", ""), "give or list as unpublished", id="missing-fig"),
        pytest.param(("tflops_fp16 = 10", "tflops_fp16 = -1"), "non-negative", id="negative"),
        pytest.param(
            ('confidence = "datasheet"', 'confidence = "hope"'), "confidence", id="confidence"
        ),
        pytest.param(('vram = "1Gi"', 'vram = "1GB"'), "vram", id="bad-vram"),
        pytest.param(("source", "colour = 1\nsource"), "unknown key", id="unknown-key"),
        pytest.param(
            ("source", "gemm_efficiency = 1.2\nsource"), "gemm_efficiency", id="efficiency>1"
        ),
        pytest.param(
            ("source", "gemm_efficiency = 0\nsource"), "gemm_efficiency", id="efficiency-zero"
        ),
        pytest.param(
            ("source", 'gemm_efficiency = "high"\nsource'), "gemm_efficiency", id="efficiency-text"
        ),
    ],
)
def test_bad_entries_are_refused_with_the_model_named(
    tmp_path: Path, edit: tuple[str, str], message: str
) -> None:
    with pytest.raises(ProfileError, match=message) as info:
        ProfileDatabase.load(_write(tmp_path, GOOD.replace(*edit)))
    assert "nvidia/X" in str(info.value) or "profile database" in str(info.value)


def test_a_good_file_loads(tmp_path: Path) -> None:
    db = ProfileDatabase.load(_write(tmp_path, GOOD))
    [x] = db.profiles
    assert set(x.figures) == set(FIGURES)
    assert db.acu_tflops == pytest.approx(0.1)


def test_gemm_efficiency_is_optional_with_a_documented_default(tmp_path: Path) -> None:
    [x] = ProfileDatabase.load(_write(tmp_path, GOOD)).profiles
    assert x.gemm_efficiency == DEFAULT_GEMM_EFFICIENCY == 0.7
    body = GOOD.replace("source", "gemm_efficiency = 0.85\nsource")
    [y] = ProfileDatabase.load(_write(tmp_path, body)).profiles
    assert y.gemm_efficiency == 0.85


@pytest.mark.parametrize(
    ("measured", "efficiency", "fp16", "bf16"),
    [
        pytest.param(7.0, 0.7, 10.0, 10.0, id="typical-card-at-profile"),
        pytest.param(9.0, 0.7, 10.0, 10.0, id="never-above-profile"),
        pytest.param(3.5, 0.7, 5.0, 5.0, id="half-as-good-half-the-rate"),
        pytest.param(4.25, 0.85, 5.0, 5.0, id="per-model-efficiency"),
    ],
)
def test_a_measured_card_is_rated_against_a_typical_one(
    tmp_path: Path, measured: float, efficiency: float, fp16: float, bf16: float
) -> None:
    body = GOOD.replace("source", f"gemm_efficiency = {efficiency}\nsource")
    [x] = ProfileDatabase.load(_write(tmp_path, body)).profiles
    assert rated_figures(x, measured) == {"tflops_fp16": fp16, "tflops_bf16": bf16}


def test_without_a_profile_figure_the_measured_one_is_used() -> None:
    assert rated_figures(None, 123.4) == {"tflops_fp16": 123.4}
