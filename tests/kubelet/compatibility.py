"""The cross-vendor compatibility report: the RuntimeProfiles the test submits, the checks it
makes from inside each container (as data, so that the report's rows are known without a
cluster), the results it records, and docs/compatibility.md written from them.

tests/kubelet/test_compatibility.py runs the same pod spec under each profile once pinned to
each vendor and records one `Result` per check. With HCS_WRITE_COMPATIBILITY set (`make
compatibility-report`) it writes the report; otherwise it fails unless the report it would
write is the checked-in one, byte for byte. tests/kubelet/test_compatibility_doc.py (fast, no
cluster) checks that the checked-in report is what `render` makes of its own rows, that its
rows are exactly the checks below for every vendor and profile, and that every row passed: a
check added, renamed or dropped here without a run fails there.

`python -m tests.kubelet.compatibility check` does the fast check from the command line.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hcsd.contract.names import (
    ANNOTATION_RUNTIME_PROFILE,
    API_VERSION,
    GROUP,
    RUNTIME_PROFILE_KIND,
    RUNTIME_PROFILES,
)
from tests.cluster.controlplane import MANIFESTS, manifests
from tests.harness.kubecluster.runtime_images import BASE_IMAGES, CODE_IMAGE
from tests.harness.kubecluster.vendors import ASCEND, NVIDIA, VendorNode

DOC = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"
CRD = f"{RUNTIME_PROFILES}.{GROUP}"
CRD_FILE = MANIFESTS / "crds" / f"{RUNTIME_PROFILES}.yaml"  # as main ships it
PROFILES_PATH = f"/apis/{API_VERSION}/{RUNTIME_PROFILES}"
WRITE_ENV = "HCS_WRITE_COMPATIBILITY"
PASS = "pass"
CODE_MOUNT = "/workspace"
VENDORS: dict[str, VendorNode] = {"nvidia": NVIDIA, "ascend": ASCEND}
NODE_OF = {"nvidia": "kube-gpu", "ascend": "kube-npu"}
# The vendors' own names for what their allocation API does.
API = {"nvidia": "cuMemAlloc_v2 of libcuda.so.1", "ascend": "aclrtMalloc of libascendcl.so"}
OOM_NAME = {"nvidia": "CUDA_ERROR_OUT_OF_MEMORY", "ascend": "ACL_ERROR_RT_MEMORY_ALLOCATION"}
OVER_MIB, UNDER_MIB, HELD_MIB = 20480, 8192, 4096  # the pod's limit is 16Gi


@dataclass(frozen=True)
class Profile:
    """One RuntimeProfile of the test: its name, kind, the pod's own command, and per vendor
    the profile's env (no HCS_* name: hcsd keeps those for itself) and (for inference) the
    command and args that replace the pod's."""

    name: str
    kind: str  # training | inference
    pod_command: tuple[str, ...]
    env: dict[str, tuple[tuple[str, str], ...]]
    command: tuple[str, ...] | None = None
    args: dict[str, tuple[str, ...]] | None = None

    def argv(self, vendor: str) -> tuple[str, ...]:
        """What the container must run on `vendor`'s node."""
        if self.command is None:
            return self.pod_command
        return self.command + (self.args or {}).get(vendor, ())

    def manifest(self) -> dict[str, Any]:
        """The RuntimeProfile object (cluster-scoped; docs/runtime-profiles.md)."""
        runtimes = []
        for vendor, base in BASE_IMAGES.items():
            entry: dict[str, Any] = {
                "vendor": vendor,
                "image": base.name,
                "env": [{"name": k, "value": v} for k, v in self.env[vendor]],
            }
            if self.command is not None:
                entry["command"] = list(self.command)
                entry["args"] = list((self.args or {}).get(vendor, ()))
            runtimes.append(entry)
        return {
            "apiVersion": API_VERSION,
            "kind": RUNTIME_PROFILE_KIND,
            "metadata": {"name": self.name},
            "spec": {
                "description": f"compatibility report: {self.kind} (stand-in images)",
                "codeMount": CODE_MOUNT,
                "runtimes": runtimes,
            },
        }


