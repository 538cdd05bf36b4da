"""`hcsctl convert`: answers without a daemon, as a table or as JSON."""

from __future__ import annotations

import json

import pytest

from hcsd.cli.hcsctl import main


def test_convert_needs_no_daemon(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--socket", "/nonexistent/hcsd.sock", "convert", "100 TFLOPS fp16"])
    out = capsys.readouterr().out
    assert code == 0
    assert "nvidia/A100-SXM4-80GB" in out and "ascend/Ascend910B3" in out
    assert "1 ACU = 3.12 TFLOPS FP16" in out


def test_convert_to_a_family_prints_rates(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", "8 nvidia/A100-80G", "--to", "ascend/910B"]) == 0
    out = capsys.readouterr().out
    assert "rate: 1 nvidia/A100-SXM4-80GB = 0.997 ascend/Ascend910B3 (by tflops_fp16)" in out


@pytest.mark.parametrize("where", ["after", "before"])
def test_convert_json(capsys: pytest.CaptureFixture[str], where: str) -> None:
    argv = ["convert", "vram 160Gi", "--to", "nvidia/A100-80G"]
    argv = [*argv, "--json"] if where == "after" else ["--json", *argv]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["options"] == [
        {
            "model": "nvidia/A100-SXM4-80GB",
            "per_device": 80 * 2**30,
            "devices": 2,
            "acu_per_device": 100.0,
            "confidence": "datasheet",
            "source": data["options"][0]["source"],
        }
    ]
    assert data["acu"] == {"tflops_fp16": 3.12, "reference": "nvidia/A100-SXM4-80GB"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["convert", "lots"], "cannot read need", id="bad-need"),
        pytest.param(["convert", "1 TFLOPS", "--to", "amd/MI300"], "unknown vendor", id="vendor"),
        pytest.param(["convert", "1 TFLOPS", "--to", "nvidia/B300"], "no model", id="model"),
    ],
)
def test_convert_refusals_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("hcsctl: ") and message in err and err.count("\n") == 1
