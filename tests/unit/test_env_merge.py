"""Path lists in hcsd's env are prepended to the container's own value, never replace it."""

from __future__ import annotations

import pytest

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.frontends.bundle import apply_edits
from hcsd.runtime.edits import ContainerEdits, merge
from hcsd.runtime.env_merge import join_paths, merged_env
from hcsd.runtime.nri.adjust import adjustment

OURS = "/usr/local/nvidia/lib64"


@pytest.mark.parametrize(
    ("values", "joined"),
    [
        pytest.param((OURS, "/opt/conda/lib"), f"{OURS}:/opt/conda/lib", id="prepended"),
        pytest.param((OURS, ""), OURS, id="container-has-none"),
        pytest.param((OURS, f"/opt/conda/lib:{OURS}"), f"{OURS}:/opt/conda/lib", id="no-dupes"),
        pytest.param(("/a::/b:", ":/c:"), "/a:/b:/c", id="no-empty-elements"),
        pytest.param(("", "::"), "", id="nothing"),
        pytest.param(("/b:/a", "/a:/c:/b"), "/b:/a:/c", id="stable-order"),
    ],
)
def test_join_paths(values: tuple[str, ...], joined: str) -> None:
    assert join_paths(*values) == joined


@pytest.mark.parametrize(
    ("theirs", "merged"),
    [
        pytest.param("/opt/conda/lib", f"{OURS}:/opt/conda/lib", id="prepended"),
        pytest.param("", OURS, id="container-has-none"),
        pytest.param(".:lib::/x;/y:", f"{OURS}:.:lib::/x;/y:", id="theirs-untouched"),
        pytest.param(f"{OURS}:/opt/conda/lib", f"{OURS}:/opt/conda/lib", id="already-merged"),
        pytest.param(f"/opt/conda/lib:{OURS}", f"{OURS}:/opt/conda/lib:{OURS}", id="theirs-dupe"),
    ],
)
def test_the_containers_value_follows_ours_untouched(theirs: str, merged: str) -> None:
    assert merged_env([("LD_LIBRARY_PATH", OURS)], [f"LD_LIBRARY_PATH={theirs}"]) == [
        ("LD_LIBRARY_PATH", merged)
    ]


def test_a_long_value_follows_ours_as_it_is() -> None:
    theirs = ":".join(f"/d{n}" for n in range(200_000)) + ":" * 100_000
    ((_key, value),) = merged_env([("PATH", "/usr/bin")], {"PATH": theirs})
    assert value == f"/usr/bin:{theirs}"


def test_only_path_lists_are_merged() -> None:
    container = ["LD_LIBRARY_PATH=/opt/conda/lib", "PATH=/opt/conda/bin:", "CUDA_VISIBLE_DEVICES=7"]
    ours = [("LD_LIBRARY_PATH", OURS), ("PATH", "/usr/bin"), ("CUDA_VISIBLE_DEVICES", "0")]
    assert merged_env(ours, container) == [
        ("LD_LIBRARY_PATH", f"{OURS}:/opt/conda/lib"),
        ("PATH", "/usr/bin:/opt/conda/bin:"),  # theirs as it was
        ("CUDA_VISIBLE_DEVICES", "0"),  # a selection is ours alone
    ]


def test_the_nri_adjustment_carries_the_merged_value() -> None:
    edits = ContainerEdits(env=(("LD_LIBRARY_PATH", OURS),))
    adjusted = adjustment(edits, ["LD_LIBRARY_PATH=/opt/conda/lib:"])
    assert [(e.key, e.value) for e in adjusted.env] == [
        ("LD_LIBRARY_PATH", f"{OURS}:/opt/conda/lib:")
    ]


def test_edits_from_several_sources_join_their_path_lists() -> None:
    merged = merge(
        [
            ContainerEdits(env=(("LD_LIBRARY_PATH", "/a"), ("HCS_X", "1"))),
            ContainerEdits(env=(("LD_LIBRARY_PATH", "/b:/a"), ("HCS_X", "2"))),
        ]
    )
    assert dict(merged.env) == {"LD_LIBRARY_PATH": "/a:/b", "HCS_X": "2"}


def test_the_runc_wrapper_patch_merges_and_stays_idempotent() -> None:
    config = {"process": {"env": ["LD_LIBRARY_PATH=/opt/conda/lib", "HOME=/root"]}}
    edits = pb.PrepareContainerResponse(env={"LD_LIBRARY_PATH": OURS})
    once = apply_edits(config, edits)["process"]["env"]
    assert once == ["HOME=/root", f"LD_LIBRARY_PATH={OURS}:/opt/conda/lib"]
    assert apply_edits(config, edits)["process"]["env"] == once