TRAINING = Profile(
    name="compat-train",
    kind="training",
    pod_command=("sh", f"{CODE_MOUNT}/train.sh"),
    env={
        "nvidia": (("NCCL_DEBUG", "INFO"), ("TORCH_DEVICE_BACKEND", "cuda")),
        "ascend": (("HCCL_CONNECT_TIMEOUT", "1200"), ("TORCH_DEVICE_BACKEND", "npu")),
    },
)
INFERENCE = Profile(
    name="compat-serve",
    kind="inference",
    pod_command=("sh", f"{CODE_MOUNT}/serve.sh", "--backend", "cpu"),
    env={
        "nvidia": (("SERVE_BACKEND", "tensorrt"),),
        "ascend": (("SERVE_BACKEND", "acl"),),
    },
    command=("sh", f"{CODE_MOUNT}/serve.sh"),
    args={
        "nvidia": ("--backend", "tensorrt", "--port", "8000"),
        "ascend": ("--backend", "acl", "--port", "8000"),
    },
)
PROFILES = {p.name: p for p in (TRAINING, INFERENCE)}


@dataclass(frozen=True)
class Check:
    """One row of the report: `key` names its evaluator in the test; `how` is formatted with
    the vendor's and profile's facts."""

    key: str
    what: str
    how: str
    kinds: tuple[str, ...] = ("training", "inference")


CHECKS = (
    Check("bound", "placed on the pinned vendor's node",
          "the pod's `spec.nodeName` from the API server is {node}"),
    Check("rebound", "image rebound at bind",
          "the pod's container `image` from the API server is {image}, not the placeholder "
          "it was created with"),
    Check("assignment", "resolved profile in the signed assignment",
          "`hcs.io/assignment` verified with {node}'s key; its `runtime.main` names "
          "{profile} and {image}"),
    Check("base", "the vendor's base image ran",
          "`cat /etc/hcs-base` in the container names {vendor} and {image}"),
    Check("code", "code layer mounted at codeMount",
          "image volume of " + CODE_IMAGE + ": `{code_mount}/hcs-code` read, `{code_mount}` "
          "read-only in /proc/1/mountinfo"),
    Check("devices", "the vendor's device nodes, no other's",
          "`stat` of {devices} (character devices); none of {other_devices}"),
    Check("hcs_env", "HCS's env", "/proc/1/environ holds {hcs_env}"),
    Check("profile_env", "the profile's env",
          "/proc/1/environ holds {profile_env}, and hcsd's HCS_CODE_DIR={code_mount}"),
    Check("library_path", "driver libraries first, the image's own kept",
          "/proc/1/environ: `LD_LIBRARY_PATH` has {driver_lib} before the image's "
          "{image_lib}"),
    Check("driver", "the driver's files from the host",
          "`cat {install_dir}/{marker}` names {node}"),
    Check("preload", "libhcs present and preloaded",
          "/etc/ld.so.preload is /usr/lib/hcs/libhcs.so; `device-alloc` reports libhcs in "
          "its /proc/self/maps"),
    Check("quota", "quota enforced through the vendor's allocation API",
          "`device-alloc` ({api}) of the pod's 16Gi: {over} MiB refused with {oom} "
          "({oom_code}), {under} MiB ok"),
    Check("workload", "the job allocates on the device",
          "train.sh's `device-alloc --hold {held}` logged `alloc {held} MiB: ok`",
          kinds=("training",)),
    Check("argv", "the pod's own entrypoint kept",
          "/proc/1/cmdline is `{argv}`", kinds=("training",)),
    Check("argv", "entrypoint swapped for the vendor",
          "/proc/1/cmdline is `{argv}` (the pod asked for `{pod_argv}`); the log says "
          "`serve: {args}`", kinds=("inference",)),
)  # fmt: skip


