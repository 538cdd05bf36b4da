"""Several kubeconfig files are merged as kubectl merges them (hcsd.cluster.kubeconfig), and
every broken kubeconfig is one line (ViewError), never a traceback. The same merge is checked
against the real kubectl in tests/cluster/test_kubeconfig_merge.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from hcsd.cluster.cluster_reader import ViewError, connect, find_kubeconfig
from hcsd.cluster.kube import Kube


def kubeconfig(
    path: Path,
    *,
    current: str = "",
    clusters: dict[str, dict[str, Any]] | None = None,
    users: dict[str, dict[str, Any]] | None = None,
    contexts: dict[str, tuple[str, str]] | None = None,
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": current,
        "clusters": [{"name": n, "cluster": c} for n, c in (clusters or {}).items()],
        "users": [{"name": n, "user": u} for n, u in (users or {}).items()],
        "contexts": [
            {"name": n, "context": {"cluster": c, "user": u}}
            for n, (c, u) in (contexts or {}).items()
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def joined(*paths: Path) -> str:
    return os.pathsep.join(str(p) for p in paths)


def test_the_first_files_current_context_wins(tmp_path: Path) -> None:
    a = kubeconfig(
        tmp_path / "a",
        current="ctx-a",
        clusters={"ca": {"server": "https://a.example:6443"}},
        users={"ua": {"token": "ta"}},
        contexts={"ctx-a": ("ca", "ua")},
    )
    b = kubeconfig(
        tmp_path / "b",
        current="ctx-b",
        clusters={"cb": {"server": "https://b.example:6443"}},
        users={"ub": {"token": "tb"}},
        contexts={"ctx-b": ("cb", "ub")},
    )
    kube = Kube.connect(joined(a, b))
    assert kube.api.configuration.host == "https://a.example:6443"
    kube.close()


def test_three_files_empty_skipped_first_entry_of_a_name_wins(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("")
    b = kubeconfig(
        tmp_path / "b",
        clusters={"shared": {"server": "https://b.example:6443"}},
        users={"u": {"token": "tb"}},
        contexts={"ctx": ("shared", "u")},
    )
    c = kubeconfig(
        tmp_path / "c",
        current="ctx",
        clusters={"shared": {"server": "https://c.example:6443"}},
        users={"u": {"token": "tc"}},
    )
    kube = Kube.connect(joined(empty, b, c))
    assert kube.api.configuration.host == "https://b.example:6443"
    assert kube.api.configuration.api_key["BearerToken"] == "Bearer tb"
    kube.close()
    environ = {"KUBECONFIG": joined(empty, b, c)}
    assert find_kubeconfig(None, environ, tmp_path) == joined(b, c)


def test_relative_paths_are_resolved_against_their_own_file(tmp_path: Path) -> None:
    """The cluster entry in one directory, the user entry in another: each path is relative
    to the file that names it."""
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    for name in ("one/ca.crt", "two/client.crt", "two/client.key"):
        (tmp_path / name).write_text("x")
    one = kubeconfig(
        tmp_path / "one" / "config",
        current="ctx",
        clusters={"c": {"server": "https://one.example:6443", "certificate-authority": "ca.crt"}},
        contexts={"ctx": ("c", "u")},
    )
    two = kubeconfig(
        tmp_path / "two" / "config",
        users={"u": {"client-certificate": "client.crt", "client-key": "client.key"}},
    )
    kube = Kube.connect(joined(one, two))
    configuration = kube.api.configuration
    assert configuration.ssl_ca_cert == str(tmp_path / "one" / "ca.crt")
    assert configuration.cert_file == str(tmp_path / "two" / "client.crt")
    assert configuration.key_file == str(tmp_path / "two" / "client.key")
    kube.close()


def test_the_kubeconfig_is_never_written(tmp_path: Path) -> None:
    path = kubeconfig(
        tmp_path / "config",
        current="ctx",
        clusters={"c": {"server": "https://c.example:6443"}},
        users={"u": {"token": "t"}},
        contexts={"ctx": ("c", "u")},
    )
    before = path.read_bytes()
    os.chmod(path, 0o444)
    connect(str(path), None)[0].close()
    assert path.read_bytes() == before


def test_all_kubeconfig_files_missing_in_a_pod_is_the_service_account(tmp_path: Path) -> None:
    environ = {"KUBECONFIG": str(tmp_path / "gone"), "KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    assert find_kubeconfig(None, environ, tmp_path) is None


def test_context_without_a_kubeconfig_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ViewError, match="--context prod needs a kubeconfig"):
        connect(None, "prod")


BAD_BASE64 = yaml.safe_dump(
    {
        "current-context": "c",
        "clusters": [
            {
                "name": "c",
                "cluster": {"server": "https://c.example", "certificate-authority-data": "%%%x"},
            }
        ],
        "users": [{"name": "c", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "c"}}],
    }
)
TRUNCATED = "clusters:\n  - name: x\n    cluster: {server: ["


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param(TRUNCATED, "not valid YAML", id="yaml"),
        pytest.param("just a string\n", "not a mapping", id="string"),
        pytest.param("clusters: 3\n", "clusters is not a list", id="section"),
        pytest.param("\n", "is empty", id="blank"),
        pytest.param(BAD_BASE64, "failed to load kubeconfig", id="base64"),
        pytest.param(yaml.safe_dump({"current-context": "x"}), "failed to load", id="context"),
    ],
)
def test_a_broken_kubeconfig_is_one_line(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "config"
    path.write_text(text)
    with pytest.raises(ViewError, match=expected) as raised:
        connect(str(path), None)
    assert "\n" not in str(raised.value)


def test_the_advice_fits_who_asked() -> None:
    """A 403 to system:anonymous is a credential that did not work, not a missing role; in a
    pod the binding to suggest is for its service account."""
    from hcsd.cluster.cluster_reader import _explain
    from hcsd.cluster.cluster_view import Source
    from hcsd.cluster.kube import KubeError

    anonymous = KubeError(403, "Forbidden", 'User "system:anonymous" cannot list resource')
    said = str(_explain(anonymous, Source("https://api", "/k", ""), "list x", ""))
    assert said.startswith("not authenticated to the API server at https://api")
    assert "RBAC" not in said
    user = KubeError(403, "Forbidden", 'User "alice" cannot list resource')
    assert "--user=..." in str(_explain(user, Source("https://api", "/k", ""), "list x", ""))
    pod = str(_explain(user, Source("https://api", "", ""), "list x", ""))
    assert "--serviceaccount=<namespace>:<name>" in pod and "--user" not in pod
