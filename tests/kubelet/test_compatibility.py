"""The cross-vendor compatibility report (issue 20): the same pod spec under a RuntimeProfile,
pinned once to each vendor, checked from inside the container; docs/compatibility.md is
written from the results (tests/kubelet/compatibility.py holds the checks and the renderer).

Per profile (a training one, an inference one with an entrypoint swap) one pod spec: a
placeholder image that no node holds, the code image as an image volume at the profile's
codeMount, `limits: {ai.compute/vram: 16Gi}`, `hcs.io/runtime-profile`. The extender must
rebind the image to the profile's base image for the vendor it chose and sign the resolved
profile into the assignment; hcsd must apply the profile's env and argv. Each check of
compatibility.CHECKS becomes one Result; the last test writes the report
(HCS_WRITE_COMPATIBILITY set, `make compatibility-report`) or fails unless the checked-in one
is exactly what it would write, and fails on any check that did not pass.

Without the RuntimeProfile CRD in packaging/kubernetes (the cluster side of issue 20) every
test here skips and says so: nothing could be rebound.
"""

from __future__ import annotations

import difflib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from hcsd.cluster.kube import KubeError
from hcsd.contract.assignment import ANNOTATION, Assignment, AssignmentError, verify
from hcsd.contract.names import ANNOTATION_RUNTIME_PROFILE, ANNOTATION_VENDORS
from tests.harness.kubecluster import hcs, pods
from tests.harness.kubecluster.cluster import KubeletCluster
from tests.harness.kubecluster.runtime_images import (
    BASE_IMAGES,
    CODE_IMAGE,
    CODE_MARKER,
    PLACEHOLDER_IMAGE,
    ensure_base_image,
    ensure_code_image,
)
from tests.harness.kubecluster.vendors import build_fakes
from tests.kubelet import compatibility as report
from tests.kubelet.compatibility import (
    CODE_MOUNT,
    DOC,
    HELD_MIB,
    OVER_MIB,
    PASS,
    PROFILES,
    UNDER_MIB,
    VENDORS,
    Profile,
    Result,
)

pytestmark = pytest.mark.slow

CRD = report.CRD
PROFILES_PATH = report.PROFILES_PATH
GiB = 2**30
START_TIMEOUT = 60.0


@dataclass
class Seen:
    """What one pod showed: as the API server holds it, and from inside its container."""

    vendor: str
    profile: Profile
    pod: dict[str, Any]
    lines: list[str] = field(default_factory=list)  # the probe's output in the container
    log: str = ""  # the container's log
    assignment: Assignment | None = None
    assignment_error: str = ""
    not_started: str = ""  # why the container never ran, when it did not

    def values(self, prefix: str) -> list[str]:
        return [line[len(prefix) :] for line in self.lines if line.startswith(prefix)]

    def environ(self) -> dict[str, str]:
        return dict(v.split("=", 1) for v in self.values("env ") if "=" in v)


Verdict = tuple[bool, str]  # passed, and what was seen when it did not


def _is(seen: object, wanted: object) -> Verdict:
    return seen == wanted, f"saw {seen!r}, wanted {wanted!r}"


def check_bound(s: Seen) -> Verdict:
    return _is(s.pod["spec"].get("nodeName"), report.NODE_OF[s.vendor])


def check_rebound(s: Seen) -> Verdict:
    return _is(s.pod["spec"]["containers"][0]["image"], BASE_IMAGES[s.vendor].name)


def check_assignment(s: Seen) -> Verdict:
    if s.assignment is None:
        return False, s.assignment_error
    runtime = s.assignment.runtime.get("main")
    if runtime is None:
        return False, f"the assignment (v3?) has no runtime for main: {s.assignment.runtime}"
    return _is((runtime.profile, runtime.image), (s.profile.name, BASE_IMAGES[s.vendor].name))


def check_base(s: Seen) -> Verdict:
    return _is(s.values("base="), [BASE_IMAGES[s.vendor].marker().strip()])


def check_code(s: Seen) -> Verdict:
    mounts = [line.split() for line in s.values("mount ")]
    read_only = [m for m in mounts if len(m) > 5 and m[4] == CODE_MOUNT and "ro" in m[5].split(",")]
    if not read_only:
        return False, f"no read-only mount at {CODE_MOUNT}: {mounts}"
    return _is(s.values("code="), [CODE_MARKER.strip()])


