"""Runs the transport fuzz target for a bounded time (libFuzzer through atheris)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest


def seed() -> bytes:
    """A well-formed CreateContainer call on conn 1, so mutations start deep in the parsers."""
    from hcsd.runtime.nri import ttrpc_pb2 as wire
    from hcsd.runtime.nri.mux import HEADER as FRAME
    from hcsd.runtime.nri.ttrpc import encode
    from hcsd.runtime.nri.v1alpha1 import api_pb2 as api

    payload = api.ContainerRequest(
        pod=api.PodSandbox(
            name="p",
            namespace="n",
            uid="u",
            annotations={"hcs.io/vram": "8Gi", "hcs.io/vendors": "nvidia"},
        ),
        container=api.Container(id="c1", name="main", annotations={"hcs.io/devices": "2"}),
    ).SerializeToString()
    request = wire.Request(
        service="nri.pkg.api.v1alpha1.Plugin",
        method="CreateContainer",
        payload=payload,
        timeout_nano=2_000_000_000,
    ).SerializeToString()
    message = encode(1, 1, request)
    return FRAME.pack(1, len(message)) + message


TARGET = Path(__file__).with_name("fuzz_transport.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("atheris") is None,
    reason="atheris is not installed (pip install atheris)",
)
def test_fuzz_transport_for_a_bounded_time(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "create-container").write_bytes(seed())
    result = subprocess.run(
        [
            sys.executable,
            str(TARGET),
            str(corpus),
            "-max_total_time=20",
            "-timeout=5",
            "-rss_limit_mb=1024",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    tail = (result.stdout + result.stderr)[-3000:]
    assert result.returncode == 0, tail
    assert "Done" in tail, tail
