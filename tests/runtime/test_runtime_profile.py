"""The pure parts of runtime profiles on the node: image names compared as a registry client
resolves them, what the runtime's NRI can do, and the env precedence."""

from __future__ import annotations

import logging

import pytest

from hcsd.contract.runtime_binding import RESERVED_ENV, ResolvedRuntime
from hcsd.runtime.container_mounts import ContainerMount
from hcsd.runtime.edits import ContainerEdits, merge
from hcsd.runtime.nri.versions import argv_adjustable
from hcsd.runtime.runtime_profile import (
    apply,
    image_of,
    normalized_image,
    problem,
    reserved,
    same_image,
)
from hcsd.runtime.vendors import VENDOR_RUNTIME


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        pytest.param("busybox", ("docker.io/library/busybox", "latest", ""), id="short"),
        pytest.param("hcs/busybox:test", ("docker.io/hcs/busybox", "test", ""), id="user"),
        pytest.param(
            "index.docker.io/library/busybox:1", ("docker.io/library/busybox", "1", ""), id="index"
        ),
        pytest.param(
            "nvcr.io/nvidia/pytorch:24.10-py3",
            ("nvcr.io/nvidia/pytorch", "24.10-py3", ""),
            id="ngc",
        ),
        pytest.param(
            "localhost:5000/x", ("localhost:5000/x", "latest", ""), id="registry-with-port"
        ),
        pytest.param("repo@sha256:ab", ("docker.io/library/repo", "", "sha256:ab"), id="digest"),
        pytest.param("r.io/a/b:t@sha256:ab", ("r.io/a/b", "t", "sha256:ab"), id="tag-and-digest"),
    ],
)
def test_image_names_are_normalised(reference: str, expected: tuple[str, str, str]) -> None:
    assert normalized_image(reference) == expected


@pytest.mark.parametrize(
    ("expected", "actual", "same"),
    [
        pytest.param("busybox", "docker.io/library/busybox:latest", True, id="short-vs-full"),
        pytest.param("r.io/a:1", "r.io/a:2", False, id="other-tag"),
        pytest.param("r.io/a:1", "r.io/b:1", False, id="other-repository"),
        pytest.param("r.io/a:1@sha256:ab", "r.io/a@sha256:ab", True, id="digest-decides"),
        pytest.param("r.io/a@sha256:ab", "r.io/a@sha256:cd", False, id="other-digest"),
        pytest.param("r.io/a:1", "r.io/a:1@sha256:ab", False, id="digest-on-one-side"),
        pytest.param("r.io/a", "sha256:0123", False, id="an-image-id"),
    ],
)
def test_images_compare_as_resolved(expected: str, actual: str, same: bool) -> None:
    assert same_image(expected, actual) is same


def test_the_runtimes_image_annotation_containerd_first() -> None:
    both = {"io.kubernetes.cri.image-name": "a", "io.kubernetes.cri-o.ImageName": "b"}
    assert image_of(both) == "a"
    assert image_of({"io.kubernetes.cri-o.ImageName": "b"}) == "b"
    assert image_of({"io.containerd.image.name": "c"}) == ""


@pytest.mark.parametrize(
    ("nri", "name", "version", "adjustable"),
    [
        pytest.param("v0.12.0", "containerd", "v2.3.7", True, id="containerd-2.3"),
        pytest.param("", "containerd", "v2.2.1", True, id="containerd-2.2-no-nri-version"),
        pytest.param("", "containerd", "v2.1.9", False, id="containerd-2.1"),
        pytest.param("", "containerd", "v1.7.35", False, id="containerd-1.7"),
        pytest.param("v0.9.1", "containerd", "v9.0.0", False, id="nri-version-decides"),
        pytest.param("", "cri-o", "1.34.0", False, id="unknown-runtime-is-old"),
        pytest.param("", "containerd", "", False, id="no-version"),
    ],
)
def test_which_runtimes_apply_an_argv(nri: str, name: str, version: str, adjustable: bool) -> None:
    assert argv_adjustable(nri, name, version) is adjustable


