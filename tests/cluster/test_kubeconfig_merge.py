"""Our merge of several kubeconfig files against the real kubectl's (the one built at the
control plane's release): the same current context, cluster, user and credential files, with
a missing file, an empty one, a name defined twice and relative paths in two directories.
Needs no API server: `kubectl config` reads the files only."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hcsd.cluster.kube import Kube
from tests.harness.peers.kubernetes import ensure_kubernetes_node
from tests.unit.test_kubeconfig import kubeconfig

pytestmark = pytest.mark.slow


def kubectl(env_kubeconfig: str, *args: str) -> str:
    node = ensure_kubernetes_node()
    if not isinstance(node, Path):
        pytest.skip(f"no kubectl built: {node}")
    done = subprocess.run(
        [str(node / "kubectl"), "config", *args],
        capture_output=True, text=True, check=True, timeout=60,
        env={"PATH": os.environ.get("PATH", ""), "KUBECONFIG": env_kubeconfig,
             "HOME": "/nonexistent"},
    )  # fmt: skip
    return done.stdout


def data_of(path: str) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode()


def test_the_merge_is_kubectls(tmp_path: Path) -> None:
    for name, text in (("one/ca.crt", "ca of one"), ("two/ca.crt", "ca of two"),
                       ("two/client.crt", "cert of two"), ("two/client.key", "key of two"),
                       ("three/client.crt", "cert of three")):  # fmt: skip
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    empty = tmp_path / "empty"
    empty.write_text("")
    one = kubeconfig(
        tmp_path / "one" / "config",
        clusters={"c": {"server": "https://one.example:6443", "certificate-authority": "ca.crt"}},
        contexts={"ctx": ("c", "u")},
    )
    two = kubeconfig(
        tmp_path / "two" / "config",
        current="ctx",
        clusters={"c": {"server": "https://two.example:6443", "certificate-authority": "ca.crt"}},
        users={"u": {"client-certificate": "client.crt", "client-key": "client.key"}},
        contexts={"ctx": ("other", "u"), "two": ("c", "u")},
    )
    three = kubeconfig(
        tmp_path / "three" / "config",
        current="three",
        users={"u": {"client-certificate": "client.crt", "client-key": "client.key"}},
    )
    files = os.pathsep.join(str(p) for p in (tmp_path / "gone", empty, one, two, three))
    theirs: dict[str, Any] = json.loads(kubectl(files, "view", "--flatten", "--minify", "-o=json"))
    assert kubectl(files, "current-context").strip() == theirs["current-context"] == "ctx"
    present = os.pathsep.join(str(p) for p in (empty, one, two, three))
    ours = Kube.connect(present).api.configuration
    cluster, user = theirs["clusters"][0]["cluster"], theirs["users"][0]["user"]
    assert ours.host == cluster["server"] == "https://one.example:6443"
    assert data_of(ours.ssl_ca_cert) == cluster["certificate-authority-data"]
    assert data_of(ours.cert_file) == user["client-certificate-data"]
    assert data_of(ours.key_file) == user["client-key-data"]
    assert Path(ours.cert_file).read_text() == "cert of two"