def check_devices(s: Seen) -> Verdict:
    node = VENDORS[s.vendor]
    wanted = [f"{n} character special file" for n in node.all_device_nodes()]
    wanted += [
        f"{n} absent"
        for other, v in VENDORS.items()
        if other != s.vendor
        for n in v.all_device_nodes()
    ]
    return _is(s.values("node "), wanted)


def check_hcs_env(s: Seen) -> Verdict:
    env = s.environ()
    wanted = {k: v for k, v in VENDORS[s.vendor].env if k != "LD_LIBRARY_PATH"}
    wanted["HCS_CONFIG"] = "/run/hcs/quota.conf"
    return _is({k: env.get(k) for k in wanted}, wanted)


def check_profile_env(s: Seen) -> Verdict:
    env = s.environ()
    wanted = {**dict(s.profile.env[s.vendor]), "HCS_CODE_DIR": CODE_MOUNT}
    return _is({k: env.get(k) for k in wanted}, wanted)


def check_library_path(s: Seen) -> Verdict:
    value = s.environ().get("LD_LIBRARY_PATH", "")
    entries = value.split(":")
    driver = dict(VENDORS[s.vendor].env)["LD_LIBRARY_PATH"]
    image = BASE_IMAGES[s.vendor].library_path
    ok = driver in entries and image in entries and entries.index(driver) < entries.index(image)
    return ok, f"LD_LIBRARY_PATH={value!r}"


def check_driver(s: Seen) -> Verdict:
    return _is(
        s.values("driver="), [VENDORS[s.vendor].marker_text(s.pod["spec"]["nodeName"]).strip()]
    )


def check_preload(s: Seen) -> Verdict:
    seen = (s.values("preload="), s.values("alloc libhcs mapped: "))
    return _is(seen, (["/usr/lib/hcs/libhcs.so"], ["yes"]))


def check_quota(s: Seen) -> Verdict:
    code = VENDORS[s.vendor].oom_code
    wanted = [f"{OVER_MIB} MiB: refused (code {code})", f"{UNDER_MIB} MiB: ok"]
    return _is(s.values("alloc alloc "), wanted)


def check_workload(s: Seen) -> Verdict:
    return _is(f"alloc {HELD_MIB} MiB: ok" in s.values("train "), True)


def check_argv(s: Seen) -> Verdict:
    argv = _is([v.rstrip() for v in s.values("cmdline=")], [" ".join(s.profile.argv(s.vendor))])
    if not argv[0] or s.profile.command is None:
        return argv
    args = " ".join((s.profile.args or {})[s.vendor])
    return _is(f"serve: {args}" in s.log.splitlines(), True)


EVALUATORS: dict[str, Callable[[Seen], Verdict]] = {
    "bound": check_bound,
    "rebound": check_rebound,
    "assignment": check_assignment,
    "base": check_base,
    "code": check_code,
    "devices": check_devices,
    "hcs_env": check_hcs_env,
    "profile_env": check_profile_env,
    "library_path": check_library_path,
    "driver": check_driver,
    "preload": check_preload,
    "quota": check_quota,
    "workload": check_workload,
    "argv": check_argv,
}
ON_THE_API_SERVER = {"bound", "rebound", "assignment"}  # checkable when the pod did not start


def probe(vendor: str) -> str:
    """What the test runs in the container: one line per fact the checks read."""
    node = VENDORS[vendor]
    every = [n for v in VENDORS.values() for n in v.all_device_nodes()]
    own = node.all_device_nodes()
    ordered = list(own) + [n for n in every if n not in own]
    return f"""
echo "base=$(cat /etc/hcs-base)"
echo "code=$(cat {CODE_MOUNT}/hcs-code)"
grep " {CODE_MOUNT} " /proc/1/mountinfo | while read -r line; do echo "mount $line"; done
for n in {" ".join(ordered)}; do
  if [ -e $n ]; then echo "node $n $(stat -c '%F' $n)"; else echo "node $n absent"; fi
done
tr '\\0' '\\n' < /proc/1/environ | while read -r line; do echo "env $line"; done
echo "cmdline=$(tr '\\0' ' ' < /proc/1/cmdline)"
echo "driver=$(cat {node.install_dir}/{node.marker})"
echo "preload=$(cat /etc/ld.so.preload)"
device-alloc {OVER_MIB} {UNDER_MIB} 2>&1 | while read -r line; do echo "alloc $line"; done
cat /tmp/train.log 2>/dev/null | while read -r line; do echo "train $line"; done
"""