PROFILE = ResolvedRuntime(
    profile="p",
    image="r.io/base:1",
    env=(("LD_LIBRARY_PATH", "/opt/p/lib"), ("CUDA_VISIBLE_DEVICES", "all"), ("HCS_X", "1")),
    command=("serve",),
)


def test_hcsd_first_then_the_profile(caplog: pytest.LogCaptureFixture) -> None:
    ours = ContainerEdits(
        env=(("LD_LIBRARY_PATH", "/usr/local/nvidia/lib64"), ("CUDA_VISIBLE_DEVICES", "GPU-0"))
    )
    with caplog.at_level(logging.INFO):
        edits = apply(ours, PROFILE, "ns/pod/main")
    env = dict(edits.env)
    assert env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64:/opt/p/lib"
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-0" and "HCS_X" not in env
    assert edits.argv == ("serve",)
    assert "ns/pod/main: runtime profile 'p': not setting CUDA_VISIBLE_DEVICES, HCS_X" in (
        caplog.text
    )


def test_every_vendors_device_selection_is_reserved_in_the_contract() -> None:
    """The node sets these to the devices granted; the contract's set (which the CRD and the
    extender refuse) must name each, whatever the vendor of the node."""
    for vendor, spec in VENDOR_RUNTIME.items():
        for name in (*spec.host_selection_env, *spec.app_selection_env):
            assert name in RESERVED_ENV, (vendor, name)
    assert reserved("HCS_CODE_DIR") and reserved("LD_PRELOAD") and not reserved("NCCL_DEBUG")


def test_another_vendors_selection_is_dropped_too(caplog: pytest.LogCaptureFixture) -> None:
    """On an Ascend node hcsd sets no CUDA_VISIBLE_DEVICES; a profile's is dropped still."""
    env_in = (("CUDA_VISIBLE_DEVICES", "0"), ("NCCL_DEBUG", "WARN"))
    runtime = ResolvedRuntime(profile="p", image="r.io/base:1", env=env_in)
    ours = ContainerEdits(env=(("ASCEND_RT_VISIBLE_DEVICES", "0"),))
    env = dict(apply(ours, runtime, "ns/pod/main").env)
    assert "CUDA_VISIBLE_DEVICES" not in env and env["NCCL_DEBUG"] == "WARN"


def test_merge_keeps_the_last_argv_given() -> None:
    assert merge([ContainerEdits(argv=("a",)), ContainerEdits()]).argv == ("a",)
    assert merge([ContainerEdits(argv=("a",)), ContainerEdits(argv=("b",))]).argv == ("b",)
    assert merge([ContainerEdits()]).argv is None
    assert not ContainerEdits(argv=()).empty


def check(runtime: ResolvedRuntime, **changes: object) -> str | None:
    facts: dict[str, object] = {
        "granted": True,
        "image": runtime.image,
        "mounts": (),
        "argv_adjustable": True,
        "runtime_name": "containerd v2.3.7",
        "nri": True,
    }
    facts.update(changes)
    return problem(runtime, **facts)  # type: ignore[arg-type]


def test_what_refuses_a_profile() -> None:
    assert check(PROFILE) is None
    assert "applied only by hcsd's NRI plugin" in str(check(PROFILE, nri=False))
    assert "grants it no device" in str(check(PROFILE, granted=False))
    assert "which containerd v2.1.9 cannot do" in str(
        check(PROFILE, argv_adjustable=False, runtime_name="containerd v2.1.9")
    )
    envs_only = ResolvedRuntime(profile="p", image="r.io/base:1", code_mount="/code/app")
    assert check(envs_only, argv_adjustable=False) is not None  # no mount at /code/app
    assert check(envs_only, argv_adjustable=False, mounts=(ContainerMount("/code", "/h"),)) is None
    assert check(envs_only, mounts=(ContainerMount("/codex", "/h"),)) is not None
    blank = ResolvedRuntime(profile="p", image="r.io/base:1", command=("",))
    assert "begins with an empty word" in str(check(blank))