def facts(vendor: str, profile: Profile) -> dict[str, str]:
    """What a check's `how` names for `vendor` under `profile`."""
    node = VENDORS[vendor]
    other = next(v for k, v in VENDORS.items() if k != vendor)
    driver_lib = dict(node.env)["LD_LIBRARY_PATH"]
    return {
        "vendor": vendor,
        "node": NODE_OF[vendor],
        "image": BASE_IMAGES[vendor].name,
        "profile": profile.name,
        "code_mount": CODE_MOUNT,
        "devices": ", ".join(node.all_device_nodes()),
        "other_devices": ", ".join(other.all_device_nodes()),
        "hcs_env": ", ".join(
            f"{k}={v}"
            for k, v in (*node.env, ("HCS_CONFIG", "/run/hcs/quota.conf"))
            if k != "LD_LIBRARY_PATH"
        ),
        "profile_env": ", ".join(f"{k}={v}" for k, v in profile.env[vendor]),
        "driver_lib": driver_lib,
        "image_lib": BASE_IMAGES[vendor].library_path,
        "install_dir": node.install_dir,
        "marker": node.marker,
        "api": API[vendor],
        "over": str(OVER_MIB),
        "under": str(UNDER_MIB),
        "held": str(HELD_MIB),
        "oom": OOM_NAME[vendor],
        "oom_code": str(node.oom_code),
        "argv": " ".join(profile.argv(vendor)),
        "pod_argv": " ".join(profile.pod_command),
        "args": " ".join((profile.args or {}).get(vendor, ())),
    }


def checks_for(profile: Profile) -> list[Check]:
    return [c for c in CHECKS if profile.kind in c.kinds]


@dataclass(frozen=True)
class Result:
    """One check of one vendor under one profile: what, how, and what came of it."""

    vendor: str
    profile: str
    what: str
    how: str
    outcome: str  # PASS, or "FAIL: why" / "not run: why"

    @property
    def passed(self) -> bool:
        return self.outcome == PASS


def expected_rows() -> list[tuple[str, str, str, str]]:
    """(vendor, profile, what, how) of every row the report must hold, in its order."""
    return [
        (vendor, profile.name, check.what, check.how.format(**facts(vendor, profile)))
        for vendor in VENDORS
        for profile in PROFILES.values()
        for check in checks_for(profile)
    ]