def pod_manifest(
    name: str, vendor: str, profile: Profile, image: str = PLACEHOLDER_IMAGE
) -> dict[str, Any]:
    """The pod spec a user writes: only the vendor pin differs between the two pods. With
    `image` other than the placeholder, the same pod without the profile (and that image)."""
    annotations = {ANNOTATION_VENDORS: vendor}
    if image == PLACEHOLDER_IMAGE:
        annotations[ANNOTATION_RUNTIME_PROFILE] = profile.name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": pods.NAMESPACE,
            "annotations": annotations,
        },
        "spec": {
            "hostNetwork": True,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": list(profile.pod_command),
                    "resources": {"limits": {"ai.compute/vram": "16Gi"}},
                    "volumeMounts": [{"name": "code", "mountPath": CODE_MOUNT, "readOnly": True}],
                }
            ],
            "volumes": [
                {"name": "code", "image": {"reference": CODE_IMAGE, "pullPolicy": "Never"}}
            ],
        },
    }


def _has_crd(cluster: KubeletCluster) -> bool:
    try:
        cluster.kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD}")
    except KubeError as e:
        if e.not_found:
            return False
        raise
    return True


@pytest.fixture(scope="module")
def imported(kubelet_cluster: KubeletCluster) -> KubeletCluster:
    """The cluster with the base images and the code image imported on every node."""
    why = build_fakes()
    assert why is None, why
    for tarball in (*(ensure_base_image(v) for v in BASE_IMAGES), ensure_code_image()):
        kubelet_cluster.import_image(tarball)
    return kubelet_cluster


@pytest.fixture(scope="module")
def profiled(imported: KubeletCluster) -> Iterator[KubeletCluster]:
    """The cluster with the images and the test's RuntimeProfiles."""
    cluster = imported
    if not _has_crd(cluster):
        # The CRD ships in packaging/kubernetes: a cluster without it is a broken harness,
        # not a reason to report nothing.
        assert not report.crd_shipped(), f"{CRD} ships but the kubelet cluster did not install it"
        pytest.skip(
            f"SKIP the compatibility report: the CRD {CRD} is not installed from "
            "packaging/kubernetes (issue 20's cluster side: RuntimeProfile and the extender's "
            "rebinding at bind are not on this branch)"
        )
    for profile in PROFILES.values():
        _delete_profile(cluster, profile.name)
        cluster.kube.create(PROFILES_PATH, profile.manifest())
    yield cluster
    for profile in PROFILES.values():
        _delete_profile(cluster, profile.name)


def _delete_profile(cluster: KubeletCluster, name: str) -> None:
    try:
        cluster.kube.request("DELETE", f"{PROFILES_PATH}/{name}")
    except KubeError as e:
        if not e.not_found:
            raise


RESULTS: dict[tuple[str, str], list[Result]] = {}


def _waiting_reason(pod: dict[str, Any] | None) -> str:
    if pod is None:
        return "the pod is gone"
    for status in pod.get("status", {}).get("containerStatuses") or []:
        for state in ("waiting", "terminated"):
            if state in status.get("state", {}):
                detail = status["state"][state]
                return f"{state}: {detail.get('reason')}: {detail.get('message', '')}"[:300]
    scheduled = pods.condition(pod, "PodScheduled")
    return f"phase {pod.get('status', {}).get('phase')}: {scheduled.get('message', '')}"[:300]


def observe(
    cluster: KubeletCluster,
    name: str,
    vendor: str,
    profile: Profile,
    image: str = PLACEHOLDER_IMAGE,
) -> Seen:
    """Run the pod until its container runs (or START_TIMEOUT), then read everything."""
    created = cluster.kube.create(
        f"/api/v1/namespaces/{pods.NAMESPACE}/pods", pod_manifest(name, vendor, profile, image)
    )
    started = time.monotonic()
    deadline = started + START_TIMEOUT
    pod = created
    while time.monotonic() < deadline:
        pod = pods.get(cluster.kube, name) or pod
        if pod.get("status", {}).get("phase") in {"Running", "Failed", "Succeeded"}:
            break
        time.sleep(0.2)
    seen = Seen(vendor, profile, pod)
    print(f"{name}: created -> {pod.get('status', {}).get('phase')} "
          f"{time.monotonic() - started:.1f} s")  # fmt: skip
    node = pod["spec"].get("nodeName")
    text = pod["metadata"].get("annotations", {}).get(ANNOTATION)
    if text is None or node is None:
        seen.assignment_error = f"no {ANNOTATION} (node {node})"
    else:
        try:
            seen.assignment = verify(text, hcs.verifying_keys(cluster.keys, node), node=node,
                                     pod_uid=pod["metadata"]["uid"], now=time.time(),
                                     max_age=600)  # fmt: skip
        except AssignmentError as e:
            seen.assignment_error = str(e)
    if pod.get("status", {}).get("phase") != "Running":
        seen.not_started = _waiting_reason(pod)
        return seen
    if profile.kind == "training":  # the job's own allocation is logged once it holds it
        for _ in range(50):
            out = cluster.kubectl("exec", name, "--", "cat", "/tmp/train.log", check=False)
            if "holding" in out:
                break
            time.sleep(0.1)
    out = cluster.kubectl("exec", name, "--", "sh", "-c", probe(vendor), timeout=60)
    seen.lines = out.splitlines()
    seen.log = cluster.kubectl("logs", name, check=False)
    print(f"--- {name} ({vendor}, {profile.name}):\n{out}\n--- log:\n{seen.log}")
    return seen


def evaluate(seen: Seen) -> list[Result]:
    results = []
    for check in report.checks_for(seen.profile):
        how = check.how.format(**report.facts(seen.vendor, seen.profile))
        if seen.not_started and check.key not in ON_THE_API_SERVER:
            outcome = f"not run: the container did not start ({seen.not_started})"
        else:
            passed, detail = EVALUATORS[check.key](seen)
            outcome = PASS if passed else f"FAIL: {detail}"
        results.append(Result(seen.vendor, seen.profile.name, check.what, how, outcome))
    return results


@pytest.mark.parametrize("profile", list(PROFILES))
@pytest.mark.parametrize("vendor", list(VENDORS))
def test_the_same_pod_spec_runs_on_each_vendor(
    profiled: KubeletCluster, vendor: str, profile: str
) -> None:
    cluster = profiled
    name = f"compat-{profile.removeprefix('compat-')}-{vendor}"
    try:
        seen = observe(cluster, name, vendor, PROFILES[profile])
    finally:
        pods.delete(cluster.kube, name, grace=0)
    results = evaluate(seen)
    RESULTS[(vendor, profile)] = results
    failed = [f"{r.what}: {r.outcome}" for r in results if not r.passed]
    assert not failed, "\n".join(failed)


# What a pod gets that names a base image itself, without a profile: nothing of issue 20's
# rebinding, so these hold on any branch (and show that image volumes work on these nodes).
WITHOUT_A_PROFILE = ("bound", "base", "code", "devices", "hcs_env", "library_path", "driver",
                     "preload", "quota", "workload", "argv")  # fmt: skip


@pytest.mark.parametrize("vendor", list(VENDORS))
def test_the_base_image_and_the_code_volume_work_without_a_profile(
    imported: KubeletCluster, vendor: str
) -> None:
    cluster = imported
    name = f"compat-direct-{vendor}"
    try:
        seen = observe(cluster, name, vendor, report.TRAINING, BASE_IMAGES[vendor].name)
    finally:
        pods.delete(cluster.kube, name, grace=0)
    assert not seen.not_started, seen.not_started
    failed = [
        f"{key}: {verdict[1]}"
        for key in WITHOUT_A_PROFILE
        if not (verdict := EVALUATORS[key](seen))[0]
    ]
    assert not failed, "\n".join(failed)


def test_the_report_is_written_from_these_results(profiled: KubeletCluster) -> None:
    """Last in the module: every vendor-and-profile test recorded its results."""
    missing = [(v, p) for v in VENDORS for p in PROFILES if (v, p) not in RESULTS]
    assert not missing, f"no results for {missing}: their tests did not run in this session"
    results = [r for v in VENDORS for p in PROFILES for r in RESULTS[(v, p)]]
    text = report.render(results)
    if os.environ.get(report.WRITE_ENV):
        DOC.write_text(text)
        print(f"wrote {DOC}")
    current = DOC.read_text() if DOC.exists() else ""
    assert current == text, (
        f"{DOC} is not what this run found: run `make compatibility-report`\n"
        + "".join(difflib.unified_diff(current.splitlines(True), text.splitlines(True)))
    )
    assert all(r.passed for r in results)