HEADER = """# Cross-vendor compatibility report

<!-- Generated by `make compatibility-report` (tests/kubelet/test_compatibility.py with
HCS_WRITE_COMPATIBILITY set) from tests/kubelet/compatibility.py: do not edit by hand. -->

RuntimeProfiles, and how the cluster and the node apply them, are described in
[docs/runtime-profiles.md](runtime-profiles.md).

One pod spec per RuntimeProfile, the same for every vendor: a placeholder `image`, the code
image `{code}` as an image volume at `{mount}`,
`limits: {{ai.compute/vram: 16Gi}}` and the annotation `{annotation}`. It was
submitted once pinned to each vendor with `hcs.io/vendors`, on the real-kubelet test cluster
(docs/testing-kubelet.md: kubelet and kube-controller-manager 1.36, kube-scheduler with HCS's
extender, containerd 2.3 with hcsd's NRI plugin, hcs-syncer per node). Every row was checked
from inside the running container (`kubectl exec`, through the API server and the node's
kubelet) or on the pod as the API server holds it. The profiles are in
tests/kubelet/compatibility.py.

What the rows stand on: the nodes' devices are simulated (hcsd's simulated backend; device
nodes with /dev/null's numbers) and the "drivers" are the fake vendor libraries of
tests/fakes and libhcs/tests, which follow the vendors' ABIs (cuMemAlloc_v2 answers
CUDA_ERROR_OUT_OF_MEMORY, aclrtMalloc ACL_ERROR_RT_MEMORY_ALLOCATION). The base images are
stand-ins for PyTorch-CUDA and torch_npu: busybox, glibc, `/etc/hcs-base`, an
`LD_LIBRARY_PATH` of their own, and `device-alloc`, which calls the vendor's allocation API
through the library the node injects (tests/harness/kubecluster/runtime_images.py).

**Not run here:** a real CUDA program on a real NVIDIA GPU (no GPU was at hand where this
report was made), and a real CANN program on a real Ascend NPU. The NVIDIA rows show the CUDA
driver API as libhcs intercepts it in front of a fake driver, not a GPU's behaviour.

"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _summary(results: list[Result]) -> str:
    """One line per vendor and profile: how many of its checks passed."""
    lines = ["| vendor | node | profile | base image | checks passed |\n|---|---|---|---|---|\n"]
    for vendor in VENDORS:
        for profile in PROFILES.values():
            rows = [r for r in results if (r.vendor, r.profile) == (vendor, profile.name)]
            passed = sum(r.passed for r in rows)
            lines.append(
                f"| {vendor} | {NODE_OF[vendor]} | `{profile.name}` ({profile.kind}) | "
                f"`{BASE_IMAGES[vendor].name}` | {passed} of {len(rows)} |\n"
            )
    return "".join(lines) + "\n"


def render(results: list[Result]) -> str:
    """The report: a summary, then one table per vendor and profile, in the order of
    `expected_rows`."""
    out = [
        HEADER.format(code=CODE_IMAGE, mount=CODE_MOUNT, annotation=ANNOTATION_RUNTIME_PROFILE),
        _summary(results),
    ]
    for vendor, node in VENDORS.items():
        for profile in PROFILES.values():
            rows = [r for r in results if (r.vendor, r.profile) == (vendor, profile.name)]
            out.append(
                f"## {vendor} ({NODE_OF[vendor]}, simulated {node.model}): "
                f"`{profile.name}` ({profile.kind})\n\n"
                f"Base image `{BASE_IMAGES[vendor].name}`; the container runs "
                f"`{' '.join(profile.argv(vendor))}`.\n\n"
                "| what | how it was verified | result |\n|---|---|---|\n"
            )
            out.extend(f"| {_cell(r.what)} | {_cell(r.how)} | {_cell(r.outcome)} |\n" for r in rows)
            out.append("\n")
    return "".join(out).rstrip("\n") + "\n"


_SECTION = re.compile(r"## (\w+) \([^)]*\): `([a-z0-9-]+)` \(\w+\)")
_ROW = re.compile(r"\| ((?:[^|\\]|\\.)*) \| ((?:[^|\\]|\\.)*) \| ((?:[^|\\]|\\.)*) \|")


def parse(text: str) -> list[Result]:
    """The results a report holds (its rows under each vendor-and-profile heading)."""
    results: list[Result] = []
    section: tuple[str, str] | None = None
    for line in text.splitlines():
        heading = _SECTION.fullmatch(line)
        if heading:
            section = (heading[1], heading[2])
            continue
        row = _ROW.fullmatch(line)
        if row and section and row[1] != "what" and not row[1].startswith("-"):
            what, how, outcome = (cell.replace("\\|", "|") for cell in row.groups())
            results.append(Result(section[0], section[1], what, how, outcome))
    return results


def problems(text: str) -> list[str]:
    """Why a report is not a current, passing one (empty when it is)."""
    results = parse(text)
    found = []
    if render(results) != text:
        found.append("it is not what the generator writes for its own rows (edited by hand?)")
    rows = [(r.vendor, r.profile, r.what, r.how) for r in results]
    if rows != expected_rows():
        missing = [r for r in expected_rows() if r not in rows]
        extra = [r for r in rows if r not in expected_rows()]
        found.append(f"its rows are not the checks of compatibility.py: missing {missing[:3]}, "
                     f"not checked any more {extra[:3]}")  # fmt: skip
    found.extend(f"{r.vendor}/{r.profile}: {r.what}: {r.outcome}" for r in results if not r.passed)
    return found


def crd_shipped() -> bool:
    """Whether packaging/kubernetes installs the RuntimeProfile CRD (CRD_FILE, listed in its
    kustomization): from then on the report must be there and current (before it, nothing
    could be rebound and the test skips)."""
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    listed = str(CRD_FILE.relative_to(MANIFESTS))
    if listed not in kustomization["resources"] or not CRD_FILE.exists():
        return False
    return any(
        d.get("kind") == "CustomResourceDefinition" and d["metadata"]["name"] == CRD
        for d in manifests(listed)
    )


def main() -> int:
    if sys.argv[1:] != ["check"]:
        print("usage: python -m tests.kubelet.compatibility check", file=sys.stderr)
        return 2
    found = problems(DOC.read_text()) if DOC.exists() else [f"{DOC} is missing"]
    for problem in found:
        print(f"docs/compatibility.md: {problem}", file=sys.stderr)
    if found:
        print("run `make compatibility-report` on a host that runs tests/kubelet", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
